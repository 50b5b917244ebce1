"""Pairs of labelled rows for contrastive sentence-embedding training (SetFit's sampling, Tunstall et al. 2022).

Each of `iterations` rounds gives every row one similar partner (a row of its class, possibly itself) and one
dissimilar partner (a row of another class): 2 x iterations x rows pairs, shuffled. Multi-label rows are similar when
they share a label (SetFit's rule). The draw is seeded: the same rows and seed give the same pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Pairs(NamedTuple):
    """Row indices of each pair's two sides, and whether the pair is similar (1.0) or not (0.0)."""

    first: np.ndarray
    second: np.ndarray
    similar: np.ndarray


def similar_rows(labels: np.ndarray, row: int) -> np.ndarray:
    """Booleans over the rows: of `row`'s class (class indices), or sharing one of its labels (0/1 label rows)."""
    if labels.ndim == 1:
        return labels == labels[row]
    return np.asarray((labels[:, labels[row] > 0.5] > 0.5).any(axis=1))


def contrastive_pairs(labels: np.ndarray, iterations: int, seed: int) -> Pairs:
    """SetFit's pairs of the rows with `labels`, `iterations` similar and dissimilar partners per row."""
    generator = np.random.default_rng(seed)
    first, second, kinds = [], [], []
    for row in range(len(labels)):
        similar = similar_rows(labels, row)
        for kind, partners in ((1.0, np.flatnonzero(similar)), (0.0, np.flatnonzero(~similar))):
            if len(partners):  # a row that shares a label with every other has no dissimilar partner
                first.append(np.full(iterations, row))
                second.append(partners[generator.integers(len(partners), size=iterations)])
                kinds.append(np.full(iterations, kind, dtype=np.float32))
    if not first:
        return Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    order = generator.permutation(sum(len(part) for part in first))
    return Pairs(
        np.concatenate(first).astype(np.int64)[order],
        np.concatenate(second).astype(np.int64)[order],
        np.concatenate(kinds)[order],
    )
