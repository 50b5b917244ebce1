"""`training.max_steps` is the run's length in optimizer steps whatever `training.epochs` says, as in the Trainer:
the data repeats, the epoch counter goes on, and the LR schedule and unfreezing are fitted to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.finetune import run_finetune
from finetune.training.schedules import linear_warmup_decay, slanted_triangular
from tests.conftest import finetune_recipe, pretrain_recipe, write_yaml
from tests.stages.test_ulmfit_flow import ulmfit_recipe
from tests.training.test_resume_finetune import Stopped, assert_same_run, stop_after_checkpoint

runner = CliRunner()
STEPS_PER_EPOCH = 5  # the generated task's 40 training rows in batches of 8


def records(run_dir: Path, phase: str) -> list[dict]:
    return [record for record in read_metrics(run_dir / "metrics.jsonl") if record["phase"] == phase]


def three_epochs_by_steps(checkpoint: Path, task: Path, run_dir: Path) -> dict:
    """A fine-tuning recipe of 1 epoch by `epochs` but 12 steps by `max_steps`: 2.4 passes over the data."""
    data = finetune_recipe(checkpoint, task, run_dir)
    data["training"].update({"epochs": 1, "max_steps": 12})
    return data


def test_finetune_runs_max_steps_past_the_epochs_with_the_schedule_fitted(pretrained, task_dir, tmp_path):
    data = three_epochs_by_steps(pretrained, task_dir, tmp_path / "run")
    run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    train = records(tmp_path / "run", "train")
    assert [record["step"] for record in train] == list(range(1, 13))
    assert {record["epoch"] for record in train} == {0, 1, 2}  # the data repeated, the epoch counter went on
    assert sum(record["epoch"] == 2 for record in train) == 12 - 2 * STEPS_PER_EPOCH
    # STLR over 12 steps (not 5): each logged LR is the top group's lr x the schedule at the step before it.
    top = max(train[0]["lr"], key=train[0]["lr"].get)  # the top group: the highest LR under discriminative LRs
    for record in train:
        expected = 2e-3 * slanted_triangular(record["step"] - 1, 12, 0.1, 32)
        assert record["lr"][top] == pytest.approx(expected, rel=1e-6)
    # Per-epoch unfreezing goes on with the epochs: one more group at each of the three epochs.
    assert [record["trainable_groups"] for record in records(tmp_path / "run", "unfreeze")] == [1, 2, 3]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["last_step"] == 12


def test_max_steps_within_an_epoch_still_stops_early(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data["training"].update({"epochs": 3, "max_steps": 3})
    run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    assert [record["step"] for record in records(tmp_path / "run", "train")] == [1, 2, 3]


def test_resume_inside_a_repeated_epoch_is_exact(pretrained, task_dir, tmp_path, monkeypatch):
    """Stopped at step 8 (the second pass over the data) and resumed: the uninterrupted 12-step run, bit for bit."""
    extra = {"checkpoint_every": 4, "eval_every": 3}
    full = {**three_epochs_by_steps(pretrained, task_dir, tmp_path / "full"), **extra}
    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", full)))
    resumed = {**three_epochs_by_steps(pretrained, task_dir, tmp_path / "resumed"), **extra}
    recipe_path = write_yaml(tmp_path / "resumed.yaml", resumed)
    stop_after_checkpoint(monkeypatch, 8)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(recipe_path))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(recipe_path), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")


def test_pretrain_runs_max_steps_past_the_epochs_and_profile_agrees(tmp_path, corpus_file):
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    data["training"].update({"epochs": 1, "max_steps": 30})  # the 200-line corpus gives ~10 steps an epoch
    data["schedule"] = {"kind": "linear", "warmup_fraction": 0.1}
    recipe_path = write_yaml(tmp_path / "recipe.yaml", data)
    profiled = runner.invoke(app, ["profile", str(recipe_path), "--matmul-gflops", "100", "--json"])
    assert profiled.exit_code == 0, profiled.output
    assert json.loads(profiled.stdout)["compute"]["steps"] == 30

    result = runner.invoke(app, ["pretrain", str(recipe_path)])
    assert result.exit_code == 0, result.output
    train = records(tmp_path / "run", "train")
    assert train[-1]["step"] == 30
    epochs = {record["epoch"] for record in train}
    assert len(epochs) >= 3, epochs  # one evaluation at the end of each pass, the last one cut by the budget
    assert len(records(tmp_path / "run", "eval")) == len(epochs)
    # The linear schedule decays over all 30 steps: the last logged LR is the last step's, not an epoch's end.
    assert max(train[-1]["lr"].values()) == pytest.approx(1e-3 * linear_warmup_decay(29, 30, 0.1), rel=1e-6)


def test_every_ulmfit_stage_runs_its_max_steps(tmp_path, corpus_file, task_dir):
    data = ulmfit_recipe(corpus_file, task_dir, tmp_path / "flow")
    data["general_lm"]["training"]["max_steps"] = 25  # past one epoch of the 200-line corpus
    data["target_lm"]["training"]["max_steps"] = 9
    data["classifier"]["training"].update({"epochs": 1, "max_steps": 7})
    result = runner.invoke(app, ["ulmfit", str(write_yaml(tmp_path / "flow.yaml", data))])
    assert result.exit_code == 0, result.output
    for folder, steps in (("1-general-lm", 25), ("2-target-lm", 9), ("3-classifier", 7)):
        train = records(tmp_path / "flow" / folder, "train")
        assert train[-1]["step"] == steps, folder
    assert {record["epoch"] for record in records(tmp_path / "flow" / "1-general-lm", "train")} != {0}
    assert {record["epoch"] for record in records(tmp_path / "flow" / "3-classifier", "train")} == {0, 1}
