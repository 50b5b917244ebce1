"""`--resume` past a broken newest checkpoint (a file cut short, or one that does not parse): one line says which
file it skipped and which older checkpoint it uses, and the run ends as the uninterrupted one; with no whole
checkpoint left it is one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.stages.pretrain import run_pretrain
from finetune.training.checkpoints import TRAINING_STATE_DIR, training_checkpoints
from tests.conftest import interrupted_at_step, one_error_line, write_yaml
from tests.training.test_resume_finetune import Stopped, assert_same_run, resumable_recipe, stop_after_checkpoint

runner = CliRunner()


def cut_in_half(path: Path) -> None:
    """What a copy or a save cut short leaves: the first half of the file."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "broken", [f"{TRAINING_STATE_DIR}/model.safetensors", f"{TRAINING_STATE_DIR}/optimizer.bin", "model.safetensors"]
)
def test_resume_skips_a_cut_newest_checkpoint_for_the_older_one_and_finishes_the_same_run(
    pretrained, task_dir, tmp_path, monkeypatch, broken
):
    run_finetune(
        load_recipe(write_yaml(tmp_path / "full.yaml", resumable_recipe(pretrained, task_dir, tmp_path / "full")))
    )
    path = write_yaml(tmp_path / "run.yaml", resumable_recipe(pretrained, task_dir, tmp_path / "run"))
    stop_after_checkpoint(monkeypatch, 8)  # checkpoint_every 4, keep_checkpoints 2: steps 4 and 8 are kept
    with pytest.raises(Stopped):
        run_finetune(load_recipe(path))
    monkeypatch.undo()
    checkpoints = tmp_path / "run" / "checkpoints"
    cut_in_half(checkpoints / "step-00000008" / broken)

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.output.splitlines() if line.startswith("--resume: skipping")]
    assert skipped == [
        f"--resume: skipping a broken checkpoint, {checkpoints / 'step-00000008' / broken}: "
        + (
            "not a complete torch file (its zip directory is missing: the file was cut short)"
            if broken.endswith(".bin")
            else "not a complete safetensors file (incomplete metadata, file not fully covered)"
        )
        + f"; resuming from the older {checkpoints / 'step-00000004'}"
    ]
    assert f"resuming from {checkpoints / 'step-00000004'} (step 4" in result.output.replace("\n", "")
    assert_same_run(tmp_path / "full", tmp_path / "run")  # step 8 was trained again, and saved whole this time
    assert training_checkpoints(checkpoints) == [checkpoints / "step-00000008", checkpoints / "step-00000012"]


def test_resume_with_every_checkpoint_broken_is_one_line_naming_the_file(pretrained, task_dir, tmp_path, monkeypatch):
    path = write_yaml(tmp_path / "run.yaml", resumable_recipe(pretrained, task_dir, tmp_path / "run"))
    stop_after_checkpoint(monkeypatch, 8)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(path))
    monkeypatch.undo()
    checkpoints = tmp_path / "run" / "checkpoints"
    for step in ("step-00000004", "step-00000008"):
        (checkpoints / step / TRAINING_STATE_DIR / "progress.json").write_text('{"step": 4, "epo', encoding="utf-8")

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    newest = checkpoints / "step-00000008" / TRAINING_STATE_DIR / "progress.json"
    assert one_error_line(result) == (
        f"error: --resume: {newest}: not valid JSON (Unterminated string starting at); no older complete "
        "checkpoint to resume from: start the run again with overwrite=true"
    )
    assert not (tmp_path / "run" / RESULT_FILE).exists()


def test_pretrain_resume_skips_a_checkpoint_whose_training_state_does_not_parse(
    tmp_path, pretrain_recipe_data, write_recipe
):
    pretrain_recipe_data.update({"checkpoint_every": 3, "keep_checkpoints": 2})
    path = write_recipe(pretrain_recipe_data)
    with interrupted_at_step(6):
        run_pretrain(load_recipe(path))
    checkpoints = Path(pretrain_recipe_data["run_dir"]) / "checkpoints"
    (checkpoints / "step-00000006" / TRAINING_STATE_DIR / "progress.json").write_text("{", encoding="utf-8")

    result = runner.invoke(app, ["pretrain", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert (
        f"--resume: skipping a broken checkpoint, {checkpoints / 'step-00000006' / TRAINING_STATE_DIR}"
        in result.output.replace("\n", "")
    )
    assert f"resuming from {checkpoints / 'step-00000003'} (step 3" in result.output.replace("\n", "")
    assert (Path(pretrain_recipe_data["run_dir"]) / "checkpoint" / "model.safetensors").is_file()
