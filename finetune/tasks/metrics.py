"""The metrics of the classification and regression kinds, GLUE's among them, computed offline with scikit-learn and
SciPy (what the hub's `glue` metric script does); the other kinds' are in kinds/K/metrics.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    f1_score,
    matthews_corrcoef,
    precision_recall_fscore_support,
    precision_score,
    recall_score,
)

from finetune.tasks.specs import TaskSpec


def _correlation(function: Callable) -> Callable[[np.ndarray, np.ndarray], float]:
    """A correlation that is 0.0, not NaN, when either side is constant (e.g. an untrained model)."""

    def compute(predictions: np.ndarray, references: np.ndarray) -> float:
        if np.ptp(predictions) == 0 or np.ptp(references) == 0:
            return 0.0
        return float(function(predictions, references)[0])

    return compute


def _averaged(function: Callable, average: str) -> Callable[[np.ndarray, np.ndarray], float]:
    """A per-class score of scikit-learn averaged over the classes that occur in the references or predictions
    (0 where a class has no predictions or no references)."""

    def compute(predictions: np.ndarray, references: np.ndarray) -> float:
        return float(function(references, predictions, average=average, zero_division=0.0))

    return compute


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": lambda predictions, references: float(accuracy_score(references, predictions)),
    # GLUE's F1 is the F1 of the positive class (label index 1) of a binary task.
    "f1": lambda predictions, references: float(f1_score(references, predictions, pos_label=1, zero_division=0.0)),
    "mcc": lambda predictions, references: float(matthews_corrcoef(references, predictions)),
    # Any number of classes: the mean of each class's score (macro), or weighted by its references (weighted).
    "f1_macro": _averaged(f1_score, "macro"),
    "f1_weighted": _averaged(f1_score, "weighted"),
    "precision_macro": _averaged(precision_score, "macro"),
    "recall_macro": _averaged(recall_score, "macro"),
    "pearson": _correlation(pearsonr),
    "spearman": _correlation(spearmanr),
}


def compute_metrics(spec: TaskSpec, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """Every metric of the task; predictions are class indices, or real numbers for regression."""
    predictions, references = np.asarray(predictions), np.asarray(references)
    return {name: METRICS[name](predictions, references) for name in spec.metrics}


def class_report(labels: tuple[str, ...], predictions: np.ndarray, references: np.ndarray) -> dict:
    """Per class (every one of `labels`, in order): precision, recall, F1 (0 where undefined) and support (its
    references); and the confusion matrix, rows the references and columns the predictions, by class index."""
    indices = list(range(len(labels)))
    predictions, references = np.asarray(predictions).astype(int), np.asarray(references).astype(int)
    precision, recall, f1, support = precision_recall_fscore_support(
        references, predictions, labels=indices, zero_division=0.0
    )
    return {
        "labels": list(labels),
        "per_class": {
            label: {
                "precision": float(precision[index]),
                "recall": float(recall[index]),
                "f1": float(f1[index]),
                "support": int(support[index]),
            }
            for index, label in enumerate(labels)
        },
        "confusion_matrix": confusion_matrix(references, predictions, labels=indices).tolist(),
    }
