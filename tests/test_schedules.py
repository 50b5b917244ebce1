"""Learning-rate schedules: pure functions of the step, checked against their formulas."""

from __future__ import annotations

import math

import pytest

from finetune.recipes import ScheduleConfig
from finetune.training.schedules import constant, linear_warmup_decay, make_schedule, slanted_triangular

STLR_CASES = [(100, 0.1, 32.0), (1000, 0.2, 10.0), (37, 0.3, 5.0), (10, 0.5, 2.0), (250, 0.06, 100.0)]


def stlr_reference(t: int, total: int, cut_frac: float, ratio: float) -> float:
    """Howard & Ruder (2018), eq. 3, written independently of the package."""
    cut = math.floor(total * cut_frac)
    p = t / cut if t < cut else 1 - (t - cut) / (total - cut)
    return (1 + p * (ratio - 1)) / ratio


@pytest.mark.parametrize(("total", "cut_frac", "ratio"), STLR_CASES)
def test_stlr_matches_the_formula(total, cut_frac, ratio):
    for t in range(total + 1):
        assert slanted_triangular(t, total, cut_frac, ratio) == pytest.approx(
            stlr_reference(t, total, cut_frac, ratio), rel=1e-12, abs=1e-12
        ), f"step {t}"


@pytest.mark.parametrize(("total", "cut_frac", "ratio"), STLR_CASES)
def test_stlr_shape(total, cut_frac, ratio):
    cut = math.floor(total * cut_frac)
    values = [slanted_triangular(t, total, cut_frac, ratio) for t in range(total + 1)]
    assert values[0] == pytest.approx(1 / ratio)
    assert values[cut] == pytest.approx(1.0)
    assert max(values) == pytest.approx(1.0)
    assert values.index(max(values)) == cut
    assert values[total] == pytest.approx(1 / ratio)
    rising, falling = values[: cut + 1], values[cut:]
    assert all(a < b for a, b in zip(rising, rising[1:])), "STLR must rise strictly up to the cut"
    assert all(a > b for a, b in zip(falling, falling[1:])), "STLR must fall strictly after the cut"
    assert min(values) >= 1 / ratio - 1e-12


def test_stlr_paper_defaults():
    # T=1000, cut_frac=0.1, ratio=32: peak at step 100, 1/32 at both ends, half-way down at step 550.
    assert slanted_triangular(100, 1000) == 1.0
    assert slanted_triangular(0, 1000) == pytest.approx(1 / 32)
    assert slanted_triangular(50, 1000) == pytest.approx((1 + 0.5 * 31) / 32)
    assert slanted_triangular(550, 1000) == pytest.approx((1 + 0.5 * 31) / 32)


def test_stlr_ratio_one_is_constant():
    assert {slanted_triangular(t, 50, 0.2, 1.0) for t in range(51)} == {1.0}


def test_stlr_never_below_the_floor_after_the_end():
    assert slanted_triangular(120, 100, 0.1, 32.0) == pytest.approx(1 / 32)


def test_linear_warmup_decay():
    total, fraction = 100, 0.1
    warmup = 10
    values = [linear_warmup_decay(t, total, fraction) for t in range(total + 1)]
    assert values[warmup] == pytest.approx(1.0)
    assert max(values) == pytest.approx(1.0)
    assert all(a < b for a, b in zip(values[: warmup + 1], values[1 : warmup + 1])), "warmup must rise"
    assert all(a > b for a, b in zip(values[warmup:], values[warmup + 1 :])), "decay must fall"
    assert 0 < values[0] < 0.2
    assert values[total] == 0.0
    assert values[55] == pytest.approx((total - 55) / (total - warmup))
    assert linear_warmup_decay(total + 5, total, fraction) == 0.0  # never negative


def test_linear_without_warmup_starts_at_the_peak():
    assert linear_warmup_decay(0, 20, 0.0) == 1.0
    assert linear_warmup_decay(10, 20, 0.0) == pytest.approx(0.5)


def test_constant():
    assert [constant(t, 10) for t in range(12)] == [1.0] * 12


def test_make_schedule_stlr():
    schedule = make_schedule(ScheduleConfig(kind="stlr", cut_frac=0.2, ratio=8), 50)
    assert [schedule(t) for t in range(51)] == [slanted_triangular(t, 50, 0.2, 8) for t in range(51)]
    assert schedule(10) == 1.0 and schedule(0) == pytest.approx(1 / 8)


def test_make_schedule_linear():
    schedule = make_schedule(ScheduleConfig(kind="linear", warmup_fraction=0.25), 40)
    assert [schedule(t) for t in range(41)] == [linear_warmup_decay(t, 40, 0.25) for t in range(41)]
    assert schedule(10) == 1.0 and schedule(40) == 0.0


def test_make_schedule_constant():
    schedule = make_schedule(ScheduleConfig(kind="constant"), 40)
    assert {schedule(t) for t in range(41)} == {1.0}


def test_schedule_config_defaults_to_stlr():
    config = ScheduleConfig()
    assert (config.kind, config.cut_frac, config.ratio) == ("stlr", 0.1, 32.0)
