"""Temperature scaling and the measures of calibration (finetune/inference/calibration.py), on numbers worked by
hand and on logits drawn from a model that is calibrated by construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune.inference.calibration import (
    BINS,
    TEMPERATURE_BOUNDS,
    at_a_bound,
    brier_score,
    calibrated_probabilities,
    calibration_record,
    confidence_bins,
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
    reliability,
    temperature_of,
)

# Four rows of three classes, no confidence on a bin edge (m / 15): rows 1 and 3 share bin 10, (10/15, 11/15].
PROBABILITIES = np.array([[0.7, 0.2, 0.1], [0.3, 0.62, 0.08], [0.72, 0.18, 0.10], [0.25, 0.33, 0.42]])
LABELS = np.array([0, 0, 1, 1])  # right, wrong (says 1), wrong (says 0), wrong (says 2)


def calibrated_sample(rows: int = 20_000, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels drawn from softmax(logits): a model whose probabilities are right by construction."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (rows, classes))
    cumulative = calibrated_probabilities(logits).cumsum(axis=1)
    labels = (rng.random((rows, 1)) > cumulative).sum(axis=1)
    return logits, labels


def test_ece_and_brier_of_four_rows_worked_by_hand():
    assert confidence_bins(PROBABILITIES).tolist() == [10, 9, 10, 6]
    # bin 10: rows 1 and 3, accuracy 1/2, confidence (0.7 + 0.72) / 2; bin 9: row 2 (0.62, wrong); bin 6: row 4
    expected_ece = 2 / 4 * abs(0.5 - 0.71) + 1 / 4 * abs(0 - 0.62) + 1 / 4 * abs(0 - 0.42)
    assert expected_calibration_error(PROBABILITIES, LABELS) == pytest.approx(expected_ece) == pytest.approx(0.365)
    rows = [
        (0.7 - 1) ** 2 + 0.2**2 + 0.1**2,
        (0.3 - 1) ** 2 + 0.62**2 + 0.08**2,
        0.72**2 + (0.18 - 1) ** 2 + 0.10**2,
        0.25**2 + (0.33 - 1) ** 2 + 0.42**2,
    ]
    assert brier_score(PROBABILITIES, LABELS) == pytest.approx(sum(rows) / 4) == pytest.approx(0.72735)
    table = reliability(PROBABILITIES, LABELS)
    assert sum(table["rows"]) == 4 and len(table["rows"]) == BINS
    assert table["confidence"][10] == pytest.approx(0.71) and table["accuracy"][10] == 0.5
    assert table["confidence"][0] is None and table["accuracy"][0] is None  # an empty bin


def test_a_confidence_on_a_bin_edge_falls_in_the_lower_bin():
    # Guo et al.'s bins are (m/M, (m+1)/M]: a confidence of exactly 1 is in the last bin, 0.5 in (7/15, 8/15].
    edges = np.array([[1.0, 0.0], [0.5, 0.5]])
    assert confidence_bins(edges).tolist() == [14, 7]


def test_temperature_one_leaves_the_softmax_as_it_is():
    logits = np.random.default_rng(1).normal(0, 3, (50, 5)).astype(np.float32)
    expected = torch.softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    np.testing.assert_allclose(calibrated_probabilities(logits, 1.0), expected, rtol=1e-12, atol=1e-15)
    record = calibration_record("none", logits, np.arange(50) % 5)
    assert record["temperature"] == 1.0
    assert record["dev"]["ece_after"] == record["dev"]["ece_before"]
    assert record["dev"]["brier_after"] == record["dev"]["brier_before"]
    assert record["dev"]["nll_after"] == record["dev"]["nll_before"]


def test_the_fit_recovers_the_temperature_of_an_over_confident_model():
    logits, labels = calibrated_sample()
    assert fit_temperature(logits, labels) == pytest.approx(1.0, abs=0.05)  # calibrated already: about 1
    # The same model made over-confident (logits x 2.5): the fit divides it back; the fit scales with the logits.
    recovered = fit_temperature(2.5 * logits, labels)
    assert recovered == pytest.approx(2.5, rel=0.05)
    assert recovered == pytest.approx(2.5 * fit_temperature(logits, labels), rel=1e-5)
    assert fit_temperature(logits / 2, labels) == pytest.approx(0.5, rel=0.05)  # under-confident: T below 1
    # The fitted T minimises the likelihood, and is found again the same (deterministic).
    nll = negative_log_likelihood(2.5 * logits, labels, recovered)
    assert nll < negative_log_likelihood(2.5 * logits, labels, recovered * 1.01)
    assert nll < negative_log_likelihood(2.5 * logits, labels, recovered / 1.01)
    assert fit_temperature(2.5 * logits, labels) == recovered


def test_the_record_shows_scaling_fixing_the_over_confident_model():
    logits, labels = calibrated_sample(rows=5_000)
    record = calibration_record("temperature", 2.5 * logits, labels)
    dev = record["dev"]
    assert record["method"] == "temperature" and record["bins"] == BINS and record["rows"] == 5_000
    assert dev["ece_after"] < dev["ece_before"] / 3 and dev["ece_after"] < 0.03
    assert dev["nll_after"] < dev["nll_before"] and dev["brier_after"] < dev["brier_before"]
    # The labels are the argmax either way: the accuracy of every bin's rows is unchanged in total.
    before, after = record["reliability"]["before"], record["reliability"]["after"]
    right = [sum((a or 0) * n for a, n in zip(table["accuracy"], table["rows"])) for table in (before, after)]
    assert right[0] == pytest.approx(right[1])


def test_a_dev_set_the_model_gets_all_right_stops_at_the_lower_bound():
    logits = np.array([[3.0, -1.0], [-2.0, 2.5], [4.0, 0.0]])
    temperature = fit_temperature(logits, np.array([0, 1, 0]))
    assert temperature == pytest.approx(TEMPERATURE_BOUNDS[0], rel=1e-3) and at_a_bound(temperature)
    assert not at_a_bound(1.5)


def test_the_temperature_of_a_config():
    class Config:
        pass

    config = Config()
    assert temperature_of(config) == 1.0  # a checkpoint from before calibration, or calibration: none
    for value, expected in ((1.7, 1.7), (2, 2.0), (0, 1.0), (-1.0, 1.0), (True, 1.0), ("2", 1.0)):
        config.calibration_temperature = value
        assert temperature_of(config) == expected
