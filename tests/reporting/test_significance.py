"""The statistics of uncertain scores: the t interval of a mean over runs, McNemar's exact test, the paired
bootstrap (and its fast confusion-matrix metrics, checked against scikit-learn's), the paired t-test of runs."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from finetune.reporting.significance import (
    CONFUSION_METRICS,
    accuracy_score,
    confusion_score,
    mcnemar,
    mean_interval,
    paired_bootstrap,
    paired_runs,
    row_score,
)
from finetune.tasks.metrics import METRICS


def test_the_interval_of_a_mean_is_students_t_with_n_minus_1_degrees_of_freedom():
    values = [0.81, 0.78, 0.85, 0.80, 0.76, 0.83]
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    half = stats.t.ppf(0.975, df=5) * spread / math.sqrt(6)  # 2.5706 for 5 degrees of freedom
    assert mean_interval(values) == pytest.approx((mean - half, mean + half))
    assert mean_interval([0.5, 0.7]) == pytest.approx((0.6 - 12.7062 * 0.1, 0.6 + 12.7062 * 0.1), abs=1e-4)
    assert mean_interval([0.8]) is None  # one run: no spread to speak of
    assert mean_interval([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7))  # no spread: the mean itself


def test_mcnemar_counts_only_the_rows_where_the_runs_disagree():
    truth = np.ones(100, bool)
    first, second = truth.copy(), truth.copy()
    first[:12] = False  # the first run wrong on 12 rows that the second gets right, never the other way round
    assert mcnemar(first, second) == pytest.approx(2 * 0.5**12)  # two-sided exact: 12 of 12 discordant pairs
    assert mcnemar(first, second) < 0.05
    assert mcnemar(first, first) == 1.0  # identical answers: no discordant row
    second[50:62] = False  # 12 discordant rows each way: no evidence either way
    assert mcnemar(first, second) == 1.0
    second[50:55] = True  # 12 against 7
    assert mcnemar(first, second) == pytest.approx(stats.binomtest(7, 19, 0.5).pvalue)


def crafted_runs(rows: int = 400, first_wrong: int = 120, second_wrong: int = 40):
    """Gold labels of two classes and two runs' predictions: the first wrong on `first_wrong` rows, the second on
    `second_wrong` of those (the second clearly better when the counts differ)."""
    references = np.tile([0, 1], rows // 2)
    first, second = references.copy(), references.copy()
    first[:first_wrong] = 1 - first[:first_wrong]
    second[:second_wrong] = 1 - second[:second_wrong]
    return references, first, second


def test_a_clear_difference_is_beyond_noise_and_identical_runs_are_not():
    references, first, second = crafted_runs()
    for metric in ("accuracy", "f1", "mcc", "f1_macro"):
        difference = paired_bootstrap(metric, confusion_score(metric, 2), references, first, second)
        assert difference.difference == pytest.approx(
            METRICS[metric](second, references) - METRICS[metric](first, references)
        )
        low, high = difference.interval
        assert 0 < low < difference.difference < high
        assert difference.p_value < 0.05 and difference.verdict == "differ beyond noise (p < 0.05)"
        same = paired_bootstrap(metric, confusion_score(metric, 2), references, first, first)
        assert (same.difference, same.interval, same.p_value) == (0.0, (0.0, 0.0), 1.0)
        assert same.verdict == "within noise (p >= 0.05)"


def test_a_small_difference_on_few_rows_is_within_noise():
    references, first, second = crafted_runs(rows=40, first_wrong=10, second_wrong=8)
    difference = paired_bootstrap("f1", confusion_score("f1", 2), references, first, second)
    assert difference.p_value > 0.05 and difference.interval[0] <= 0 < difference.interval[1]


def test_the_bootstrap_is_the_same_every_time_and_its_seed_counts():
    references, first, second = crafted_runs(rows=60, first_wrong=14, second_wrong=9)
    score = confusion_score("mcc", 2)
    once = paired_bootstrap("mcc", score, references, first, second)
    assert paired_bootstrap("mcc", score, references, first, second) == once
    assert paired_bootstrap("mcc", score, references, first, second, seed=1).interval != once.interval


def test_the_bootstrap_of_any_metric_goes_one_resample_at_a_time():
    """Regression's correlations have no confusion matrix: scored resample by resample, as the fast route would."""
    generator = np.random.default_rng(0)
    references = generator.normal(size=50)
    first, second = references + generator.normal(size=50), references + 0.1 * generator.normal(size=50)
    difference = paired_bootstrap("pearson", row_score(METRICS["pearson"]), references, first, second, resamples=500)
    assert difference.difference == pytest.approx(
        stats.pearsonr(second, references)[0] - stats.pearsonr(first, references)[0]
    )
    assert difference.p_value < 0.05
    classes, predicted, other = crafted_runs(rows=30, first_wrong=9, second_wrong=3)
    fast = paired_bootstrap("f1", confusion_score("f1", 2), classes, predicted, other, resamples=300)
    slow = paired_bootstrap("f1", row_score(METRICS["f1"]), classes, predicted, other, resamples=300)
    assert fast.interval == pytest.approx(slow.interval) and fast.p_value == slow.p_value


@pytest.mark.filterwarnings("ignore:A single label was found")  # scikit-learn's, on resamples of one class
@pytest.mark.parametrize("classes", [2, 3, 5])
def test_the_confusion_matrix_metrics_are_scikit_learns(classes):
    generator = np.random.default_rng(classes)
    for trial in range(12):
        rows = int(generator.integers(1, 30))
        references = generator.integers(0, classes, rows)
        # Some predictions of one class only, and resamples missing classes: the cases scikit-learn defines by 0.
        predictions = np.zeros(rows, int) if trial % 3 == 0 else generator.integers(0, classes, rows)
        resamples = generator.integers(0, rows, size=(6, rows))
        for metric in CONFUSION_METRICS:
            if metric == "f1" and classes != 2:  # GLUE's F1 is the positive class's of a binary task
                continue
            fast = confusion_score(metric, classes)(references, predictions, resamples)
            slow = [METRICS[metric](predictions[sample], references[sample]) for sample in resamples]
            assert fast == pytest.approx(slow, abs=1e-12), metric


def test_accuracy_of_label_sets_counts_a_row_right_when_every_label_is():
    references = np.array([[1, 0], [0, 1], [1, 1]])
    predicted = np.array([[1, 0], [0, 0], [1, 1]])
    assert accuracy_score(references, predicted, np.array([[0, 1, 2], [1, 1, 1]])) == pytest.approx([2 / 3, 0.0])


def test_matching_runs_are_compared_by_the_paired_t_test():
    first = [0.80, 0.76, 0.83, 0.79]
    second = [0.84, 0.79, 0.85, 0.84]
    difference = paired_runs("accuracy", first, second)
    differences = [b - a for a, b in zip(first, second)]
    assert difference.difference == pytest.approx(statistics.fmean(differences))
    assert difference.p_value == pytest.approx(stats.ttest_rel(second, first).pvalue)
    assert difference.interval == pytest.approx(mean_interval(differences))
    assert difference.p_value < 0.05 and difference.test == "paired t-test over 4 matching runs"
    assert paired_runs("accuracy", first, first).p_value == 1.0
    assert paired_runs("accuracy", first, [value + 0.01 for value in first]).p_value == 0.0  # every pair alike
    one = paired_runs("accuracy", [0.8], [0.9])
    assert one.p_value is None and one.interval is None and one.verdict == "not tested"
