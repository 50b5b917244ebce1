"""A diverged run stops in one line before anything is saved as its result: a validation loss far above the
first one, or not finite (the training loss's nan is tests/cli/test_run_failures.py's)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.kinds.classification import fine_tuning as stage_module
from finetune.stages import pretrain as pretrain_module
from finetune.stages.finetune import RESULT_FILE
from finetune.training.checkpoints import training_checkpoints
from finetune.training.divergence import ValidationWatch, divergence_threshold
from finetune.training.state import TrainingState, read_training_state
from tests.conftest import finetune_recipe, write_task, write_yaml

runner = CliRunner()


def error_line(output: str) -> str:
    """The single `error:` line of a failed run, with no traceback."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


def test_the_threshold_is_a_factor_of_the_first_loss_and_at_least_one_more():
    assert divergence_threshold(2.0, 10) == 20.0
    assert divergence_threshold(0.02, 10) == pytest.approx(1.02)  # an easy task's small first loss may overfit a bit


def test_the_watch_takes_the_first_finite_loss_as_the_start_and_flags_a_rise_past_it_or_a_nan():
    watch = ValidationWatch(10.0)
    assert watch.problem({"dev_accuracy": 0.5}, 1) is None  # no loss in the record: nothing to follow
    assert watch.problem({"validation_loss": 0.7}, 3) is None
    assert watch.problem({"validation_loss": 6.9}, 6) is None  # under 10 x 0.7
    what, rising = watch.problem({"validation_loss": 7.1}, 9)
    assert rising and what == (
        "the validation loss rose to 7.1 at step 9, past training.divergence_factor 10 x the first evaluation's 0.7 "
        "(step 3)"
    )
    what, rising = watch.problem({"validation_loss": math.nan}, 12)
    assert not rising and what == "the validation loss was not finite (nan) at step 12"
    never = ValidationWatch(None)  # divergence_factor: null, or lr-find's range test
    assert never.problem({"validation_loss": 1.0}, 1) is None and never.problem({"validation_loss": 1e9}, 2) is None
    assert never.problem({"validation_loss": math.inf}, 3) is not None  # a non-finite loss always stops


def test_the_first_evaluation_travels_with_a_checkpoint(tmp_path):
    watch = ValidationWatch(10.0)
    watch.problem({"validation_loss": 0.5}, 4)
    TrainingState(step=8, first_evaluation=watch.record()).write(tmp_path, 0, main_process=True)
    resumed = ValidationWatch(10.0)
    resumed.continue_from(read_training_state(tmp_path, 0, "cpu").first_evaluation)
    assert resumed.first == (4, 0.5)
    assert resumed.problem({"validation_loss": 6.0}, 12) is not None  # judged against the run's first, not 6.0


@pytest.fixture(scope="module")
def task_and_model(tmp_path_factory, pretrained) -> tuple[Path, Path]:
    return write_task(tmp_path_factory.mktemp("task")), pretrained


def recipe_file(task_and_model, tmp_path: Path, **extra) -> Path:
    """The tiny finetune recipe: 3 epochs of 5 steps, an evaluation every step or as `extra` says."""
    task, model = task_and_model
    data = finetune_recipe(model, task, tmp_path / "run")
    data["training"]["epochs"] = 3
    data.update({"eval_every": 1, **extra})
    return write_yaml(tmp_path / "recipe.yaml", data)


def test_an_absurd_learning_rate_stops_the_finetune_run_naming_the_step_and_the_lr(task_and_model, tmp_path):
    result = runner.invoke(app, ["finetune", str(recipe_file(task_and_model, tmp_path)), "training.lr=50"])
    assert result.exit_code == 1
    message = error_line(result.output)
    assert message.startswith("error: training diverged: the validation loss rose to ")
    assert "past training.divergence_factor 10 x the first evaluation's" in message
    assert "lower training.lr (now 50)" in message and "no checkpoint was saved before it" in message
    run = tmp_path / "run"
    assert not (run / "checkpoint").exists() and not (run / RESULT_FILE).exists()
    assert not (run / "timing.json").exists()


def test_a_nan_validation_loss_removes_the_checkpoint_of_its_step_and_names_the_good_one(
    task_and_model, tmp_path, monkeypatch
):
    # Checkpoints every 5 steps are saved at epoch ends, before the epoch's evaluation: the one of step 10 holds
    # the weights whose evaluation comes out nan, so it goes; step 5's stays and the message names it.
    logits_loss, calls = stage_module.logits_loss, []

    def nan_from_the_second_evaluation(*arguments):
        calls.append(1)
        return logits_loss(*arguments) if len(calls) < 2 else math.nan

    monkeypatch.setattr(stage_module, "logits_loss", nan_from_the_second_evaluation)
    path = recipe_file(task_and_model, tmp_path, eval_every=None, checkpoint_every=5, keep_checkpoints=2)
    result = runner.invoke(app, ["finetune", str(path)])
    assert result.exit_code == 1
    checkpoints = tmp_path / "run" / "checkpoints"
    assert error_line(result.output).startswith(
        "error: training diverged: the validation loss was not finite (nan) at step 10; the run stopped without "
        f"saving these weights (the last good checkpoint is {checkpoints / 'step-00000005'}) - lower training.lr "
        "(now 0.002)"
    )
    assert training_checkpoints(checkpoints) == [checkpoints / "step-00000005"]
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / RESULT_FILE).exists()


def test_a_nan_validation_loss_stops_pretraining_before_the_final_checkpoint(
    tmp_path, pretrain_recipe_data, write_recipe, monkeypatch
):
    validation_metrics = pretrain_module.validation_metrics

    def nan_loss(*arguments, **keywords):
        return {**validation_metrics(*arguments, **keywords), "validation_loss": math.nan}

    monkeypatch.setattr(pretrain_module, "validation_metrics", nan_loss)
    result = runner.invoke(app, ["pretrain", str(write_recipe(pretrain_recipe_data))])
    assert result.exit_code == 1
    assert error_line(result.output).startswith(
        "error: training diverged: the validation loss was not finite (nan) at step 10; "
    )
    run = Path(pretrain_recipe_data["run_dir"])
    assert not (run / "checkpoint").exists() and not (run / "timing.json").exists()
