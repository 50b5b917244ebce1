"""GLUE metrics computed offline with scikit-learn and SciPy (what the hub's `glue` metric script does): those of
the classification and regression kinds (the other kinds' are in kinds/K/metrics.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import pearsonr, spearmanr
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
