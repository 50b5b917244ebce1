"""SetFit's pairs: every row gets `iterations` similar and dissimilar partners, drawn by the seed."""

from __future__ import annotations

import numpy as np

from finetune.data.pairs import contrastive_pairs, unpaired


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


def test_a_row_of_no_label_is_dissimilar_to_every_other_row_and_never_paired_with_itself():
    labels = np.array([[1, 0], [0, 0], [1, 0], [0, 1]], dtype=np.float32)
    pairs = contrastive_pairs(labels, iterations=20, seed=0)
    mine = pairs.first == 1
    assert mine.sum() == 20 and pairs.similar[mine].sum() == 0  # no similar partner: its dissimilar ones only
    assert set(pairs.second[mine].tolist()) <= {0, 2, 3}
    assert not ((pairs.first == pairs.second) & (pairs.similar == 0.0)).any()


def test_unpaired_says_when_the_rows_give_no_pair_of_one_kind():
    fine = [np.array([0, 0, 1, 1]), np.array([[1, 1], [1, 0], [0, 1]]), np.array([[1, 0], [1, 0], [0, 0]])]
    assert [unpaired(labels) for labels in fine] == [None, None, None]
    no_similar = [np.array([0, 1, 2]), np.array([[1, 0], [0, 1], [0, 0], [0, 0]])]
    for labels in no_similar:
        assert unpaired(labels) == f"no two of the {len(labels)} training rows share a label: no similar pair"
    no_dissimilar = [
        np.array([1, 1, 1]),
        np.array([[1, 1], [1, 0], [1, 0]]),
        np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]]),
    ]
    for labels in no_dissimilar:
        assert unpaired(labels) == f"every two of the {len(labels)} training rows share a label: no dissimilar pair"
    assert unpaired(np.array([[1, 0]])) == "1 training row(s) make no pair of two rows"


def test_unpaired_agrees_with_the_pairs_drawn():
    """Random label rows: the rows give pairs of both kinds (of two different rows) exactly when unpaired says so."""
    generator = np.random.default_rng(0)
    for _ in range(50):
        labels = (generator.random((int(generator.integers(2, 7)), 3)) < 0.4).astype(np.float32)
        pairs = contrastive_pairs(labels, iterations=30, seed=0)
        two_rows = pairs.first != pairs.second
        kinds = {float(kind) for kind in pairs.similar[two_rows]}
        assert (unpaired(labels) is None) == (kinds == {0.0, 1.0}), (labels, kinds)
