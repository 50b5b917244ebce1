"""GLUE metrics computed offline with scikit-learn and SciPy (what the hub's `glue` metric script does), and the
entity-level scores of tagging tasks with seqeval."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import pearsonr, spearmanr
from seqeval import metrics as entity_metrics
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from finetune.glue.specs import TaskSpec


def _correlation(function: Callable) -> Callable[[np.ndarray, np.ndarray], float]:
    """A correlation that is 0.0, not NaN, when either side is constant (e.g. an untrained model)."""

    def compute(predictions: np.ndarray, references: np.ndarray) -> float:
        if np.ptp(predictions) == 0 or np.ptp(references) == 0:
            return 0.0
        return float(function(predictions, references)[0])

    return compute


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": lambda predictions, references: float(accuracy_score(references, predictions)),
    # GLUE's F1 is the F1 of the positive class (label index 1) of a binary task.
    "f1": lambda predictions, references: float(f1_score(references, predictions, pos_label=1, zero_division=0.0)),
    "mcc": lambda predictions, references: float(matthews_corrcoef(references, predictions)),
    "pearson": _correlation(pearsonr),
    "spearman": _correlation(spearmanr),
}


def compute_metrics(spec: TaskSpec, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """Every metric of the task; predictions are class indices, or real numbers for regression."""
    predictions, references = np.asarray(predictions), np.asarray(references)
    return {name: METRICS[name](predictions, references) for name in spec.metrics}


def tagging_metrics(references: list[list[str]], predictions: list[list[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1 (seqeval, CoNLL's conlleval rules: an I- tag may start an
    entity), and the accuracy over every word's tag."""
    return {
        "f1": float(entity_metrics.f1_score(references, predictions, zero_division=0)),
        "precision": float(entity_metrics.precision_score(references, predictions, zero_division=0)),
        "recall": float(entity_metrics.recall_score(references, predictions, zero_division=0)),
        "accuracy": float(entity_metrics.accuracy_score(references, predictions)),
    }


def entity_types_table(references: list[list[str]], predictions: list[list[str]]) -> dict[str, dict[str, float]]:
    """Per entity type: precision, recall, F1 and the number of entities in the references (seqeval's report)."""
    report = entity_metrics.classification_report(references, predictions, output_dict=True, zero_division=0)
    return {
        name: {
            "precision": float(row["precision"]),
            "recall": float(row["recall"]),
            "f1": float(row["f1-score"]),
            "entities": int(row["support"]),
        }
        for name, row in report.items()
        if not name.endswith(" avg")
    }


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
    that occur in the references or the predictions), subset accuracy (examples whose whole label set is right)."""
    true_positives, false_positives, false_negatives = _label_counts(references, predicted)
    micro = _f1(true_positives.sum(), false_positives.sum(), false_negatives.sum())
    per_label = _f1(true_positives, false_positives, false_negatives)
    exact = (np.asarray(references).astype(bool) == np.asarray(predicted).astype(bool)).all(axis=1)
    return {
        "micro_f1": 0.0 if np.isnan(micro) else float(micro),
        "macro_f1": 0.0 if np.isnan(per_label).all() else float(np.nanmean(per_label)),
        "subset_accuracy": float(exact.mean()),
    }


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
    scores = [multilabel_metrics(references, probabilities > threshold)["micro_f1"] for threshold in grid]
    best = max(scores)
    return min(
        (threshold for threshold, score in zip(grid, scores) if score == best),
        key=lambda threshold: (round(abs(threshold - 0.5), 6), threshold),
    )
