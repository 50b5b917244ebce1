"""`finetune lr-find`: the LR range test on a recipe's own stage, its smoothing, divergence cut and suggestions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import RunFailed
from finetune.run_dir import read_metrics
from finetune.stages.lr_find import smoothed, suggestions
from finetune.training.schedules import exponential_range
from tests.conftest import eval_recipe, finetune_recipe, pretrain_recipe, save_tiny_masked_lm, write_yaml

runner = CliRunner()


def test_exponential_range_grows_by_one_factor_from_the_start_to_the_peak():
    values = [exponential_range(step, 9, 1e8) for step in range(9)]
    assert values[0] == pytest.approx(1e-8) and values[-1] == pytest.approx(1.0)
    assert np.diff(np.log10(values)) == pytest.approx([1.0] * 8)  # 10x per step: 1e-8 ... 1 in 8 steps
    assert exponential_range(20, 9, 1e8) == pytest.approx(1.0)  # never past the peak


def test_smoothing_is_a_centred_moving_average_that_does_not_lag():
    losses = [float(value) for value in range(40)]  # 40 steps: a window of 4 -> 5 (2 on each side)
    result = smoothed(losses)
    assert result[10] == pytest.approx(10.0) and result[20] == pytest.approx(20.0)  # a line is kept: no lag
    assert result[0] == pytest.approx(1.0) and result[39] == pytest.approx(38.0)  # (0+1+2)/3, (37+38+39)/3
    assert smoothed([5.0, 1.0, 5.0, 1.0, 5.0]) == pytest.approx([3.0, 11 / 3, 7 / 3, 11 / 3, 3.0])
    spike = [1.0] * 30
    spike[15] = 10.0
    assert max(smoothed(spike)) == pytest.approx(1 + 9 / 3)  # 30 steps: window 3


def synthetic_curve(steps: int = 200):
    """A loss falling to its minimum at LR 1e-2 (steepest near 1e-3.5), then blowing up past 1."""
    lrs = list(np.logspace(-7, 1, steps))
    losses = [
        3.0 - 2.0 / (1 + math.exp(-2.5 * (math.log10(lr) + 3.5))) + 4.0 * max(0.0, math.log10(lr) + 2) ** 2
        for lr in lrs
    ]
    return lrs, losses


def test_suggestions_on_a_known_curve():
    lrs, losses = synthetic_curve()
    result = suggestions(lrs, losses)
    smooth = smoothed(losses)
    lowest = int(np.argmin(smooth[: len(result["lrs"])]))
    assert result["minimum"]["lr"] == pytest.approx(lrs[lowest])
    assert 10**-2.3 < result["minimum"]["lr"] < 10**-1.7  # the minimum of the curve: 1e-2
    assert result["suggested_lr"] == pytest.approx(result["minimum"]["lr"] / 10)
    assert 10**-3.8 < result["steepest"]["lr"] < 10**-3.2  # the sigmoid's steepest point: 10^-3.5
    assert result["steepest"]["lr"] < result["minimum"]["lr"]
    # Cut where the smoothed loss passes 4x its minimum: nothing after it, and the cut is recorded.
    assert max(result["smoothed"]) <= 4 * min(result["smoothed"]) and len(result["lrs"]) < len(lrs)
    assert result["diverged_at_lr"] == pytest.approx(lrs[len(result["lrs"])])
    assert smooth[len(result["lrs"])] > 4 * min(smooth[: len(result["lrs"]) + 1])


def test_a_non_finite_loss_ends_the_curve():
    lrs, losses = synthetic_curve()
    losses[120] = float("nan")
    result = suggestions(lrs, losses)
    assert len(result["lrs"]) <= 120 and all(math.isfinite(value) for value in result["smoothed"])


def test_too_few_steps_before_divergence_is_a_failed_run():
    with pytest.raises(RunFailed, match="too few"):
        suggestions([1e-3, 1e-2, 1e-1], [1.0, 2.0, float("inf")])


def test_lr_find_on_a_finetune_recipe(tmp_path, task_dir):
    checkpoint = save_tiny_masked_lm(tmp_path / "lm")
    data = finetune_recipe(checkpoint, task_dir, tmp_path / "runs" / "ft")
    recipe = write_yaml(tmp_path / "recipe.yaml", data)
    result = runner.invoke(
        app,
        ["lr-find", str(recipe), "--steps", "12", "--start-lr", "1e-5", "--end-lr", "1", "discriminative.factor=2.0"],
    )
    assert result.exit_code == 0, result.output
    folder = tmp_path / "runs" / "ft-lr-find"
    assert not (tmp_path / "runs" / "ft").exists()  # the real run's folder stays free
    assert not (folder / "checkpoint").exists()  # no model kept, and none said to be
    assert "saved to" not in result.output, result.output
    assert (folder / "lr_find.png").stat().st_size > 0 and "suggested" in (folder / "lr_find.md").read_text()
    saved = json.loads((folder / "lr_find.json").read_text())
    train = [record for record in read_metrics(folder / "metrics.jsonl") if record["phase"] == "train"]
    assert len(train) == 12
    top = [record["lr"]["group_3"] for record in train]  # 4 groups: embeddings, 2 blocks, head
    assert top == pytest.approx(list(np.logspace(-5, 0, 12)))
    assert [record["lr"]["group_2"] for record in train] == pytest.approx([lr / 2 for lr in top])
    assert saved["suggested_lr"] == pytest.approx(saved["minimum"]["lr"] / 10)
    assert saved["lrs"] == pytest.approx(top[: len(saved["lrs"])])
    assert "training.lr=" in result.output
    again = runner.invoke(app, ["lr-find", str(recipe), "--steps", "6", "--start-lr", "1e-5", "--end-lr", "1"])
    assert again.exit_code == 0, again.output  # a second test replaces the first
    assert len(json.loads((folder / "lr_find.json").read_text())["losses"]) <= 6


def test_lr_find_on_a_pretrain_recipe(tmp_path, corpus_file):
    data = pretrain_recipe(corpus_file, tmp_path / "runs" / "lm")
    recipe = write_yaml(tmp_path / "recipe.yaml", data)
    result = runner.invoke(app, ["lr-find", str(recipe), "--steps", "8"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "runs" / "lm-lr-find" / "lr_find.json").read_text())
    assert saved["lrs"][0] == pytest.approx(1e-7) and 5 <= len(saved["lrs"]) <= 8


def test_lr_find_refuses_other_recipes_and_bad_ranges(tmp_path, task_dir):
    recipe = write_yaml(tmp_path / "eval.yaml", eval_recipe(task_dir, tmp_path / "ev", {"m": str(tmp_path)}))
    result = runner.invoke(app, ["lr-find", str(recipe)])
    assert result.exit_code == 2 and "takes a pretrain or finetune recipe; this one's stage is 'eval'" in result.output
    assert len(result.output.strip().splitlines()) == 1
    checkpoint = save_tiny_masked_lm(tmp_path / "lm")
    recipe = write_yaml(tmp_path / "ft.yaml", finetune_recipe(checkpoint, task_dir, tmp_path / "ft"))
    result = runner.invoke(app, ["lr-find", str(recipe), "--start-lr", "1", "--end-lr", "0.1"])
    assert result.exit_code == 2 and "--start-lr" in result.output
