"""`--resume` after a stop between two logged steps: metrics.jsonl and timing.json as if the run never stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.reporting.finish import TIMING_FILE
from finetune.stages.finetune import run_finetune
from finetune.stages.pretrain import run_pretrain
from finetune.training import loop as loop_module
from finetune.training.checkpoints import PROGRESS_FILE, TRAINING_STATE_DIR, latest_training_checkpoint
from tests.conftest import write_yaml
from tests.stages.test_pretrain_families import family_recipe
from tests.training.test_resume_finetune import Stopped, assert_same_run, resumable_recipe, stop_after_checkpoint

runner = CliRunner()
SECONDS_BEFORE_THE_STOP = 1000.0  # training time the stopped run pretends to have spent (no sleeping in tests)


def stop_after_checkpoint_of_a_long_run(monkeypatch, step: int) -> None:
    """`stop_after_checkpoint`, in runs whose loops seem to have been training for SECONDS_BEFORE_THE_STOP."""
    stop_after_checkpoint(monkeypatch, step)
    stopping_init = loop_module.TrainingLoop.__init__

    def init_started_long_ago(self, *arguments, **keywords):
        stopping_init(self, *arguments, **keywords)
        self.started -= SECONDS_BEFORE_THE_STOP

    monkeypatch.setattr(loop_module.TrainingLoop, "__init__", init_started_long_ago)


def metrics_text_without_throughput(run_dir: Path) -> str:
    """metrics.jsonl with the wall-clock `*_per_s` fields dropped, every record written back in its key order."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return "\n".join(
        json.dumps({key: value for key, value in record.items() if not key.endswith("_per_s")}) for record in records
    )


def stop_then_resume(path: Path, stage: str, run, step: int, monkeypatch) -> dict:
    """Run the recipe until the checkpoint of `step`, check the log window was open then, resume through the CLI;
    returns the progress the run resumed from."""
    stop_after_checkpoint_of_a_long_run(monkeypatch, step)
    with pytest.raises(Stopped):
        run(load_recipe(path))
    monkeypatch.undo()
    progress = json.loads(
        (latest_training_checkpoint(path.parent / "resumed") / TRAINING_STATE_DIR / PROGRESS_FILE).read_text(
            encoding="utf-8"
        )
    )
    assert progress["step"] == step and progress["window_items"] > 0  # stopped between two logged steps
    result = runner.invoke(app, [stage, str(path), "--resume"])
    assert result.exit_code == 0, result.output
    return progress


def assert_same_logs_and_whole_training_time(full: Path, resumed: Path, progress: dict) -> None:
    assert metrics_text_without_throughput(full) == metrics_text_without_throughput(resumed)
    timing = json.loads((resumed / TIMING_FILE).read_text(encoding="utf-8"))
    assert timing["training_wall_time_s"] >= progress["training_seconds"] >= SECONDS_BEFORE_THE_STOP
    assert (
        json.loads((full / TIMING_FILE).read_text(encoding="utf-8"))["training_wall_time_s"] < SECONDS_BEFORE_THE_STOP
    )  # the offset comes from the stopped run, not from anything else


@pytest.mark.parametrize("family", ["gpt2", "awd_lstm"])  # awd_lstm: the loop's sums beside the carried LSTM state
def test_pretrain_resumed_between_logged_steps_logs_what_the_uninterrupted_run_logged(
    family, tmp_path, corpus_file, tokenizers, monkeypatch
):
    """Logged every 3 steps, checkpointed every 5: stopped after step 5, the resumed step-6 record covers 4 to 6."""
    data = family_recipe(family, corpus_file, tmp_path / "full", tokenizers[family], checkpoint_every=5)
    data["training"]["log_every"] = 3
    run_pretrain(load_recipe(write_yaml(tmp_path / "full.yaml", data)))
    path = write_yaml(tmp_path / "resumed.yaml", {**data, "run_dir": str(tmp_path / "resumed")})
    progress = stop_then_resume(path, "pretrain", run_pretrain, 5, monkeypatch)
    assert_same_logs_and_whole_training_time(tmp_path / "full", tmp_path / "resumed", progress)


def test_finetune_resumed_between_logged_steps_logs_what_the_uninterrupted_run_logged(
    pretrained, task_dir, tmp_path, monkeypatch
):
    """Logged every 3 steps, checkpointed every 4: stopped after step 8 (mid-epoch 2), step 9's record covers 7 to 9."""
    data = resumable_recipe(pretrained, task_dir, tmp_path / "full")
    data["training"]["log_every"] = 3
    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", data)))
    path = write_yaml(tmp_path / "resumed.yaml", {**data, "run_dir": str(tmp_path / "resumed")})
    progress = stop_then_resume(path, "finetune", run_finetune, 8, monkeypatch)
    assert_same_logs_and_whole_training_time(tmp_path / "full", tmp_path / "resumed", progress)
    assert_same_run(tmp_path / "full", tmp_path / "resumed")
