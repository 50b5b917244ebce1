"""The training route of the GPT-2 family: the same function, loss and gradients as Hugging Face's GPT2LMHeadModel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from finetune.models.causal_lm import NextTokenLM, build_causal_lm, decode, has_fast_route
from finetune.recipes import CausalLMModelConfig

VOCAB = 500
SPECIAL = SimpleNamespace(bos_token_id=0, eos_token_id=0, pad_token_id=0)


def causal_lm(dropout: float, seed: int = 0):
    torch.manual_seed(seed)
    config = CausalLMModelConfig(family="gpt2", layers=2, hidden=64, heads=4, intermediate=96, dropout=dropout)
    return build_causal_lm(config, VOCAB, max_positions=32, tokenizer=SPECIAL)


def next_token_batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    stream = torch.randint(1, VOCAB, (4, 25), generator=generator)
    return stream[:, :-1], stream[:, 1:]


def gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])  # GPT-2's tanh approximation, and the exact GELU
def test_decode_matches_hugging_face_without_dropout(activation):
    model = causal_lm(dropout=0.0)
    for block in model.transformer.h:
        block.mlp.act = ACT2FN[activation]
    model.config.activation_function = activation
    input_ids, _ = next_token_batch()
    model.eval()
    reference = model.transformer(input_ids=input_ids).last_hidden_state
    torch.testing.assert_close(decode(model.transformer, input_ids), reference, atol=1e-5, rtol=1e-5)


def test_decode_is_causal():
    """Changing a later token changes nothing before it."""
    model = causal_lm(dropout=0.0)
    input_ids, _ = next_token_batch()
    changed = input_ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % VOCAB
    before, after = decode(model.transformer, input_ids), decode(model.transformer, changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_training_loss_and_gradients_match_hugging_face():
    """Dropout 0: the training route (decode + fused decoder loss) equals GPT2LMHeadModel's dense loss."""
    model = causal_lm(dropout=0.0)
    input_ids, labels = next_token_batch(seed=1)
    model.eval()
    logits = model(input_ids=input_ids).logits
    dense = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
    dense.backward()
    dense_grads = gradients(model)
    model.train()
    assert has_fast_route(model)
    loss, count, correct = NextTokenLM(model)(input_ids, labels)
    loss.backward()
    ours = gradients(model)
    assert loss.item() == pytest.approx(dense.item(), abs=1e-5)
    assert count.item() == labels.numel() and correct is None
    assert set(ours) == set(dense_grads)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(ours[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_training_route_applies_dropout_given_the_seed():
    model = causal_lm(dropout=0.3)
    model.train()
    input_ids, labels = next_token_batch(seed=2)
    losses = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        losses.append(NextTokenLM(model)(input_ids, labels)[0].item())
    model.eval()
    without_dropout = NextTokenLM(model)(input_ids, labels)[0].item()
    assert losses[0] == losses[1] != losses[2]
    assert without_dropout not in losses


@pytest.mark.parametrize(
    "change",
    [
        {"reorder_and_upcast_attn": True},
        {"scale_attn_by_inverse_layer_idx": True},
        {"activation_function": "relu"},
        {"dtype": torch.bfloat16},
    ],
)
def test_other_variants_take_hugging_faces_forward(change):
    model = causal_lm(dropout=0.0)
    if "dtype" in change:
        model = model.to(change["dtype"])
    else:
        setattr(model.config, *next(iter(change.items())))
    assert not has_fast_route(model)
