"""The n-gram baseline: modified Kneser-Ney against hand computations, and its Hugging Face checkpoint."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from finetune.models.ngram import (FALLBACK_DISCOUNTS, NGramForCausalLM, estimate_kneser_ney,
                                   modified_kneser_ney_discounts)


def probabilities_after(model: NGramForCausalLM, context: list[int]) -> list[float]:
    """p(w | context) for every w of the vocabulary, each read as a target (not from the dense distribution)."""
    rows = torch.tensor([context + [word] for word in range(model.config.vocab_size)])
    return model.target_log_probabilities(rows)[:, -1].exp().tolist()


# ---------------------------------------------------------------------------------------------
# Modified Kneser-Ney, by hand
# ---------------------------------------------------------------------------------------------


def test_discounts_are_chen_and_goodmans_closed_form():
    # Count-of-counts n1..n4 = 4, 2, 1, 1 (the 5 counts no discount reads).
    counts = np.array([1, 1, 1, 1, 2, 2, 3, 4, 5])
    # Y = n1 / (n1 + 2 n2) = 4 / 8 = 1/2
    # D1 = 1 - 2 Y n2 / n1 = 1 - 2 * 1/2 * 2/4 = 1/2
    # D2 = 2 - 3 Y n3 / n2 = 2 - 3 * 1/2 * 1/2 = 5/4
    # D3+ = 3 - 4 Y n4 / n3 = 3 - 4 * 1/2 * 1/1 = 1
    assert modified_kneser_ney_discounts(counts) == pytest.approx((0.5, 1.25, 1.0))
    # No count of 3 (n3 = 0): the closed form divides by zero, so KenLM's fallback.
    assert modified_kneser_ney_discounts(np.array([1, 1, 2, 4])) == FALLBACK_DISCOUNTS
    # n1..n4 = 1, 1, 4, 1: D2 = 2 - 3 * 1/3 * 4/1 = -2 leaves (0, 2]: the fallback too.
    assert modified_kneser_ney_discounts(np.array([1, 2, 3, 3, 3, 3, 4])) == FALLBACK_DISCOUNTS


def test_trigram_probabilities_match_a_hand_computation():
    """Corpus 0 1 0 1 0 2, vocabulary {0, 1, 2, 3} (3 never occurs), order 3. Every order's count-of-counts lacks
    n2 or n3, so every order uses the fallback discounts D1 = 1/2, D2 = 1, D3+ = 3/2.

    Unigrams, continuation counts N1+(. w) from the bigram types 01, 10, 02: 0: 1, 1: 1, 2: 1 (total 3).
      p1(w) = (1 - 1/2)/3 + gamma1/4 with gamma1 = 3 * (1/2) / 3 = 1/2: p1(0..2) = 1/6 + 1/8 = 7/24, p1(3) = 1/8.
    Bigrams, continuation counts from the trigram types 010, 101, 102: 01: 1 (from 1), 10: 1 (from 0), 02: 1 (from 1).
      context 0: 01 and 02, total 2, gamma2(0) = (1/2 + 1/2)/2 = 1/2; alpha(1|0) = alpha(2|0) = (1 - 1/2)/2 = 1/4.
      p2(.|0) = (0 + 7/48, 1/4 + 7/48, 1/4 + 7/48, 0 + 1/16) = (7, 19, 19, 3) / 48.
      context 1: 10 only, total 1, gamma2(1) = 1/2: p2(.|1) = (1/2 + 7/48, 7/48, 7/48, 1/16) = (31, 7, 7, 3) / 48.
    Trigrams, raw counts: 010: 2, 101: 1, 102: 1.
      context 1 0: 101 and 102, total 2, gamma3 = (1/2 + 1/2)/2 = 1/2; alpha(1|1 0) = alpha(2|1 0) = 1/4.
      p3(.|1 0) = (1/2 * 7/48, 1/4 + 19/96, 1/4 + 19/96, 1/2 * 3/48) = (7, 43, 43, 3) / 96.
      context 0 1: 010 only (count 2: D2 = 1), total 2, alpha(0|0 1) = 1/2, gamma3 = 1/2 over p2(.|1).
      p3(.|0 1) = (1/2 + 31/96, 7/96, 7/96, 3/96) = (79, 7, 7, 3) / 96.
    A context never seen passes the order below through: p(.|2 3) = p2(.|3) = p1; p(.|3 0) = p2(.|0).
    """
    model = NGramForCausalLM.from_tables(estimate_kneser_ney(np.array([0, 1, 0, 1, 0, 2]), 4, 3), 4, 6)
    assert model.config.discounts == [list(FALLBACK_DISCOUNTS)] * 3
    expected = {
        (1, 0): [Fraction(n, 96) for n in (7, 43, 43, 3)],
        (0, 1): [Fraction(n, 96) for n in (79, 7, 7, 3)],
        (2, 3): [Fraction(n, 24) for n in (7, 7, 7, 3)],
        (3, 0): [Fraction(n, 48) for n in (7, 19, 19, 3)],
        (0,): [Fraction(n, 48) for n in (7, 19, 19, 3)],  # the start of a row: only one token of context
    }
    for context, probabilities in expected.items():
        assert probabilities_after(model, list(context)) == pytest.approx([float(p) for p in probabilities]), context
    # The dense distribution (forward's logits) says the same.
    logits = model(torch.tensor([[0, 1, 0]])).logits[0, -1]
    assert logits.exp().tolist() == pytest.approx([float(p) for p in expected[(1, 0)]], abs=1e-6)


def test_order_one_is_a_smoothed_unigram():
    """Raw counts 0: 1, 1: 1, 2: 2, 3: 3, 4: 4, 5: 0 over 11 tokens, vocabulary 6: n1..n4 = 2, 1, 1, 1, so the
    closed form: Y = 2/4, D1 = 1 - 2 * 1/2 * 1/2 = 1/2, D2 = 2 - 3 * 1/2 * 1 = 1/2, D3+ = 3 - 4 * 1/2 * 1 = 1.
    gamma = (2 * 1/2 + 1 * 1/2 + 2 * 1) / 11 = 7/22, spread as 7/22 / 6 = 7/132 over the vocabulary:
    p = ((1 - 1/2)/11, same, (2 - 1/2)/11, (3 - 1)/11, (4 - 1)/11, 0) + 7/132 = (13, 13, 25, 31, 43, 7) / 132."""
    stream = np.array([4, 3, 2, 4, 0, 3, 4, 1, 2, 3, 4])
    model = NGramForCausalLM.count(stream, vocab_size=6, order=1)
    assert model.config.discounts == [pytest.approx([0.5, 0.5, 1.0])]
    unigram = [n / 132 for n in (13, 13, 25, 31, 43, 7)]
    for context in ([4], [0, 1], [5, 5, 5], [2, 3, 4]):  # the context changes nothing
        assert probabilities_after(model, context) == pytest.approx(unigram)


def test_probabilities_sum_to_one_for_seen_and_unseen_contexts():
    rng = np.random.default_rng(0)
    vocab_size = 40
    stream = rng.zipf(1.5, size=3000).clip(max=vocab_size - 3)  # ids 0, 38 and 39 never occur
    model = NGramForCausalLM.count(stream, vocab_size, order=4)
    seen = [stream[10:13].tolist(), stream[500:503].tolist(), stream[7:9].tolist()]
    unseen = [[39, 38, 39], [stream[0], 39, stream[1]], [38]]  # never counted, or a counted word after a new one
    for context in seen + unseen:
        targets = probabilities_after(model, context)
        dense = model(torch.tensor([context])).logits[0, -1].exp()
        assert math.fsum(targets) == pytest.approx(1.0, abs=1e-6), context
        assert dense.sum().item() == pytest.approx(1.0, abs=1e-5)
        assert dense.tolist() == pytest.approx(targets, rel=1e-5, abs=1e-8)
    # The predictions are the most probable words of the dense distributions (with ties, the lowest id), and
    # forward's loss is the mean nats per token.
    rows = torch.from_numpy(np.concatenate([stream[:57], [39, 38, 0]]).reshape(3, 20))
    logits = model(rows).logits
    predictions = model.next_token_predictions(rows)
    assert torch.allclose(logits.gather(2, predictions.unsqueeze(2)).squeeze(2), logits.max(dim=2).values,
                          atol=1e-6)
    assert (predictions == logits.argmax(dim=-1)).float().mean() > 0.9
    assert model(rows, labels=rows).loss.item() == pytest.approx(model.nats_per_token(rows), rel=1e-5)


def test_a_trigram_model_beats_the_uniform_baseline_on_repetitive_text():
    rng = np.random.default_rng(1)
    phrases = [[5, 9, 2, 7], [5, 9, 3], [8, 1, 1, 4, 6]]
    text = np.concatenate([phrases[index] for index in rng.integers(0, 3, size=600)])
    train, held_out = text[:2000], torch.from_numpy(text[2000:])
    vocab_size = 50
    trigram = NGramForCausalLM.count(train, vocab_size, order=3)
    unigram = NGramForCausalLM.count(train, vocab_size, order=1)
    assert trigram.nats_per_token(held_out) < 0.5 < unigram.nats_per_token(held_out) < math.log(vocab_size)


def test_a_saved_model_reloads_with_identical_scores(tmp_path):
    rng = np.random.default_rng(2)
    stream = rng.integers(0, 30, size=2000) % rng.integers(1, 30, size=2000)  # skewed towards small ids
    model = NGramForCausalLM.count(stream, vocab_size=32, order=3, eos_token_id=0)
    model.save_pretrained(tmp_path / "ngram")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ngram")
    assert isinstance(reloaded, NGramForCausalLM) and reloaded.config.table_sizes == model.config.table_sizes
    rows = torch.from_numpy(rng.integers(0, 32, size=(4, 25)))
    assert torch.equal(reloaded.target_log_probabilities(rows), model.target_log_probabilities(rows))
    assert torch.equal(reloaded(rows).logits, model(rows).logits)
