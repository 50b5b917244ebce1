"""Layer groups, discriminative learning rates, optimizer groups and gradual unfreezing."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    T5Config,
    T5Model,
)

from finetune.errors import UserError
from finetune.models.backbones import layer_groups
from finetune.training.optim import build_optimizer, discriminative_lrs, set_learning_rates
from finetune.training.unfreezing import freeze_below, trainable_group_count


def tiny_bert_config(**overrides) -> BertConfig:
    settings = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    settings.update(overrides)
    return BertConfig(**settings)


@pytest.fixture
def classifier() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_bert_config())


def _ids(parameters):
    return {id(parameter) for parameter in parameters}


# ---------------------------------------------------------------------------------------------
# Discriminative learning rates
# ---------------------------------------------------------------------------------------------


def test_discriminative_lrs():
    assert discriminative_lrs(4, 1e-3, 2.6) == pytest.approx([1e-3 / 2.6**3, 1e-3 / 2.6**2, 1e-3 / 2.6, 1e-3])


def test_discriminative_lrs_factor_one_is_uniform():
    assert discriminative_lrs(5, 2e-5, 1.0) == [2e-5] * 5


def test_discriminative_lrs_single_group():
    assert discriminative_lrs(1, 0.1, 2.6) == [0.1]


# ---------------------------------------------------------------------------------------------
# Layer groups
# ---------------------------------------------------------------------------------------------


def test_layer_groups_of_a_bert_classifier(classifier):
    groups = layer_groups(classifier)
    assert len(groups) == 1 + 2 + 1  # embeddings, one per block, head
    assert _ids(groups[0]) == _ids(classifier.bert.embeddings.parameters())
    for index, block in enumerate(classifier.bert.encoder.layer):
        assert _ids(groups[1 + index]) == _ids(block.parameters())
    head = list(classifier.bert.pooler.parameters()) + list(classifier.classifier.parameters())
    assert _ids(groups[-1]) == _ids(head)
    flat = [id(parameter) for group in groups for parameter in group]
    assert len(flat) == len(set(flat)) == len(list(classifier.parameters()))
    assert set(flat) == _ids(classifier.parameters())


def test_layer_groups_follow_the_depth():
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_bert_config(num_hidden_layers=5))
    assert len(layer_groups(model)) == 7


def test_layer_groups_of_a_masked_lm_with_tied_weights():
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_bert_config())
    groups = layer_groups(model)
    assert len(groups) == 4
    flat = [id(parameter) for group in groups for parameter in group]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))
    # The decoder is tied to the word embeddings, so it belongs to the embedding group.
    assert id(model.cls.predictions.decoder.weight) in _ids(groups[0])


def test_layer_groups_of_a_gpt2_language_model():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    groups = layer_groups(model)
    assert len(groups) == 4  # embeddings, 2 blocks, head (final norm; the output layer is tied to wte)
    assert _ids(groups[0]) == _ids(list(model.transformer.wte.parameters()) + list(model.transformer.wpe.parameters()))
    assert _ids(groups[-1]) == _ids(list(model.transformer.ln_f.parameters()))
    assert id(model.lm_head.weight) in _ids(groups[0])


def test_unsupported_family_names_it():
    model = T5Model(T5Config(vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2))
    with pytest.raises(UserError) as info:
        layer_groups(model)
    assert "'t5'" in str(info.value) and "gpt2" in str(info.value) and "encoder-decoder" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Optimizer groups
# ---------------------------------------------------------------------------------------------


def test_build_optimizer_groups(classifier):
    groups = layer_groups(classifier)
    lrs = discriminative_lrs(len(groups), 1e-3, 2.6)
    optimizer = build_optimizer(classifier, groups, lrs, weight_decay=0.01, betas=(0.8, 0.9))
    names = {id(parameter): name for name, parameter in classifier.named_parameters()}
    seen = []
    for group in optimizer.param_groups:
        layer = group["layer_group"]
        assert group["lr"] == group["peak_lr"] == pytest.approx(lrs[layer])
        assert group["betas"] == (0.8, 0.9)
        assert _ids(group["params"]) <= _ids(groups[layer])
        for parameter in group["params"]:
            name = names[id(parameter)]
            no_decay = name.endswith("bias") or "LayerNorm" in name
            assert group["weight_decay"] == (0.0 if no_decay else 0.01), name
        seen += [id(parameter) for parameter in group["params"]]
    assert sorted(seen) == sorted(_ids(classifier.parameters())) and len(seen) == len(set(seen))
    assert {group["layer_group"] for group in optimizer.param_groups} == set(range(len(groups)))
    # Each layer group has a decayed and a non-decayed part (weights; biases and LayerNorm).
    for layer in range(len(groups)):
        decays = sorted(g["weight_decay"] for g in optimizer.param_groups if g["layer_group"] == layer)
        assert decays == [0.0, 0.01]


def test_layer_norm_weights_are_not_decayed(classifier):
    groups = layer_groups(classifier)
    optimizer = build_optimizer(classifier, groups, [1e-3] * len(groups), weight_decay=0.1)
    layer_norm_weight = classifier.bert.encoder.layer[0].attention.output.LayerNorm.weight
    dense_weight = classifier.bert.encoder.layer[0].attention.output.dense.weight
    dense_bias = classifier.bert.encoder.layer[0].attention.output.dense.bias
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay_of[id(layer_norm_weight)] == 0.0
    assert decay_of[id(dense_bias)] == 0.0
    assert decay_of[id(dense_weight)] == 0.1


def test_set_learning_rates_scales_peaks(classifier):
    groups = layer_groups(classifier)
    lrs = discriminative_lrs(len(groups), 1e-3, 2.6)
    optimizer = build_optimizer(classifier, groups, lrs, weight_decay=0.01)
    reported = set_learning_rates(optimizer, 0.5)
    assert reported == pytest.approx({f"group_{index}": lr * 0.5 for index, lr in enumerate(lrs)})
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(group["peak_lr"] * 0.5)
    # The multiplier applies to the peak, not to the previous value.
    set_learning_rates(optimizer, 0.5)
    reported = set_learning_rates(optimizer, 1.0)
    assert reported == pytest.approx({f"group_{index}": lr for index, lr in enumerate(lrs)})


# ---------------------------------------------------------------------------------------------
# Gradual unfreezing
# ---------------------------------------------------------------------------------------------


def test_trainable_group_count_gradual():
    counts = [trainable_group_count(epoch, 4, "gradual") for epoch in range(6)]
    assert counts == [1, 2, 3, 4, 4, 4]
    counts = [trainable_group_count(epoch, 7, "gradual", initial_groups=2, groups_per_epoch=2) for epoch in range(5)]
    assert counts == [2, 4, 6, 7, 7]


def test_trainable_group_count_none():
    assert [trainable_group_count(epoch, 4, "none") for epoch in range(3)] == [4, 4, 4]


@pytest.mark.parametrize("trainable", [0, 1, 2, 3, 4])
def test_freeze_below(classifier, trainable):
    groups = layer_groups(classifier)
    freeze_below(groups, trainable)
    for index, group in enumerate(groups):
        expected = index >= len(groups) - trainable
        assert all(parameter.requires_grad == expected for parameter in group), f"group {index}"


def test_freeze_below_drops_stale_grads(classifier):
    groups = layer_groups(classifier)
    for parameter in classifier.parameters():
        parameter.grad = torch.ones_like(parameter)
    freeze_below(groups, 1)
    assert all(parameter.grad is None for group in groups[:-1] for parameter in group)
    assert all(parameter.grad is not None for parameter in groups[-1])


def test_freeze_then_thaw_everything(classifier):
    groups = layer_groups(classifier)
    freeze_below(groups, 1)
    freeze_below(groups, len(groups))
    assert all(parameter.requires_grad for parameter in classifier.parameters())


def _backward(model):
    torch.manual_seed(1)
    input_ids = torch.randint(5, 64, (3, 10))
    labels = torch.tensor([0, 1, 1])
    block_outputs = []
    hooks = [
        block.register_forward_hook(
            lambda module, inputs, output: block_outputs.append(
                (output[0] if isinstance(output, tuple) else output).requires_grad
            )
        )
        for block in model.bert.encoder.layer
    ]
    embedding_output = []
    hooks.append(
        model.bert.embeddings.register_forward_hook(
            lambda module, inputs, output: embedding_output.append(output.requires_grad)
        )
    )
    model.train()
    model(input_ids=input_ids, labels=labels).loss.backward()
    for hook in hooks:
        hook.remove()
    return embedding_output[0], block_outputs


def test_head_only_training_runs_no_backward_below(classifier):
    groups = layer_groups(classifier)
    freeze_below(groups, 1)
    embeddings_need_grad, blocks_need_grad = _backward(classifier)
    # No activation below the head is part of the autograd graph: nothing below it is backpropagated.
    assert embeddings_need_grad is False and blocks_need_grad == [False, False]
    assert all(parameter.grad is None for group in groups[:-1] for parameter in group)
    assert all(
        parameter.grad is not None and parameter.grad.abs().sum() > 0
        for parameter in classifier.classifier.parameters()
    )


def test_two_groups_trainable(classifier):
    groups = layer_groups(classifier)
    freeze_below(groups, 2)
    embeddings_need_grad, blocks_need_grad = _backward(classifier)
    assert embeddings_need_grad is False and blocks_need_grad == [False, True]
    top_block = list(classifier.bert.encoder.layer[-1].parameters())
    assert all(parameter.grad is not None for parameter in top_block)
    assert any(parameter.grad.abs().sum() > 0 for parameter in top_block)
    assert all(parameter.grad is None for parameter in classifier.bert.embeddings.parameters())
    assert all(parameter.grad is None for parameter in classifier.bert.encoder.layer[0].parameters())


def test_optimizer_leaves_frozen_groups_untouched(classifier):
    groups = layer_groups(classifier)
    optimizer = build_optimizer(classifier, groups, discriminative_lrs(len(groups), 1e-2, 2.6), 0.01)
    freeze_below(groups, 1)
    before = [parameter.detach().clone() for parameter in groups[0] + groups[1] + groups[2]]
    head_before = [parameter.detach().clone() for parameter in groups[-1]]
    _backward(classifier)
    optimizer.step()
    after = groups[0] + groups[1] + groups[2]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "a frozen parameter changed (weight decay?)"
    assert any(not torch.equal(a, b) for a, b in zip(head_before, groups[-1]))
