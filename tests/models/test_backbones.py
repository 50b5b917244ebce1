"""Layer groups of every supported Hugging Face family, and the classifier training with only the top groups."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

from finetune.errors import UserError
from finetune.models.backbones import layer_groups
from finetune.training.unfreezing import freeze_below

# Hidden 32, 2 layers, 2 heads, vocabulary 64: every family's tiny size, in the names most configs accept.
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    num_labels=2,
)


@dataclass(frozen=True)
class Family:
    """A tiny config and where its parameters must land, as parameter-name prefixes inside the base model."""

    model_type: str
    settings: dict
    bottom: tuple[str, ...]  # prefixes of group 0: every embedding table and the layers that only reshape it
    positions: tuple[str, ...]  # position parameters that must sit in group 0 (none for rotary ModernBERT)
    blocks: str  # prefix of the block list: block i is `{blocks}.{i}.`
    with_first_block: tuple[str, ...] = ()  # prefixes that run between block 0 and block 1
    block_count: int = 2  # groups between the embeddings and the head

    def config(self):
        """The tiny config of this family."""
        return AutoConfig.for_model(self.model_type, **self.settings)


FAMILIES = [
    Family(
        "xlm-roberta",
        dict(TINY, type_vocab_size=1, pad_token_id=1),
        ("embeddings.",),
        ("embeddings.position_embeddings.weight",),
        "encoder.layer",
    ),
    # A smaller embedding than hidden size gives ELECTRA its projection, which belongs to the embeddings.
    Family(
        "electra",
        dict(TINY, embedding_size=16),
        ("embeddings.", "embeddings_project."),
        ("embeddings.position_embeddings.weight",),
        "encoder.layer",
    ),
    Family(
        "distilbert",
        dict(
            vocab_size=64,
            dim=32,
            n_layers=2,
            n_heads=2,
            hidden_dim=64,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            num_labels=2,
        ),
        ("embeddings.",),
        ("embeddings.position_embeddings.weight",),
        "transformer.layer",
    ),
    # DeBERTa-v3's layout: relative positions only, normalised by the encoder-level LayerNorm, and a conv after block 0.
    Family(
        "deberta-v2",
        dict(
            TINY,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            norm_rel_ebd="layer_norm",
            position_buckets=16,
            conv_kernel_size=3,
            type_vocab_size=0,
        ),
        ("embeddings.", "encoder.rel_embeddings.", "encoder.LayerNorm."),
        ("encoder.rel_embeddings.weight",),
        "encoder.layer",
        with_first_block=("encoder.conv.",),
    ),
    Family(
        "deberta",
        dict(TINY, relative_attention=True, pos_att_type=["p2c", "c2p"]),
        ("embeddings.", "encoder.rel_embeddings."),
        ("embeddings.position_embeddings.weight", "encoder.rel_embeddings.weight"),
        "encoder.layer",
    ),
    Family(
        "modernbert",
        dict(
            TINY,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            attention_dropout=0.0,
            mlp_dropout=0.0,
            embedding_dropout=0.0,
        ),
        ("embeddings.",),
        (),
        "layers",
    ),
    # ALBERT's layers share one set of weights: one group for the shared block, whatever the depth.
    Family(
        "albert",
        dict(TINY, embedding_size=16, num_hidden_groups=1),
        ("embeddings.", "encoder.embedding_hidden_mapping_in."),
        ("embeddings.position_embeddings.weight",),
        "encoder.albert_layer_groups",
        block_count=1,
    ),
]
BY_NAME = {family.model_type: family for family in FAMILIES}


def _ids(parameters) -> set[int]:
    return {id(parameter) for parameter in parameters}


def _build(family: Family, auto_class):
    torch.manual_seed(0)
    return auto_class.from_config(family.config())


def _expected_groups(family: Family, model) -> list[set[int]]:
    """Where each parameter belongs, read from its name; whatever no prefix claims is the head."""
    expected = [set() for _ in range(family.block_count + 2)]
    for name, parameter in model.base_model.named_parameters():
        if name.startswith(family.bottom):
            index = 0
        elif name.startswith(family.with_first_block):
            index = 1
        elif name.startswith(family.blocks + "."):
            index = 1 + int(name.removeprefix(family.blocks + ".").split(".")[0])
        else:
            index = -1
        expected[index].add(id(parameter))
    above_backbone = _ids(model.parameters()) - _ids(model.base_model.parameters())
    expected[-1] |= above_backbone
    return expected


@pytest.mark.parametrize("auto_class", [AutoModelForSequenceClassification, AutoModel], ids=["classifier", "base"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.model_type)
def test_layer_groups(family, auto_class):
    model = _build(family, auto_class)
    groups = layer_groups(model)
    assert len(groups) == family.block_count + 2  # embeddings, one per block, head
    assert [_ids(group) for group in groups] == _expected_groups(family, model)
    names = {id(parameter): name for name, parameter in model.base_model.named_parameters()}
    bottom_names = {names[id(parameter)] for parameter in groups[0]}
    assert id(model.get_input_embeddings().weight) in _ids(groups[0])
    assert set(family.positions) <= bottom_names
    if auto_class is AutoModelForSequenceClassification:
        assert _ids(model.classifier.parameters()) <= _ids(groups[-1])
    flat = [id(parameter) for group in groups for parameter in group]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))


def test_electra_without_projection_keeps_the_same_groups():
    family = replace(BY_NAME["electra"], settings=dict(TINY, embedding_size=32))
    model = _build(family, AutoModelForSequenceClassification)
    assert not hasattr(model.electra, "embeddings_project")
    groups = layer_groups(model)
    assert len(groups) == 4 and [_ids(group) for group in groups] == _expected_groups(family, model)


def test_albert_with_unshared_layers_has_a_group_per_layer():
    family = replace(BY_NAME["albert"], settings=dict(TINY, embedding_size=16, num_hidden_groups=2), block_count=2)
    model = _build(family, AutoModelForSequenceClassification)
    groups = layer_groups(model)
    assert len(groups) == 4 and [_ids(group) for group in groups] == _expected_groups(family, model)


@pytest.mark.parametrize(
    "model_type, settings",
    [
        ("t5", dict(vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)),
        (
            "bart",
            dict(
                vocab_size=64,
                d_model=32,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=32,
            ),
        ),
    ],
)
def test_an_encoder_decoder_is_refused_naming_what_fine_tunes_instead(model_type, settings):
    model = AutoModel.from_config(AutoConfig.for_model(model_type, **settings))
    with pytest.raises(UserError) as info:
        layer_groups(model)
    message = str(info.value)
    assert f"'{model_type}'" in message and "encoder-decoder" in message and "llama" in message
    assert "finetune/models" not in message and "\n" not in message  # no instruction to edit the package


def _record_block_calls(model, family: Family) -> tuple[list[tuple[int, bool, bool]], list]:
    """Hooks that record, per block call: its index, whether any input needs grad, whether its output does."""
    calls = []

    def needs_grad(values) -> bool:
        return any(isinstance(value, torch.Tensor) and value.requires_grad for value in values)

    def hook(index):
        def record(module, args, kwargs, output):
            output = output[0] if isinstance(output, tuple) else output
            calls.append((index, needs_grad(list(args) + list(kwargs.values())), output.requires_grad))

        return record

    blocks = model.base_model.get_submodule(family.blocks)
    hooks = [block.register_forward_hook(hook(index), with_kwargs=True) for index, block in enumerate(blocks)]
    return calls, hooks


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.model_type)
def test_classifier_trains_with_the_top_two_groups(family):
    model = _build(family, AutoModelForSequenceClassification)
    groups = layer_groups(model)
    freeze_below(groups, 2)  # the head and the top block
    calls, hooks = _record_block_calls(model, family)
    torch.manual_seed(1)
    input_ids = torch.randint(5, 64, (3, 10))
    model.train()
    loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=torch.tensor([0, 1, 1])).loss
    loss.backward()
    for hook in hooks:
        hook.remove()

    top = family.block_count - 1
    # Nothing below the top block is in the autograd graph: no backward runs there.
    assert all(not inputs and not output for index, inputs, output in calls if index < top)
    first_top_call = next(call for call in calls if call[0] == top)
    assert first_top_call[1] is False and all(output for index, _, output in calls if index == top)
    assert all(parameter.grad is None for group in groups[:-2] for parameter in group)
    assert all(parameter.grad is not None for group in groups[-2:] for parameter in group)
    assert any(parameter.grad.abs().sum() > 0 for parameter in groups[-2])
    assert all(parameter.grad.abs().sum() > 0 for parameter in model.classifier.parameters())


def test_fitted_max_length_leaves_out_robertas_offset_positions():
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from finetune.models.heads import fitted_max_length

    model = RobertaForSequenceClassification(
        RobertaConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
            pad_token_id=1,
        )
    ).eval()
    assert fitted_max_length(128, model) == 62 and fitted_max_length(40, model) == 40
    model(input_ids=torch.full((1, 62), 5))  # the longest input that fits runs
