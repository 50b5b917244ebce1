"""The scores of multi-label tasks: micro and macro F1, subset accuracy, a table per label, the dev-chosen
threshold."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import f1_score

# Multi-label tasks: `references` and `predicted` are 0/1 (or boolean) arrays of shape (examples, labels).

THRESHOLD_GRID = tuple(round(0.01 * step, 2) for step in range(1, 100))  # where a dev-chosen threshold is looked for


def _label_counts(references: np.ndarray, predicted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True positives, false positives and false negatives per label."""
    references, predicted = np.asarray(references).astype(bool), np.asarray(predicted).astype(bool)
    return (
        (references & predicted).sum(axis=0),
        (~references & predicted).sum(axis=0),
        (references & ~predicted).sum(axis=0),
    )


def _f1(true_positives, false_positives, false_negatives):
    """2TP / (2TP + FP + FN); NaN where a label has neither references nor predictions (nothing to score)."""
    denominator = 2 * true_positives + false_positives + false_negatives
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, 2 * true_positives / np.maximum(denominator, 1), np.nan)


def multilabel_metrics(references: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Micro F1 (every example x label decision pooled), macro F1 (the mean of each label's F1, over the labels
    that occur in the references or the predictions), weighted F1 (each label's F1 weighted by its examples, with
    scikit-learn), subset accuracy (examples whose whole label set is right)."""
    true_positives, false_positives, false_negatives = _label_counts(references, predicted)
    micro = _f1(true_positives.sum(), false_positives.sum(), false_negatives.sum())
    per_label = _f1(true_positives, false_positives, false_negatives)
    exact = (np.asarray(references).astype(bool) == np.asarray(predicted).astype(bool)).all(axis=1)
    return {
        "f1_micro": 0.0 if np.isnan(micro) else float(micro),
        "f1_macro": 0.0 if np.isnan(per_label).all() else float(np.nanmean(per_label)),
        "f1_weighted": _f1_weighted(references, predicted),
        "subset_accuracy": float(exact.mean()),
    }


def _f1_weighted(references: np.ndarray, predicted: np.ndarray) -> float:
    """scikit-learn's F1 averaged over the labels weighted by their examples; 0.0 when no example has a label."""
    references, predicted = np.asarray(references).astype(int), np.asarray(predicted).astype(int)
    if not references.any():
        return 0.0
    return float(f1_score(references, predicted, average="weighted", zero_division=0.0))


def label_table(references: np.ndarray, predicted: np.ndarray, labels) -> dict[str, dict[str, float]]:
    """Per label: precision, recall, F1 (0 where undefined) and the examples that have it in the references."""
    true_positives, false_positives, false_negatives = _label_counts(references, predicted)
    table = {}
    for index, label in enumerate(labels):
        tp, fp, fn = int(true_positives[index]), int(false_positives[index]), int(false_negatives[index])
        table[label] = {
            "precision": tp / (tp + fp) if tp + fp else 0.0,
            "recall": tp / (tp + fn) if tp + fn else 0.0,
            "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
            "examples": tp + fn,
        }
    return table


def best_threshold(references: np.ndarray, probabilities: np.ndarray, grid=THRESHOLD_GRID) -> float:
    """The one threshold of `grid` (labels predicted above it) with the highest micro F1; of equal ones, the nearest
    to 0.5 (then the lower): F1 is flat between two probabilities, and 0.5 is where an untuned model stands."""
    scores = [multilabel_metrics(references, probabilities > threshold)["f1_micro"] for threshold in grid]
    best = max(scores)
    return min(
        (threshold for threshold, score in zip(grid, scores) if score == best),
        key=lambda threshold: (round(abs(threshold - 0.5), 6), threshold),
    )
