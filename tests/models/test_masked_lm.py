"""The training route of the masked LM: the same loss and gradients as Hugging Face's BertForMaskedLM."""

from __future__ import annotations

import pytest
import torch

import finetune.models.linear_cross_entropy as linear_cross_entropy_module
from finetune.models.cpu_dropout import CpuDropout
from finetune.models.masked_lm import SparseMaskedLM, build_masked_lm, encode
from finetune.recipes import MaskedLMModelConfig
from finetune.tasks.specs import IGNORE_INDEX

VOCAB = 3000  # > VOCAB_SLICE: the decoder's forward product runs over several vocabulary slices


def masked_lm(dropout: float, seed: int = 0):
    torch.manual_seed(seed)
    return build_masked_lm(
        MaskedLMModelConfig(layers=2, hidden=64, heads=4, intermediate=128, dropout=dropout),
        VOCAB,
        max_positions=32,
        pad_token_id=0,
    )


def masked_batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, VOCAB, (4, 24), generator=generator)
    labels = torch.where(torch.rand((4, 24), generator=generator) < 0.3, input_ids, IGNORE_INDEX)
    return input_ids, labels


def gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_encode_matches_hugging_face_without_dropout():
    model = masked_lm(dropout=0.1)
    input_ids, _ = masked_batch()
    model.eval()
    reference = model.bert(input_ids=input_ids).last_hidden_state
    ours = encode(model.bert, input_ids, hidden_dropout=0.0, attention_dropout=0.0)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "chunk_bytes", [linear_cross_entropy_module.CHUNK_BYTES, 4 * VOCAB * 7]
)  # one chunk; chunks of 7 rows
def test_training_loss_and_gradients_match_dense_hugging_face(monkeypatch, chunk_bytes):
    """Dropout 0: the training route (encode + chunked decoder loss) equals BertForMaskedLM's dense loss."""
    monkeypatch.setattr(linear_cross_entropy_module, "CHUNK_BYTES", chunk_bytes)
    model = masked_lm(dropout=0.0)
    input_ids, labels = masked_batch(seed=1)
    model.eval()
    dense = model(input_ids=input_ids, labels=labels).loss
    dense.backward()
    dense_grads = gradients(model)
    model.train()
    loss, count, correct = SparseMaskedLM(model)(input_ids, labels)
    (loss * 3.0).backward()  # a scaled loss, as the training loop's summed-loss backward does
    ours = gradients(model)
    assert loss.item() == pytest.approx(dense.item(), abs=1e-5)
    assert count.item() == (labels != IGNORE_INDEX).sum().item() and correct is None
    assert set(ours) == set(dense_grads)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(ours[name], 3.0 * grad, atol=1e-5, rtol=1e-4, msg=name)


def test_training_route_is_deterministic_given_the_seed():
    model = masked_lm(dropout=0.1)
    model.train()
    input_ids, labels = masked_batch(seed=2)
    torch.manual_seed(7)
    first = SparseMaskedLM(model)(input_ids, labels)[0]
    torch.manual_seed(7)
    second = SparseMaskedLM(model)(input_ids, labels)[0]
    torch.manual_seed(8)
    third = SparseMaskedLM(model)(input_ids, labels)[0]
    assert first.item() == second.item() != third.item()


def test_cpu_dropout_keeps_one_minus_p_and_scales():
    torch.manual_seed(0)
    inputs = torch.ones(1_000_003, requires_grad=True)  # not a multiple of 4: the last int64 draw is partly used
    outputs = CpuDropout.apply(inputs, 0.1)
    kept = outputs != 0
    assert kept.float().mean().item() == pytest.approx(0.9, abs=0.002)
    # The four 16-bit lanes of one draw are independent: neighbours are both kept 0.9^2 of the time.
    pairs = kept[:1_000_000].view(-1, 4)
    for left, right in ((0, 1), (1, 2), (2, 3), (3, 0)):
        assert (pairs[:, left] & pairs[:, right]).float().mean().item() == pytest.approx(0.81, abs=0.003)
    torch.testing.assert_close(outputs[kept].detach(), torch.full((int(kept.sum()),), 1 / 0.9))
    outputs.sum().backward()  # the gradient flows through the same mask, with the same scale
    torch.testing.assert_close(inputs.grad, outputs.detach())


def test_padding_and_evaluation_take_hugging_face_route():
    model = masked_lm(dropout=0.0)
    input_ids, labels = masked_batch(seed=3)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 18:] = 0
    model.eval()
    dense = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    model.train()
    loss, _, _ = SparseMaskedLM(model)(input_ids, labels, attention_mask)
    assert loss.item() == pytest.approx(dense.item(), abs=1e-5)
