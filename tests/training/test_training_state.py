"""The typed training state (training/state.py): written and read in one place, with a format version; a
checkpoint of the older format resumes exactly, one of a newer format is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from finetune.training.checkpoints import TRAINING_STATE_DIR, latest_training_checkpoint
from finetune.training.state import PROGRESS_FILE, STATE_FORMAT, BestSoFar, TrainingState, read_training_state
from tests.conftest import write_yaml
from tests.training.test_resume_finetune import Stopped, assert_same_run, resumable_recipe, stop_after_checkpoint

runner = CliRunner()


def written_and_read(state: TrainingState, folder: Path) -> TrainingState:
    folder.mkdir(parents=True, exist_ok=True)
    state.write(folder, process_index=0, main_process=True)
    return read_training_state(folder, 0, "cpu")


def test_a_state_reads_back_as_it_was_written(tmp_path):
    best = BestSoFar("dev_accuracy", patience=2)
    best.update({"dev_accuracy": 0.5}, 3)
    best.update({"dev_accuracy": 0.4}, 6)
    state = TrainingState(
        step=8,
        epoch=1,
        batches_in_epoch=3,
        metrics_lines=12,
        window_items=96,
        window_seconds=1.5,
        training_seconds=42.0,
        last_evaluated_step=6,
        best=best.record(),
        running_sums=torch.tensor([1.0, 2.0, 3.0, 4.0]),
        carried={"memory_0": torch.ones(2, 3)},
    )
    read = written_and_read(state, tmp_path / "training_state")
    assert torch.equal(read.running_sums, state.running_sums) and read.carried.keys() == {"memory_0"}
    assert torch.equal(read.carried["memory_0"], state.carried["memory_0"])
    plain = {name: value for name, value in vars(read).items() if name not in ("running_sums", "carried")}
    assert plain == {name: value for name, value in vars(state).items() if name not in ("running_sums", "carried")}
    assert json.loads((tmp_path / "training_state" / PROGRESS_FILE).read_text())["format"] == STATE_FORMAT
    # The best record carries keep-best and patience through a resume.
    again = BestSoFar("dev_accuracy", patience=2)
    again.continue_from(read.best)
    assert again.step == 3 and again.evaluations_without_gain == 1 and not again.patience_exhausted
    again.update({"dev_accuracy": 0.45}, 9)
    assert again.patience_exhausted


def test_a_format_1_state_is_migrated(tmp_path):
    """Before version 2: no `format`, the loop's sums under `training_loop_sums` beside the carried tensors, the
    last evaluated step only in the best record; the oldest had no training time and no window."""
    folder = tmp_path / "training_state"
    folder.mkdir()
    best = {
        "step": 3,
        "scores": {"dev_accuracy": 0.5},
        "last": {"dev_accuracy": 0.5},
        "last_evaluated_step": 6,
        "evaluations_without_gain": 1,
    }
    (folder / PROGRESS_FILE).write_text(
        json.dumps(
            {
                "step": 8,
                "epoch": 1,
                "batches_in_epoch": 3,
                "metrics_lines": 9,
                "window_items": 10,
                "window_seconds": 0.5,
                "best": best,
            }
        )
    )
    save_file(
        {"training_loop_sums": torch.arange(4.0), "hidden_0": torch.zeros(2)},
        str(folder / "process_tensors_0.safetensors"),
    )
    state = read_training_state(folder, 0, "cpu")
    assert (state.step, state.epoch, state.batches_in_epoch, state.metrics_lines) == (8, 1, 3, 9)
    assert state.training_seconds == 0.0 and state.last_evaluated_step == 6 and state.best == best
    assert torch.equal(state.running_sums, torch.arange(4.0)) and list(state.carried) == ["hidden_0"]
    assert (state.window_items, state.window_seconds) == (10, 0.5)
    # Without the sums, the window they belong to is not restored either: the resumed run opens a new one.
    (folder / "process_tensors_0.safetensors").unlink()
    state = read_training_state(folder, 0, "cpu")
    assert state.running_sums is None and (state.window_items, state.window_seconds) == (0, 0.0)


def test_a_newer_format_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "step-00000008" / "training_state"
    folder.mkdir(parents=True)
    (folder / PROGRESS_FILE).write_text(json.dumps({"format": STATE_FORMAT + 1, "step": 8}))
    with pytest.raises(UserError) as error:
        read_training_state(folder, 0, "cpu")
    message = str(error.value)
    assert "\n" not in message and "newer finetune" in message and str(tmp_path / "step-00000008") in message


def downgrade_to_format_1(checkpoint: Path) -> None:
    """Rewrite a checkpoint's training state as finetune wrote it before format 2."""
    folder = checkpoint / TRAINING_STATE_DIR
    progress = json.loads((folder / PROGRESS_FILE).read_text())
    del progress["format"], progress["last_evaluated_step"]
    (folder / PROGRESS_FILE).write_text(json.dumps(progress))
    tensors_file = folder / "process_tensors_0.safetensors"
    tensors = load_file(str(tensors_file))
    tensors["training_loop_sums"] = tensors.pop("loop.sums")
    save_file(tensors, str(tensors_file))


def test_a_run_stopped_under_the_older_format_resumes_bit_for_bit(pretrained, task_dir, tmp_path, monkeypatch):
    run_finetune(
        load_recipe(write_yaml(tmp_path / "full.yaml", resumable_recipe(pretrained, task_dir, tmp_path / "full")))
    )
    recipe = load_recipe(
        write_yaml(tmp_path / "resumed.yaml", resumable_recipe(pretrained, task_dir, tmp_path / "resumed"))
    )
    stop_after_checkpoint(monkeypatch, 8)
    with pytest.raises(Stopped):
        run_finetune(recipe)
    monkeypatch.undo()
    downgrade_to_format_1(latest_training_checkpoint(tmp_path / "resumed"))
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")
    # The resumed run saved its later checkpoints in the current format.
    progress = json.loads(
        (latest_training_checkpoint(tmp_path / "resumed") / TRAINING_STATE_DIR / PROGRESS_FILE).read_text()
    )
    assert progress["format"] == STATE_FORMAT and progress["step"] == 12


def test_the_cli_refuses_to_resume_a_checkpoint_of_a_newer_format(pretrained, task_dir, tmp_path, monkeypatch):
    recipe = load_recipe(
        write_yaml(tmp_path / "resumed.yaml", resumable_recipe(pretrained, task_dir, tmp_path / "resumed"))
    )
    stop_after_checkpoint(monkeypatch, 4)
    with pytest.raises(Stopped):
        run_finetune(recipe)
    monkeypatch.undo()
    progress_file = latest_training_checkpoint(tmp_path / "resumed") / TRAINING_STATE_DIR / PROGRESS_FILE
    progress_file.write_text(json.dumps({**json.loads(progress_file.read_text()), "format": STATE_FORMAT + 1}))
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.startswith("error:")] == [
        (
            f"error: --resume: {progress_file.parent.parent} was saved by a newer finetune (training state format "
            f"{STATE_FORMAT + 1}; this version reads up to {STATE_FORMAT}): upgrade finetune to resume it"
        )
    ]
