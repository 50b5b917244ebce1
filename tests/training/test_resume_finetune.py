"""`finetune finetune --resume`: a stopped fine-tuning run continues bit for bit, one seed or several."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.sampling import ResumableSampler
from finetune.data.task_batches import LengthGroupedSampler
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.training import loop as loop_module
from finetune.training.checkpoints import PROGRESS_FILE, TRAINING_STATE_DIR, latest_training_checkpoint
from tests.conftest import finetune_recipe, two_processes, write_yaml
from tests.stages.test_pretrain_families import comparable_metrics

runner = CliRunner()


class Stopped(Exception):
    """Stands for the run being killed right after a periodic checkpoint."""


def resumable_recipe(checkpoint: Path, task: Path, run_dir: Path, **extra) -> dict:
    """3 epochs of 5 steps (40 examples, batches of 8), gradual unfreezing, evaluations every 3 steps, keep-best,
    a checkpoint every 4 steps: step 8 is in the middle of epoch 2, after a new-best evaluation or not."""
    data = finetune_recipe(checkpoint, task, run_dir)
    data["training"]["epochs"] = 3
    data.update({"eval_every": 3, "checkpoint_every": 4, "keep_checkpoints": 2, "early_stopping_patience": 5})
    data.update(extra)
    return data


def stop_after_checkpoint(monkeypatch, step: int) -> None:
    """Make the next runs raise Stopped right after writing the periodic checkpoint of `step`."""
    original_init = loop_module.TrainingLoop.__init__

    def init_that_stops(self, *arguments, **keywords):
        original_init(self, *arguments, **keywords)
        save = self.save_checkpoint

        def save_then_stop(progress):
            folder = save(progress)
            if progress.step == step:
                raise Stopped
            return folder

        self.save_checkpoint = save_then_stop

    monkeypatch.setattr(loop_module.TrainingLoop, "__init__", init_that_stops)


def assert_same_run(full: Path, resumed: Path) -> None:
    """Same weights, metrics (but wall-clock throughput) and result, bit for bit."""
    full_weights = load_file(full / "checkpoint" / "model.safetensors")
    resumed_weights = load_file(resumed / "checkpoint" / "model.safetensors")
    assert full_weights.keys() == resumed_weights.keys()
    for name in full_weights:
        assert torch.equal(full_weights[name], resumed_weights[name]), name
    assert comparable_metrics(full) == comparable_metrics(resumed)
    assert json.loads((full / RESULT_FILE).read_text()) == json.loads((resumed / RESULT_FILE).read_text())


@pytest.mark.parametrize(
    "training",
    [{"group_by_length": True}, {"group_by_length": False}, {"batch_size": 4, "gradient_accumulation_steps": 2}],
    ids=["length-grouped", "shuffled", "accumulated"],
)
def test_resume_continues_a_finetune_run_exactly(pretrained, task_dir, tmp_path, monkeypatch, training):
    """Stopped after the step-8 checkpoint (mid-epoch 2, two groups thawed) and resumed: the same run, bit for bit."""
    full_data = resumable_recipe(pretrained, task_dir, tmp_path / "full")
    full_data["training"].update(training)
    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", full_data)))

    data = resumable_recipe(pretrained, task_dir, tmp_path / "resumed")
    data["training"].update(training)
    recipe = load_recipe(write_yaml(tmp_path / "resumed.yaml", data))
    stop_after_checkpoint(monkeypatch, 8)
    with pytest.raises(Stopped):
        run_finetune(recipe)
    monkeypatch.undo()
    run = tmp_path / "resumed"
    assert not (run / "checkpoint").exists() and not (run / RESULT_FILE).exists()  # does not look finished
    progress = json.loads((latest_training_checkpoint(run) / TRAINING_STATE_DIR / PROGRESS_FILE).read_text())
    assert progress["step"] == 8 and progress["epoch"] == 1
    assert progress["batches_in_epoch"] == 3 * data["training"].get("gradient_accumulation_steps", 1)
    assert progress["best"]["last_evaluated_step"] == 6 and progress["best"]["step"] in (3, 5, 6)
    # The best evaluation's weights travel with the periodic checkpoint (keep-best continues from them).
    assert (latest_training_checkpoint(run) / TRAINING_STATE_DIR / "best" / "model.safetensors").is_file()

    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output
    assert_same_run(tmp_path / "full", run)
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["step-00000008", "step-00000012"]


def test_resume_of_a_multi_seed_run_keeps_finished_seeds(pretrained, task_dir, tmp_path, monkeypatch):
    """Stopped during the second seed: --resume keeps seed 3 as it was and continues seed 4 from its checkpoint."""

    def seeds_recipe(run_dir: Path) -> dict:
        data = finetune_recipe(pretrained, task_dir, run_dir)
        data.update({"seeds": [3, 4], "checkpoint_every": 2})
        data["training"]["epochs"] = 1
        return data

    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", seeds_recipe(tmp_path / "full"))))
    path = write_yaml(tmp_path / "resumed.yaml", seeds_recipe(tmp_path / "resumed"))
    original_init = loop_module.TrainingLoop.__init__
    runs = []

    def init_that_stops_in_seed_4(self, *arguments, **keywords):
        original_init(self, *arguments, **keywords)
        save, run_dir = self.save_checkpoint, Path(self.metrics_log.path).parent
        runs.append(run_dir.name)

        def save_then_stop(progress):
            folder = save(progress)
            if run_dir.name == "seed-4" and progress.step == 4:
                raise Stopped
            return folder

        self.save_checkpoint = save_then_stop

    monkeypatch.setattr(loop_module.TrainingLoop, "__init__", init_that_stops_in_seed_4)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(path))
    finished_seed = (tmp_path / "resumed" / "seed-3" / "metrics.jsonl").read_text()
    assert not (tmp_path / "resumed" / "seeds.json").exists()

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert runs == ["seed-3", "seed-4", "seed-4"]  # seed 3 was not run again
    assert (tmp_path / "resumed" / "seed-3" / "metrics.jsonl").read_text() == finished_seed
    for seed in (3, 4):
        assert_same_run(tmp_path / "full" / f"seed-{seed}", tmp_path / "resumed" / f"seed-{seed}")
    assert json.loads((tmp_path / "full" / "seeds.json").read_text()) == json.loads(
        (tmp_path / "resumed" / "seeds.json").read_text()
    )


def test_resume_refuses_a_changed_recipe_and_keeps_a_finished_run(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data["training"].update({"epochs": 1, "max_steps": 2})
    path = write_yaml(tmp_path / "recipe.yaml", data)
    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 2 and "holds no run to resume" in result.output
    assert runner.invoke(app, ["finetune", str(path)]).exit_code == 0
    result = runner.invoke(app, ["finetune", str(path), "training.lr=0.01", "task.max_length=12", "--resume"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].endswith("in: task.max_length, training.lr"), result.output
    weights = (tmp_path / "run" / "checkpoint" / "model.safetensors").stat().st_mtime_ns
    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0 and "finished before: nothing to resume" in " ".join(result.output.split())
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").stat().st_mtime_ns == weights


@pytest.mark.parametrize(
    "sampler",
    [
        ResumableSampler(23, seed=1),
        LengthGroupedSampler(list(range(23)), 4, seed=1),
        LengthGroupedSampler(list(range(23)), 4, seed=1, chunk_batches=1),
        LengthGroupedSampler(list(range(23)), 4, seed=1, chunk_batches=2),
    ],
    ids=["shuffled", "length-grouped", "grouped-in-chunks-of-1", "grouped-in-chunks-of-2"],
)
def test_samplers_skip_what_a_stopped_run_read(sampler):
    """After skip(n) an epoch yields the rest of the same order; the next epoch starts from its beginning."""
    sampler.set_epoch(1)
    order = list(sampler)
    sampler.skip_batches(2, batch_size=4, num_processes=2)  # 2 batches on each of 2 processes: 16 indices
    sampler.set_epoch(1)  # what accelerate's loader does at every pass: keeps the skip
    assert list(sampler) == order[16:] and len(sampler) == 7
    sampler.set_epoch(2)
    assert len(list(sampler)) == 23 and list(sampler) != order


# Under torchrun: a whole run of COMMAND with periodic checkpoints; then (the main process) the state of a run killed
# after the step-STOP checkpoint: later checkpoints and the end of the run removed, metrics.jsonl left as it was; then
# `--resume`. Both runs in one start-up of the 2 processes. Arguments: COMMAND RECIPE RUN_DIR REFERENCE STOP.
TWO_PROCESS_LAUNCHER = textwrap.dedent("""
    import shutil, sys
    from pathlib import Path
    from accelerate import PartialState
    from finetune.cli import app

    state = PartialState(cpu=True)
    print(f"NUM_PROCESSES {state.num_processes}", flush=True)
    command, recipe, run, reference, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
    app([command, recipe], prog_name="finetune", standalone_mode=False)
    if state.is_main_process:
        reference.mkdir()
        for name in ("checkpoint", "metrics.jsonl", "result.json"):
            (shutil.copytree if (run / name).is_dir() else shutil.copy)(run / name, reference / name)
        for folder in (run / "checkpoints").iterdir():
            if int(folder.name.split("-")[-1]) > int(stop):
                shutil.rmtree(folder)
        shutil.rmtree(run / "checkpoint")
        (run / "result.json").unlink()
    state.wait_for_everyone()
    app([command, recipe, "--resume"], prog_name="finetune", standalone_mode=False)
""")


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
@pytest.mark.slow
def test_resume_on_two_processes(pretrained, task_dir, tmp_path):
    """2 processes x 8 examples, an epoch of 3 steps (16, 16, 8): resumed after step 2, before the short step.

    Logged at step 3 only: the step-3 record sums steps 1 and 2 from before the stop, each process its own share.
    """
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data.update({"checkpoint_every": 1, "keep_checkpoints": 3, "eval_every": 2})
    data["training"].update({"epochs": 1, "log_every": 3})
    path = write_yaml(tmp_path / "recipe.yaml", data)
    folders = (str(tmp_path / "run"), str(tmp_path / "reference"))
    result = two_processes(tmp_path, TWO_PROCESS_LAUNCHER, "finetune", str(path), *folders, "2")
    output = result.stdout + result.stderr
    assert output.count("NUM_PROCESSES 2") == 2 and result.returncode == 0, output[-3000:]
    assert "resuming from" in output and "(step 2, epoch 1)" in " ".join(output.split())
    assert_same_run(tmp_path / "reference", tmp_path / "run")
    assert [
        record["step"] for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "train"
    ] == [3]
