"""bench/pass_cost.py without a model: the fit of a pass's fixed and per-position cost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import pass_cost as bench  # noqa: E402  (bench/ scripts are top-level modules, imported as they import each other)


def test_the_fit_recovers_the_costs_that_made_the_times():
    seconds = {
        (size, length): 0.026 + 0.00036 * size * length + 1.2e-6 * size * length * length
        for size in bench.SIZES
        for length in bench.LENGTHS
    }
    fixed, per_position, per_square = bench.fit_pass_cost(seconds)
    assert fixed == pytest.approx(0.026) and per_position == pytest.approx(0.00036)
    assert per_square == pytest.approx(1.2e-6)
