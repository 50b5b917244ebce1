"""Learning-rate schedules: pure functions of the step, checked against their formulas."""

from __future__ import annotations

import itertools
import math

import pytest

from finetune.recipes import ScheduleConfig
from finetune.training.schedules import (
    constant,
    linear_warmup_decay,
    make_momentum_schedule,
    make_schedule,
    one_cycle,
    one_cycle_momentum,
    slanted_triangular,
)

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
    assert all(a < b for a, b in itertools.pairwise(rising)), "STLR must rise strictly up to the cut"
    assert all(a > b for a, b in itertools.pairwise(falling)), "STLR must fall strictly after the cut"
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
    assert all(a < b for a, b in itertools.pairwise(values[: warmup + 1])), "warmup must rise"
    assert all(a > b for a, b in itertools.pairwise(values[warmup:])), "decay must fall"
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


# ---------------------------------------------------------------------------------------------
# one_cycle: fastai's fit_one_cycle
# ---------------------------------------------------------------------------------------------


def fastai_cosine(start: float, end: float, position: float) -> float:
    """fastai's SchedCos, written independently: start + (1 + cos(pi (1 - pos))) (end - start) / 2."""
    return start + (1 + math.cos(math.pi * (1 - position))) * (end - start) / 2


@pytest.mark.parametrize(
    ("total", "pct_start", "div", "final_div"), [(100, 0.25, 25.0, 1e5), (37, 0.3, 10.0, 1e4), (8, 0.5, 2.0, 100.0)]
)
def test_one_cycle_is_two_cosines(total, pct_start, div, final_div):
    rise = round(total * pct_start)
    for step in range(total):
        if step < rise:
            expected = fastai_cosine(1 / div, 1.0, step / rise)
        else:
            expected = fastai_cosine(1.0, 1 / final_div, (step - rise) / (total - rise))
        assert one_cycle(step, total, pct_start, div, final_div) == pytest.approx(expected, rel=1e-12), step
    values = [one_cycle(step, total, pct_start, div, final_div) for step in range(total + 1)]
    assert values[0] == pytest.approx(1 / div) and values[rise] == 1.0 and max(values) == 1.0
    assert values[total] == pytest.approx(1 / final_div)
    assert all(a < b for a, b in itertools.pairwise(values[: rise + 1]))
    assert all(a > b for a, b in itertools.pairwise(values[rise:]))


def test_one_cycle_momentum_mirrors_the_lr():
    total = 40
    betas = [one_cycle_momentum(step, total, 0.25, 0.95, 0.85) for step in range(total + 1)]
    assert betas[0] == pytest.approx(0.95) and betas[10] == pytest.approx(0.85) and betas[40] == pytest.approx(0.95)
    assert betas.index(min(betas)) == 10  # lowest momentum where the LR peaks
    assert betas[5] == pytest.approx(0.90)  # half-way down the first cosine


def test_momentum_schedule_only_for_one_cycle_with_momentum():
    assert make_momentum_schedule(ScheduleConfig(kind="stlr"), 10) is None
    assert make_momentum_schedule(ScheduleConfig(kind="one_cycle", momentum=None), 10) is None
    cycled = make_momentum_schedule(ScheduleConfig(kind="one_cycle", momentum=(0.9, 0.8), pct_start=0.5), 10)
    assert cycled(0) == pytest.approx(0.9) and cycled(5) == pytest.approx(0.8)
    lrs = make_schedule(ScheduleConfig(kind="one_cycle", div=10, final_div=1000), 20)
    assert lrs(0) == pytest.approx(0.1) and lrs(5) == 1.0 and lrs(20) == pytest.approx(1e-3)


def test_one_cycle_momentum_out_of_range_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="momentum"):
        ScheduleConfig(kind="one_cycle", momentum=(0.95, 1.2))


def test_a_one_cycle_run_sets_each_steps_lr_and_beta1(tmp_path, corpus_file, monkeypatch):
    """A pretrain run with one_cycle: the logged LRs follow the cosines, and beta1 is set before every step."""
    import finetune.training.optim as optim_module
    from finetune.recipes import load_recipe
    from finetune.run_dir import read_metrics
    from finetune.stages.pretrain import run_pretrain
    from tests.conftest import pretrain_recipe, write_yaml

    set_betas, seen = optim_module.set_first_moment_decay, []

    def recording(optimizer, beta1):
        set_betas(optimizer, beta1)
        seen.append({group["betas"][0] for group in optimizer.param_groups})

    monkeypatch.setattr(optim_module, "set_first_moment_decay", recording)
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    data["schedule"] = {"kind": "one_cycle", "pct_start": 0.3}
    data["training"]["log_every"] = 1
    run_pretrain(load_recipe(write_yaml(tmp_path / "recipe.yaml", data), expected_stage="pretrain"))
    total, peak = data["training"]["max_steps"], data["training"]["lr"]
    assert all(len(betas) == 1 for betas in seen)  # every group gets the same beta1
    assert [betas.pop() for betas in seen] == pytest.approx(
        [one_cycle_momentum(step, total, 0.3) for step in range(total)]
    )
    train = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "train"]
    assert [record["step"] for record in train] == list(range(1, total + 1))
    for record in train:
        assert record["lr"]["group_0"] == pytest.approx(peak * one_cycle(record["step"] - 1, total, 0.3))
