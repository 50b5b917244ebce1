"""The metrics of the classification and regression kinds (finetune/tasks/metrics.py) against hand-computed
values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from finetune.tasks.metrics import compute_metrics
from finetune.tasks.specs import TaskSpec


def spec_with(metrics, labels=("0", "1")) -> TaskSpec:
    return TaskSpec("custom", ("sentence",), "label", labels, tuple(metrics))


def test_accuracy_f1_mcc_by_hand():
    references = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    predictions = np.array([1, 1, 0, 0, 1, 0, 1, 0])
    # tp=3 fn=1 fp=1 tn=3
    tp, fn, fp, tn = 3, 1, 1, 3
    scores = compute_metrics(spec_with(["accuracy", "f1", "mcc"]), predictions, references)
    assert scores["accuracy"] == pytest.approx(6 / 8)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert scores["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert scores["mcc"] == pytest.approx(mcc)
    assert list(scores) == ["accuracy", "f1", "mcc"]


def test_f1_is_of_class_one():
    references = np.array([0, 0, 0, 1])
    predictions = np.array([0, 0, 0, 0])  # all of class 0: accuracy 0.75, F1 of class 1 is 0
    scores = compute_metrics(spec_with(["accuracy", "f1"]), predictions, references)
    assert scores == {"accuracy": 0.75, "f1": 0.0}
    # F1 of class 1 when class 1 is predicted well and class 0 badly.
    references = np.array([1, 1, 1, 0, 0])
    predictions = np.array([1, 1, 1, 1, 1])  # precision 3/5, recall 1 -> F1 = 0.75
    assert compute_metrics(spec_with(["f1"]), predictions, references)["f1"] == pytest.approx(0.75)


def test_mcc_extremes():
    references = np.array([0, 1, 0, 1, 1, 0])
    spec = spec_with(["mcc"])
    assert compute_metrics(spec, references, references)["mcc"] == pytest.approx(1.0)
    assert compute_metrics(spec, 1 - references, references)["mcc"] == pytest.approx(-1.0)
    assert compute_metrics(spec, np.ones(6, dtype=int), references)["mcc"] == 0.0


def test_correlations_by_hand():
    spec = spec_with(["pearson", "spearman"], labels=None)
    references = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    predictions = np.array([0.5, 1.0, 2.5, 2.0, 5.0])
    x, y = predictions - predictions.mean(), references - references.mean()
    pearson = (x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum())
    # ranks of predictions: 1 2 4 3 5; of references: 1 2 3 4 5; d^2 sum = 2
    spearman = 1 - 6 * 2 / (5 * (25 - 1))
    scores = compute_metrics(spec, predictions, references)
    assert scores["pearson"] == pytest.approx(pearson)
    assert scores["spearman"] == pytest.approx(spearman)


def test_monotone_but_nonlinear_prediction():
    spec = spec_with(["pearson", "spearman"], labels=None)
    references = np.arange(6, dtype=float)
    scores = compute_metrics(spec, references**3, references)
    assert scores["spearman"] == pytest.approx(1.0)
    assert scores["pearson"] < 0.99


def test_constant_predictions_give_zero_correlation():
    spec = spec_with(["pearson", "spearman"], labels=None)
    scores = compute_metrics(spec, np.full(5, 2.5), np.array([0.0, 1.0, 2.0, 3.0, 4.0]))
    assert scores == {"pearson": 0.0, "spearman": 0.0}
    assert not any(math.isnan(value) for value in scores.values())
