"""Probabilities that mean what they say: temperature scaling (Guo et al. 2017, "On calibration of modern neural
networks") fitted on dev, and the measures of calibration before and after.

Modern networks are over-confident: their softmax says 0.99 where they are right 9 times in 10. Dividing the logits
by one scalar T > 0, fitted to minimise the dev negative log-likelihood, fixes most of it and changes no prediction
(the argmax of logits / T is the argmax of the logits). Everything here is a pure function of logits (examples x
classes) and class indices; the fine-tuning stage records the result (kinds/calibration.py), the checkpoint's
config.json keeps T (`TEMPERATURE_KEY`, models/heads.py) and the predictors divide by it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from finetune.models.heads import TEMPERATURE_KEY

BINS = 15  # equal-width confidence bins of the expected calibration error, as in Guo et al. 2017
# Where the fit looks for T: far beyond what a trained classifier needs (Guo et al. report 1 to 3), and bounded, so
# that a dev set the model gets entirely right (whose likelihood grows without end as T falls) gives a finite T.
TEMPERATURE_BOUNDS = (0.05, 20.0)


def calibrated_probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature) per row, in float64."""
    return np.exp(log_softmax(np.asarray(logits, dtype=np.float64) / temperature, axis=-1))


def negative_log_likelihood(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """The mean over rows of -log softmax(logits / temperature)[label].

    Per row log(sum_k exp(d_k)), d = (logits - the label's logit) / temperature, written as top + log1p(the other
    terms) so that a label far ahead keeps its tiny loss instead of rounding it to 0 (the fit then still sees which
    of two sharp temperatures is better).
    """
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    rows = np.arange(len(labels))
    gaps = scaled - scaled[rows, np.asarray(labels, dtype=np.int64)][:, None]
    top = gaps.max(axis=-1, keepdims=True)
    terms = np.exp(gaps - top)
    terms[rows, gaps.argmax(axis=-1)] = 0.0  # the top term, exp(0) = 1, is the 1 of log1p
    return float((top[:, 0] + np.log1p(terms.sum(axis=-1))).mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T in TEMPERATURE_BOUNDS that minimises the negative log-likelihood of softmax(logits / T).

    Searched over log T by bounded Brent (deterministic; the likelihood is convex in 1 / T, so it has one minimum).
    """
    lowest, highest = (math.log(bound) for bound in TEMPERATURE_BOUNDS)
    found = minimize_scalar(
        lambda log_temperature: negative_log_likelihood(logits, labels, math.exp(log_temperature)),
        bounds=(lowest, highest),
        method="bounded",
        options={"xatol": 1e-7},
    )
    return math.exp(float(found.x))


def at_a_bound(temperature: float) -> bool:
    """Whether the fit stopped at an end of TEMPERATURE_BOUNDS (a dev set too small, or entirely right)."""
    return any(math.isclose(temperature, bound, rel_tol=1e-4) for bound in TEMPERATURE_BOUNDS)


def confidence_bins(probabilities: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Each row's bin of its top probability (its confidence): bin m holds (m / bins, (m + 1) / bins]."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    return np.clip(np.digitize(probabilities.max(axis=-1), edges[1:-1], right=True), 0, bins - 1)


def reliability(probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> dict[str, list]:
    """Per confidence bin: its rows, their mean confidence and their accuracy (None for an empty bin)."""
    which = confidence_bins(probabilities, bins)
    confidence = probabilities.max(axis=-1)
    right = probabilities.argmax(axis=-1) == np.asarray(labels)
    table: dict[str, list] = {"rows": [], "confidence": [], "accuracy": []}
    for index in range(bins):
        members = which == index
        count = int(members.sum())
        table["rows"].append(count)
        table["confidence"].append(float(confidence[members].mean()) if count else None)
        table["accuracy"].append(float(right[members].mean()) if count else None)
    return table


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> float:
    """Guo et al.'s ECE: over equal-width bins of the top probability, the rows' share times |accuracy - mean
    confidence|."""
    table = reliability(probabilities, labels, bins)
    total = len(labels)
    return float(
        sum(
            count / total * abs(accuracy - confidence)
            for count, accuracy, confidence in zip(table["rows"], table["accuracy"], table["confidence"])
            if count
        )
    )


def brier_score(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """The multi-class Brier score: the mean over rows of the sum over classes of (probability - one-hot)^2."""
    targets = np.zeros_like(probabilities)
    targets[np.arange(len(labels)), np.asarray(labels, dtype=np.int64)] = 1.0
    return float(((probabilities - targets) ** 2).sum(axis=-1).mean())


def calibration_record(method: str, logits: np.ndarray, labels: np.ndarray) -> dict:
    """What result.json keeps: the method, T (1.0 without one), dev ECE, Brier score and NLL before and after, the
    bins and rows, and the reliability table before and after (RUN_DIR/plots/reliability.png draws it)."""
    temperature = fit_temperature(logits, labels) if method == "temperature" else 1.0
    before, after = calibrated_probabilities(logits), calibrated_probabilities(logits, temperature)
    return {
        "method": method,
        "temperature": temperature,
        "dev": {
            "ece_before": expected_calibration_error(before, labels),
            "ece_after": expected_calibration_error(after, labels),
            "brier_before": brier_score(before, labels),
            "brier_after": brier_score(after, labels),
            "nll_before": negative_log_likelihood(logits, labels),
            "nll_after": negative_log_likelihood(logits, labels, temperature),
        },
        "bins": BINS,
        "rows": len(labels),
        "reliability": {"before": reliability(before, labels), "after": reliability(after, labels)},
    }


def temperature_of(config) -> float:
    """The temperature a classifier's config keeps (1.0: none, or a checkpoint from before calibration)."""
    value = getattr(config, TEMPERATURE_KEY, None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 1.0
