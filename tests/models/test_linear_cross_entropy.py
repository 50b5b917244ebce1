"""The fused decoder + cross-entropy: the same loss, gradients and counts as the two plain operations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import finetune.models.linear_cross_entropy as module
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.causal_lm import NextTokenLM, RecurrentNextTokenLM
from finetune.models.linear_cross_entropy import linear_cross_entropy
from finetune.tasks.specs import IGNORE_INDEX

VOCAB = 2500  # > VOCAB_SLICE: the forward product runs over three vocabulary slices


def problem(seed: int, rows: int = 37, features: int = 16, bias: bool = True, ignored: float = 0.3):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, features, generator=generator, requires_grad=True)
    weight = (torch.randn(VOCAB, features, generator=generator) * 0.5).requires_grad_()
    offset = (torch.randn(VOCAB, generator=generator) * 0.1).requires_grad_() if bias else None
    labels = torch.randint(0, VOCAB, (rows,), generator=generator)
    labels[torch.rand(rows, generator=generator) < ignored] = IGNORE_INDEX
    return hidden, weight, offset, labels


def reference(hidden, weight, bias, labels):
    logits = F.linear(hidden, weight, bias)
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
    correct = ((logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()
    return loss, correct


def gradients_of(loss, tensors):
    return torch.autograd.grad(loss, [tensor for tensor in tensors if tensor is not None])


@pytest.mark.parametrize("chunk_bytes", [module.CHUNK_BYTES, 4 * VOCAB * 5])  # one chunk; chunks of 5 rows (8 of them)
@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_gradients_match_linear_then_cross_entropy(monkeypatch, chunk_bytes, bias):
    monkeypatch.setattr(module, "CHUNK_BYTES", chunk_bytes)
    hidden, weight, offset, labels = problem(seed=1, bias=bias)
    expected_loss, _ = reference(hidden, weight, offset, labels)
    expected = gradients_of(expected_loss * 3.0, (hidden, weight, offset))
    loss, count, correct = linear_cross_entropy(hidden, weight, offset, labels)
    ours = gradients_of(loss * 3.0, (hidden, weight, offset))  # a scaled loss, as gradient accumulation does
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
    assert count.item() == (labels != IGNORE_INDEX).sum().item() and correct is None
    for mine, theirs in zip(ours, expected):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-4)
    assert ours[0][labels == IGNORE_INDEX].abs().max() == 0  # ignored rows get no gradient


def test_counts_correct_predictions_with_and_without_gradients(monkeypatch):
    monkeypatch.setattr(module, "CHUNK_BYTES", 4 * VOCAB * 4)
    hidden, weight, offset, labels = problem(seed=2)
    hidden.data[:, 0] *= 50  # make some predictions right: scale a feature the weight reads strongly
    expected_loss, expected_correct = reference(hidden, weight, offset, labels)
    with torch.no_grad():
        loss, _count, correct = linear_cross_entropy(hidden, weight, offset, labels, count_correct=True)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
    assert correct.item() == expected_correct.item()
    loss, _, correct = linear_cross_entropy(hidden, weight, offset, labels, count_correct=True)
    assert loss.requires_grad and correct.item() == expected_correct.item()


def test_no_labelled_row_gives_a_zero_loss_with_zero_gradients():
    hidden, weight, offset, labels = problem(seed=3, ignored=1.0)
    loss, count, _ = linear_cross_entropy(hidden, weight, offset, labels)
    loss.backward()
    assert loss.item() == 0.0 and count.item() == 0
    assert hidden.grad.abs().max() == 0 and weight.grad.abs().max() == 0


def test_bfloat16_takes_the_plain_route_and_agrees():
    hidden, weight, offset, labels = problem(seed=4)
    expected_loss, _ = reference(hidden, weight, offset, labels)
    loss, _, _ = linear_cross_entropy(hidden.bfloat16(), weight.bfloat16(), offset.bfloat16(), labels)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected_loss.item(), rel=2e-2)


def test_a_second_backward_is_refused():
    hidden, weight, offset, labels = problem(seed=5)
    loss, _, _ = linear_cross_entropy(hidden, weight, offset, labels)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # the stored gradients were scaled
        loss.backward()


def test_awd_lstm_training_loss_and_gradients_match_its_logits():
    """The fused route of the AWD-LSTM LM (dropouts off) equals the cross-entropy of the model's own logits."""
    torch.manual_seed(0)
    config = AWDLSTMConfig(
        vocab_size=300,
        embedding_size=16,
        hidden_size=24,
        num_layers=2,
        output_dropout=0.0,
        hidden_dropout=0.0,
        input_dropout=0.0,
        embedding_dropout=0.0,
        weight_dropout=0.0,
    )
    model = AWDLSTMForCausalLM(config)
    tokens = torch.randint(2, 300, (3, 11))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs).logits
    expected = F.cross_entropy(logits.reshape(-1, 300), labels.reshape(-1))
    expected.backward()
    expected_gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    loss, count, _ = RecurrentNextTokenLM(model).train()(inputs, labels)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5) and count.item() == labels.numel()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, expected_gradients[name], atol=1e-6, rtol=1e-4, msg=name)


def test_gpt2_evaluation_counts_match_its_logits():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=400, n_positions=16, n_embd=32, n_layer=1, n_head=2)).eval()
    tokens = torch.randint(0, 400, (2, 13))
    inputs, labels = tokens[:, :-1], tokens[:, 1:].clone()
    labels[0, :3] = IGNORE_INDEX
    with torch.no_grad():
        logits = model(inputs).logits
        loss, count, correct = NextTokenLM(model).eval()(inputs, labels)
    expected = F.cross_entropy(logits.reshape(-1, 400), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    expected_correct = ((logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert count.item() == 2 * 12 - 3 and correct.item() == expected_correct.item()
