"""Multi-label outputs (task kind multilabel): logits to per-label probabilities, the loss, and label sets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def label_probabilities(logits: np.ndarray) -> np.ndarray:
    """A sigmoid per label (each label is its own yes/no decision; they do not compete as in a softmax)."""
    return torch.sigmoid(torch.from_numpy(np.asarray(logits)).double()).numpy()


def binary_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over examples x labels of the binary cross-entropy: what transformers' multi-label head computes
    (BCEWithLogitsLoss)."""
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def label_sets(probabilities: np.ndarray, labels: Sequence[str], threshold: float) -> list[list[str]]:
    """Each example's labels above the threshold, in label order."""
    return [[label for label, probability in zip(labels, row) if probability > threshold] for row in probabilities]
