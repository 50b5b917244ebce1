"""SetFit's pairs: every row gets `iterations` similar and dissimilar partners, drawn by the seed."""

from __future__ import annotations

import numpy as np

from finetune.data.pairs import contrastive_pairs


def test_every_row_gets_its_similar_and_dissimilar_partners():
    labels = np.array([0, 0, 1, 1, 2, 2, 2])
    pairs = contrastive_pairs(labels, iterations=5, seed=0)
    assert len(pairs.first) == 2 * 5 * len(labels)
    for row in range(len(labels)):
        mine = pairs.first == row
        assert mine.sum() == 10 and pairs.similar[mine].sum() == 5
    same_class = labels[pairs.first] == labels[pairs.second]
    assert np.array_equal(same_class, pairs.similar == 1.0)


def test_the_seed_draws_the_pairs():
    labels = np.array([0, 1] * 6)
    one, again, other = (contrastive_pairs(labels, 3, seed) for seed in (1, 1, 2))
    assert all(np.array_equal(a, b) for a, b in zip(one, again))
    assert not np.array_equal(one.second, other.second)


def test_multilabel_rows_are_similar_when_they_share_a_label():
    labels = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=np.float32)
    pairs = contrastive_pairs(labels, iterations=4, seed=0)
    shared = (labels[pairs.first] * labels[pairs.second]).sum(axis=1) > 0
    assert np.array_equal(shared, pairs.similar == 1.0)


def test_a_row_that_shares_a_label_with_every_row_has_no_dissimilar_partner():
    labels = np.array([[1, 1], [1, 0], [0, 1]], dtype=np.float32)  # row 0 shares with both others
    pairs = contrastive_pairs(labels, iterations=2, seed=0)
    assert pairs.similar[pairs.first == 0].tolist() == [1.0, 1.0]
