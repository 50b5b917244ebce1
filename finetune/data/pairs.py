"""Pairs of labelled rows for contrastive sentence-embedding training (SetFit's sampling, Tunstall et al. 2022).

Each of `iterations` rounds gives every row one similar partner (a row of its class, possibly itself) and one
dissimilar partner (a row of another class): 2 x iterations x rows pairs, shuffled. Multi-label rows are similar when
they share a label (SetFit's rule): a row of no label is similar to none, and dissimilar to every other row (never to
itself: the same text is no dissimilar pair); a row that shares a label with every other has no dissimilar partner.
The draw is seeded: the same rows and seed give the same pairs.
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
        dissimilar = ~similar
        dissimilar[row] = False  # a row of no label shares none with itself, yet its own text is not a partner
        for kind, partners in ((1.0, np.flatnonzero(similar)), (0.0, np.flatnonzero(dissimilar))):
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


def unpaired(labels: np.ndarray) -> str | None:
    """Why the rows give no similar pair of two rows, or no dissimilar pair (the pair losses need both), or None.

    Decided on the rows' distinct label sets (at most rows x rows of them, far fewer in practice), not their pairs."""
    if len(labels) < 2:
        return f"{len(labels)} training row(s) make no pair of two rows"
    present = np.eye(int(labels.max()) + 1, dtype=np.int64)[labels] if labels.ndim == 1 else labels > 0.5
    sets, counts = np.unique(np.asarray(present, dtype=np.int64), axis=0, return_counts=True)
    shares = sets @ sets.T > 0
    two_rows = np.ones_like(shares)  # set pairs that can be two different rows: a set with itself when 2 rows hold it
    np.fill_diagonal(two_rows, counts > 1)
    if not (shares & two_rows).any():
        return f"no two of the {len(labels):,} training rows share a label: no similar pair"
    if not (~shares & two_rows).any():
        return f"every two of the {len(labels):,} training rows share a label: no dissimilar pair"
    return None
