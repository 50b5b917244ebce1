"""BERT masking: the 15% / 80-10-10 rule, special tokens, determinism, and per-epoch masks of packed blocks."""

from __future__ import annotations

import numpy as np
import pytest

from finetune.data.corpus import MaskedBlocks
from finetune.data.masking import MaskingRule
from finetune.data.tokenizers import train_wordpiece
from finetune.recipes import MaskingConfig
from finetune.tasks.specs import IGNORE_INDEX

VOCAB = 1000
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = np.array([PAD, UNK, CLS, SEP, MASK])


def make_rule(**rates) -> MaskingRule:
    return MaskingRule(mask_token_id=MASK, special_ids=SPECIAL, vocab_size=VOCAB, **rates)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    """200k token ids, about 10% of them special tokens spread through the stream."""
    rng = np.random.default_rng(123)
    ids = rng.integers(len(SPECIAL), VOCAB, size=200_000)
    special_positions = rng.random(ids.shape) < 0.1
    ids[special_positions] = rng.choice(SPECIAL, size=int(special_positions.sum()))
    return ids


def outcome(tokens: np.ndarray, rule: MaskingRule, seed: int = 0):
    inputs, labels = rule.apply(tokens, np.random.default_rng(seed))
    chosen = labels != IGNORE_INDEX
    masked = chosen & (inputs == MASK)
    randomised = chosen & (inputs != MASK) & (inputs != tokens)
    unchanged = chosen & (inputs == tokens)
    return inputs, labels, chosen, masked, randomised, unchanged


def test_default_rates(tokens):
    _inputs, _labels, chosen, masked, randomised, unchanged = outcome(tokens, make_rule())
    candidates = ~np.isin(tokens, SPECIAL)
    assert chosen.sum() / candidates.sum() == pytest.approx(0.15, abs=0.005)
    total = chosen.sum()
    assert masked.sum() / total == pytest.approx(0.8, abs=0.01)
    # A random replacement equals the original by chance with probability ~1/995: still ~10%.
    assert randomised.sum() / total == pytest.approx(0.1, abs=0.01)
    assert unchanged.sum() / total == pytest.approx(0.1, abs=0.01)
    assert masked.sum() + randomised.sum() + unchanged.sum() == total


def test_labels_hold_the_original_tokens(tokens):
    inputs, labels, chosen, *_ = outcome(tokens, make_rule())
    np.testing.assert_array_equal(labels[chosen], tokens[chosen])
    assert (labels[~chosen] == IGNORE_INDEX).all()
    # Positions that are not chosen are never touched.
    np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])


def test_input_is_not_modified(tokens):
    copy = tokens.copy()
    make_rule().apply(tokens, np.random.default_rng(0))
    np.testing.assert_array_equal(tokens, copy)


def test_special_tokens_are_never_chosen(tokens):
    inputs, _labels, chosen, *_ = outcome(tokens, make_rule(probability=0.9))
    is_special = np.isin(tokens, SPECIAL)
    assert is_special.sum() > 10_000
    assert not chosen[is_special].any()
    np.testing.assert_array_equal(inputs[is_special], tokens[is_special])


def test_random_replacements_are_never_special(tokens):
    # Everything chosen is randomised: every replacement must come from the ordinary vocabulary.
    rule = make_rule(probability=0.5, mask_fraction=0.0, random_fraction=1.0)
    inputs, _labels, chosen, masked, randomised, unchanged = outcome(tokens, rule)
    assert masked.sum() == 0
    assert not np.isin(inputs[chosen], SPECIAL).any()
    # The replacements cover the ordinary vocabulary (they are drawn from it, not from a few ids).
    assert len(np.unique(inputs[randomised])) > 0.95 * (VOCAB - len(SPECIAL))
    assert unchanged.sum() / chosen.sum() < 0.01


def test_replacement_ids_exclude_specials():
    rule = make_rule()
    np.testing.assert_array_equal(rule.replacement_ids, np.arange(len(SPECIAL), VOCAB))


@pytest.mark.parametrize(
    ("probability", "mask_fraction", "random_fraction"),
    [(0.3, 0.5, 0.2), (0.5, 0.2, 0.3), (0.2, 1.0, 0.0), (0.15, 0.0, 0.0)],
)
def test_custom_rates(tokens, probability, mask_fraction, random_fraction):
    rule = make_rule(probability=probability, mask_fraction=mask_fraction, random_fraction=random_fraction)
    _inputs, _labels, chosen, masked, randomised, unchanged = outcome(tokens, rule)
    candidates = ~np.isin(tokens, SPECIAL)
    total = chosen.sum()
    assert total / candidates.sum() == pytest.approx(probability, abs=0.005)
    assert masked.sum() / total == pytest.approx(mask_fraction, abs=0.01)
    assert randomised.sum() / total == pytest.approx(random_fraction, abs=0.01)
    assert unchanged.sum() / total == pytest.approx(1 - mask_fraction - random_fraction, abs=0.01)


def test_same_seed_same_output(tokens):
    rule = make_rule()
    first = rule.apply(tokens, np.random.default_rng(7))
    second = rule.apply(tokens, np.random.default_rng(7))
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])


def test_different_seed_differs(tokens):
    rule = make_rule()
    first = rule.apply(tokens, np.random.default_rng(7))
    second = rule.apply(tokens, np.random.default_rng(8))
    assert not np.array_equal(first[1], second[1])
    assert not np.array_equal(first[0], second[0])


def test_rule_for_tokenizer():
    class FakeTokenizer:
        mask_token_id = MASK
        all_special_ids = (SEP, CLS, MASK, PAD, UNK, CLS)

        def __len__(self):
            return VOCAB

    rule = MaskingRule.for_tokenizer(
        FakeTokenizer(), MaskingConfig(probability=0.2, mask_fraction=0.7, random_fraction=0.2)
    )
    assert rule.mask_token_id == MASK and rule.vocab_size == VOCAB
    np.testing.assert_array_equal(rule.special_ids, SPECIAL)
    assert (rule.probability, rule.mask_fraction, rule.random_fraction) == (0.2, 0.7, 0.2)
    assert rule.continues_word is None  # token-level unless whole_word is asked for


def whole_word_rule(probability: float = 0.15):
    """A whole-word rule on a real WordPiece tokenizer whose vocabulary splits long words into pieces."""
    words = ["un", "believ", "able", "the", "film", "was", "unbelievable", "remarkably", "dull", "and", "long"]
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(300)]
    tokenizer = train_wordpiece(lines, vocab_size=60, min_frequency=1)
    config = MaskingConfig(probability=probability, whole_word=True)
    return tokenizer, MaskingRule.for_tokenizer(tokenizer, config)


def test_whole_word_masking_chooses_every_piece_of_a_word_together():
    tokenizer, rule = whole_word_rule()
    text = " ".join(["unbelievable remarkably dull film"] * 400)
    ids = np.array(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert rule.continues_word[ids].any(), "the test text must contain multi-piece words"
    inputs, labels = rule.apply(ids, np.random.default_rng(3))
    chosen = labels != IGNORE_INDEX
    word = np.cumsum(~rule.continues_word[ids]) - 1
    for index in np.unique(word):
        pieces = chosen[word == index]
        assert pieces.all() or not pieces.any(), "a word was split between chosen and not chosen"
        if pieces.all():  # the whole word shares one action: all [MASK], or none
            masked = inputs[word == index] == tokenizer.mask_token_id
            assert masked.all() or not masked.any()
    words_chosen = len(np.unique(word[chosen])) / len(np.unique(word))
    assert abs(words_chosen - 0.15) < 0.03
    # 80/10/10 still holds, counted per token
    assert abs((inputs[chosen] == tokenizer.mask_token_id).mean() - 0.8) < 0.06


def test_whole_word_masking_never_chooses_special_tokens():
    tokenizer, rule = whole_word_rule(probability=0.9)
    ids = np.array(
        tokenizer(["remarkably dull", "unbelievable film"] * 50, add_special_tokens=True, is_split_into_words=False)[
            "input_ids"
        ][0]
    )
    for seed in range(20):
        _, labels = rule.apply(ids, np.random.default_rng(seed))
        assert not np.isin(ids[labels != IGNORE_INDEX], rule.special_ids).any()


# ---------------------------------------------------------------------------------------------
# MaskedBlocks: masks drawn per (seed, epoch, block)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def blocks() -> np.ndarray:
    rng = np.random.default_rng(5)
    data = rng.integers(len(SPECIAL), VOCAB, size=(12, 64))
    data[:, 0] = CLS
    return data


def _items(dataset, order):
    return {index: dataset[index] for index in order}


def test_masked_blocks_same_mask_in_any_order(blocks):
    rule = make_rule()
    forward = _items(MaskedBlocks(blocks, rule, seed=3), range(len(blocks)))
    backward = _items(MaskedBlocks(blocks, rule, seed=3), reversed(range(len(blocks))))
    repeated = _items(MaskedBlocks(blocks, rule, seed=3), [5, 5, 0, 11])
    for index in range(len(blocks)):
        assert forward[index]["input_ids"].equal(backward[index]["input_ids"])
        assert forward[index]["labels"].equal(backward[index]["labels"])
    for index, item in repeated.items():
        assert item["labels"].equal(forward[index]["labels"])
    # Blocks get their own masks, not one mask repeated.
    assert not forward[0]["labels"].equal(forward[1]["labels"])


def test_masked_blocks_items(blocks):
    dataset = MaskedBlocks(blocks, make_rule(), seed=0)
    assert len(dataset) == 12
    item = dataset[0]
    assert set(item) == {"input_ids", "labels"}
    assert item["input_ids"].shape == (64,) and item["input_ids"].dtype.is_floating_point is False
    assert item["labels"][0] == IGNORE_INDEX  # [CLS] is never a target
    assert ((item["labels"] != IGNORE_INDEX).sum()) > 0


def test_masked_blocks_new_mask_each_epoch(blocks):
    dataset = MaskedBlocks(blocks, make_rule(), seed=3)
    epoch_zero = [dataset[index]["labels"] for index in range(len(blocks))]
    dataset.set_epoch(1)
    epoch_one = [dataset[index]["labels"] for index in range(len(blocks))]
    assert all(not a.equal(b) for a, b in zip(epoch_zero, epoch_one))
    dataset.set_epoch(0)
    assert all(a.equal(dataset[index]["labels"]) for index, a in enumerate(epoch_zero))


def test_masked_blocks_seed_matters(blocks):
    first = MaskedBlocks(blocks, make_rule(), seed=3)[0]["labels"]
    second = MaskedBlocks(blocks, make_rule(), seed=4)[0]["labels"]
    assert not first.equal(second)


def test_masked_blocks_fixed_masks(blocks):
    dataset = MaskedBlocks(blocks, make_rule(), seed=3, fixed_masks=True)
    before = [dataset[index]["input_ids"] for index in range(len(blocks))]
    dataset.set_epoch(1)
    after = [dataset[index]["input_ids"] for index in range(len(blocks))]
    assert all(a.equal(b) for a, b in zip(before, after))
