"""How sure a score or a difference is: the interval of a mean over runs, and paired tests of two runs.

- `mean_interval`: the 95% confidence interval of the mean of n runs' scores, Student t with n - 1 degrees of
  freedom, the runs taken as independent draws of the score.
- `mcnemar`: McNemar's exact test of two models' accuracy on the same rows. Under no difference a row that one gets
  right and the other wrong (a discordant pair) goes either way with probability 1/2, so the count of one kind is
  binomial(discordant, 1/2); the p-value is that count's two-sided exact binomial test.
- `paired_bootstrap`: any metric of two models' predictions of the same rows. The rows are resampled with
  replacement (the same resample for both models) RESAMPLES times from a fixed seed; the difference's interval is
  the 2.5th and 97.5th percentiles of the resampled differences, and its p-value the share of resampled differences
  at least as far from the observed one as the observed one is from 0 (the resampled distribution moved to a
  difference of 0: Efron and Tibshirani's bootstrap test), counting the observed sample itself.
- `paired_runs`: two sets of runs matched pair by pair (the same draw and seed): the paired t-test of their scores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # every interval here is a 95% one
SIGNIFICANCE = 0.05  # a difference with a p-value below this is said to be beyond noise
RESAMPLES = 10_000  # paired bootstrap resamples of the rows
BOOTSTRAP_SEED = 0  # fixed: comparing the same two runs twice gives the same interval and p-value
_RESAMPLED_VALUES = 2_000_000  # row indices drawn at once (16 MB): resamples go in chunks of this many values

# A metric of resampled rows: (references, predictions, resamples as row indices of shape (chunk, rows)) -> (chunk,)
ResampledScore = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Difference:
    """A metric of two runs (or sets of runs) and how sure their difference (second - first) is."""

    metric: str
    first: float
    second: float
    difference: float
    interval: tuple[float, float] | None  # the difference's 95% interval (None: too few runs to say)
    p_value: float | None
    test: str  # the test that gave the p-value, in words

    @property
    def verdict(self) -> str:
        """One sentence: whether the difference is beyond the noise the test measures."""
        if self.p_value is None:
            return "not tested"
        return "differ beyond noise (p < 0.05)" if self.p_value < SIGNIFICANCE else "within noise (p >= 0.05)"


def t_quantile(degrees_of_freedom: int, level: float = LEVEL) -> float:
    """The two-sided Student t quantile of `level` (2.776 for 4 degrees of freedom at 95%)."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, degrees_of_freedom))


def mean_interval(values: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The confidence interval of the mean of `values` (Student t, n - 1 degrees of freedom); None for one value."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t_quantile(len(values) - 1, level) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


def mcnemar(first_correct: np.ndarray, second_correct: np.ndarray) -> float:
    """McNemar's exact p-value for two models' right (True) and wrong answers on the same rows; 1.0 when no row is
    discordant."""
    from scipy.stats import binomtest

    first_correct, second_correct = np.asarray(first_correct, bool), np.asarray(second_correct, bool)
    first_only = int((first_correct & ~second_correct).sum())
    second_only = int((second_correct & ~first_correct).sum())
    if first_only + second_only == 0:
        return 1.0
    return float(binomtest(first_only, first_only + second_only, 0.5).pvalue)


def resampled_rows(rows: int, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """The bootstrap's resamples of `rows` rows, as chunks of row indices of shape (chunk, rows)."""
    generator = np.random.default_rng(seed)
    chunk = max(1, _RESAMPLED_VALUES // max(rows, 1))
    for start in range(0, resamples, chunk):
        yield generator.integers(0, rows, size=(min(chunk, resamples - start), rows))


def paired_bootstrap(
    metric: str,
    score: ResampledScore,
    references: np.ndarray,
    first: np.ndarray,
    second: np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Difference:
    """The paired bootstrap of `metric` (`score`d on resampled rows) between two models' predictions of the same
    rows: the observed difference, its 95% interval and p-value."""
    every_row = np.arange(len(references))[None, :]
    first_score = float(score(references, first, every_row)[0])
    second_score = float(score(references, second, every_row)[0])
    observed = second_score - first_score
    differences = np.concatenate(
        [
            score(references, second, rows) - score(references, first, rows)
            for rows in resampled_rows(len(references), resamples, seed)
        ]
    )
    low, high = np.percentile(differences, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    # Differences of sums of the same rows in another order can differ in the last bits: a tolerance, not noise.
    as_far = np.abs(differences - observed) >= abs(observed) - 1e-12
    p_value = float((1 + as_far.sum()) / (1 + resamples))
    test = f"paired bootstrap, {resamples:,} resamples"
    return Difference(metric, first_score, second_score, observed, (float(low), float(high)), p_value, test)


def paired_runs(metric: str, first: list[float], second: list[float]) -> Difference:
    """The paired t-test of two sets of runs' scores, matched pair by pair: the mean difference, its 95% interval
    (Student t over the pairs) and p-value; no test with fewer than 2 pairs."""
    differences = [b - a for a, b in zip(first, second, strict=True)]
    mean = statistics.fmean(differences)
    interval, p_value = mean_interval(differences), None
    if len(differences) > 1:
        if statistics.stdev(differences) == 0:  # every pair differs alike: t is 0 (no difference) or infinite
            p_value = 1.0 if mean == 0 else 0.0
        else:
            from scipy.stats import ttest_rel

            p_value = float(ttest_rel(second, first).pvalue)
    test = f"paired t-test over {len(differences)} matching runs"
    return Difference(metric, statistics.fmean(first), statistics.fmean(second), mean, interval, p_value, test)


def right_rows(references: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Whether each row's prediction is right; a row of several labels is right when all of them are."""
    right = np.asarray(references) == np.asarray(predictions)
    return right.all(axis=tuple(range(1, right.ndim))) if right.ndim > 1 else right


def accuracy_score(references: np.ndarray, predictions: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The share of rows whose prediction is right, per resample (subset accuracy for rows of several labels)."""
    return right_rows(references, predictions)[rows].mean(axis=1)


def row_score(function: Callable[[np.ndarray, np.ndarray], float]) -> ResampledScore:
    """A metric of (predictions, references) computed on each resample in turn: any metric, at Python speed."""

    def score(references: np.ndarray, predictions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.array([function(predictions[sample], references[sample]) for sample in rows])

    return score


def confusion_score(metric: str, classes: int) -> ResampledScore | None:
    """The classification metrics of tasks/metrics.py (scikit-learn's definitions) from each resample's confusion
    matrix, all resamples at once: 10,000 resamples take about a second where scikit-learn takes minutes. None for
    a metric not computed this way."""
    if metric not in CONFUSION_METRICS:
        return None

    def score(references: np.ndarray, predictions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        codes = np.asarray(references, np.int64) * classes + np.asarray(predictions, np.int64)
        offsets = np.arange(len(rows))[:, None] * classes * classes
        counts = np.bincount((codes[rows] + offsets).ravel(), minlength=len(rows) * classes * classes)
        return CONFUSION_METRICS[metric](counts.reshape(len(rows), classes, classes).astype(np.float64))

    return score


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator != 0)


def _per_class(confusions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per resample and class (rows: references, columns: predictions): right, referenced, predicted, present."""
    right = np.diagonal(confusions, axis1=1, axis2=2)
    referenced, predicted = confusions.sum(axis=2), confusions.sum(axis=1)
    return right, referenced, predicted, (referenced + predicted) > 0


def _averaged(per_class: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]):
    """The mean of a per-class score over the classes in the references or predictions (scikit-learn's macro)."""

    def compute(confusions: np.ndarray) -> np.ndarray:
        right, referenced, predicted, present = _per_class(confusions)
        return (per_class(right, referenced, predicted) * present).sum(axis=1) / present.sum(axis=1)

    return compute


def _f1_weighted(confusions: np.ndarray) -> np.ndarray:
    right, referenced, predicted, _ = _per_class(confusions)
    return _ratio((_ratio(2 * right, referenced + predicted) * referenced).sum(axis=1), referenced.sum(axis=1))


def _mcc(confusions: np.ndarray) -> np.ndarray:
    """Matthews' correlation of K classes (Gorodkin's), as scikit-learn computes it; 0 where undefined."""
    right, referenced, predicted, _ = _per_class(confusions)
    total, correct = confusions.sum(axis=(1, 2)), right.sum(axis=1)
    covariance = correct * total - (referenced * predicted).sum(axis=1)
    spread = (total**2 - (predicted**2).sum(axis=1)) * (total**2 - (referenced**2).sum(axis=1))
    return _ratio(covariance, np.sqrt(spread))


CONFUSION_METRICS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "accuracy": lambda confusions: np.trace(confusions, axis1=1, axis2=2) / confusions.sum(axis=(1, 2)),
    # GLUE's F1: of the positive class, label index 1
    "f1": lambda confusions: _ratio(
        2 * confusions[:, 1, 1], confusions[:, 1, :].sum(axis=1) + confusions[:, :, 1].sum(axis=1)
    ),
    "mcc": _mcc,
    "f1_macro": _averaged(lambda right, referenced, predicted: _ratio(2 * right, referenced + predicted)),
    "f1_weighted": _f1_weighted,
    "precision_macro": _averaged(lambda right, referenced, predicted: _ratio(right, predicted)),
    "recall_macro": _averaged(lambda right, referenced, predicted: _ratio(right, referenced)),
}
