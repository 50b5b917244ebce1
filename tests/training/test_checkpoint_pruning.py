"""Pruning old periodic checkpoints is atomic: a kill in the middle leaves complete checkpoints and leftovers that
`--resume` sweeps, never a half-deleted folder that --resume could take for a checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.stages.pretrain import run_pretrain
from finetune.training.checkpoints import (
    PROGRESS_FILE,
    TRAINING_STATE_DIR,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    latest_training_checkpoint,
    step_checkpoint_dir,
    sweep_incomplete_checkpoints,
    training_checkpoints,
)
from tests.conftest import REPO_ROOT, write_yaml
from tests.stages.test_pretrain_families import family_recipe

runner = CliRunner()

# `python -m finetune ARGS` on a disk that hangs while deleting a periodic checkpoint: the first deletion of a
# `step-N` folder (whatever name it is deleted under) removes the weights, touches the marker file and hangs.
HANGING_DELETE_DRIVER = textwrap.dedent("""
    import os, re, runpy, time
    from pathlib import Path
    import finetune.training.checkpoints as checkpoints

    marker, rmtree = Path(os.environ["TEST_PRUNING_MARKER"]), checkpoints.shutil.rmtree

    def hanging_rmtree(path, *args, **kwargs):
        path = Path(path)
        if re.match(r"step-\\d+(\\.deleting)?$", path.name) and path.is_dir():
            (path / "model.safetensors").unlink(missing_ok=True)
            marker.touch()
            time.sleep(600)
        return rmtree(path, *args, **kwargs)

    checkpoints.shutil.rmtree = hanging_rmtree
    runpy.run_module("finetune", run_name="__main__", alter_sys=True)
""")


def kill_during_the_first_pruning(tmp_path: Path, recipe: Path) -> None:
    """Run `finetune pretrain RECIPE` until it is deleting a checkpoint, then SIGKILL it."""
    marker = tmp_path / "pruning"
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
        "HF_HUB_OFFLINE": "1",
        "TEST_PRUNING_MARKER": str(marker),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", HANGING_DELETE_DRIVER, "pretrain", str(recipe)],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the run never pruned a checkpoint:\n{process.communicate()[0]}")
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_during_pruning_leaves_complete_checkpoints_and_resume_sweeps_the_rest(
    tmp_path, corpus_file, tokenizers
):
    """A checkpoint every 2 steps, only the newest kept: killed while deleting step 2 after saving step 4."""
    data = family_recipe(
        "gpt2", corpus_file, tmp_path / "full", tokenizers["gpt2"], checkpoint_every=2, keep_checkpoints=1
    )
    data["training"]["max_steps"] = 8
    run_pretrain(load_recipe(write_yaml(tmp_path / "full.yaml", data)))
    recipe = write_yaml(tmp_path / "run.yaml", {**data, "run_dir": str(tmp_path / "run")})
    kill_during_the_first_pruning(tmp_path, recipe)

    checkpoints = tmp_path / "run" / "checkpoints"
    step_folders = [path for path in checkpoints.iterdir() if path.name.startswith("step-") and "." not in path.name]
    assert all((path / WEIGHTS_FILE).is_file() for path in step_folders), "a half-deleted folder kept its name"
    assert latest_training_checkpoint(tmp_path / "run") == checkpoints / "step-00000004"
    assert (checkpoints / "step-00000002.deleting").is_dir()  # what the kill interrupted, under a name no one takes

    result = runner.invoke(app, ["pretrain", str(recipe), "--resume"])
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output
    assert sorted(path.name for path in checkpoints.iterdir()) == ["step-00000008"]  # the leftover swept
    full, resumed = (load_file(tmp_path / name / "checkpoint" / WEIGHTS_FILE) for name in ("full", "run"))
    assert full.keys() == resumed.keys() and all(torch.equal(full[name], resumed[name]) for name in full)


def fake_checkpoint(folder: Path, weights: bool = True) -> Path:
    """A folder with what makes a periodic checkpoint count: progress.json and (unless not `weights`) the weights."""
    (folder / TRAINING_STATE_DIR).mkdir(parents=True)
    (folder / TRAINING_STATE_DIR / PROGRESS_FILE).write_text("{}")
    if weights:
        (folder / WEIGHTS_FILE).write_text("weights")
    return folder


def test_sweep_removes_leftovers_and_puts_back_a_previous_folder_that_is_the_only_copy(tmp_path):
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    complete = fake_checkpoint(checkpoints / "step-00000004")
    fake_checkpoint(checkpoints / "step-00000002", weights=False)  # half-deleted in place by an older version
    fake_checkpoint(checkpoints / "step-00000006.partial")  # killed while saving
    fake_checkpoint(checkpoints / "step-00000001.deleting", weights=False)  # killed while pruning
    fake_checkpoint(checkpoints / "best.previous")  # killed between the two renames of commit_checkpoint
    fake_checkpoint(run / "checkpoint")
    fake_checkpoint(run / "checkpoint.previous")  # killed after them
    assert training_checkpoints(checkpoints) == [complete]

    sweep_incomplete_checkpoints(run)
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best", "step-00000004"]
    assert (checkpoints / "best" / WEIGHTS_FILE).is_file()
    assert sorted(path.name for path in run.iterdir()) == ["checkpoint", "checkpoints"]


def test_a_checkpoint_with_sharded_weights_counts_only_with_all_its_shards(tmp_path):
    folder = fake_checkpoint(tmp_path / "step-00000003", weights=False)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (folder / WEIGHTS_INDEX_FILE).write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    (folder / shards[0]).write_text("weights")
    assert training_checkpoints(tmp_path) == []
    (folder / shards[1]).write_text("weights")
    assert training_checkpoints(tmp_path) == [folder]


def test_a_phase_before_the_training_checkpoints_before_any_of_its_steps(tmp_path):
    """head_warmup-step-N folders (the driver's WarmupPhase) are older than every step-N, whatever N: the newest is a
    step of the training once there is one, pruning drops the phase's first, a sweep keeps them."""
    assert step_checkpoint_dir(tmp_path, 40, "head_warmup").name == "head_warmup-step-00000040"
    assert step_checkpoint_dir(tmp_path, 40).name == "step-00000040"
    checkpoints = tmp_path / "checkpoints"
    names = ["step-00000004", "head_warmup-step-00000100", "head_warmup-step-00000050", "step-00000002"]
    for name in names:
        fake_checkpoint(checkpoints / name)
    order = ["head_warmup-step-00000050", "head_warmup-step-00000100", "step-00000002", "step-00000004"]
    assert [path.name for path in training_checkpoints(checkpoints)] == order
    assert latest_training_checkpoint(tmp_path) == checkpoints / "step-00000004"
    sweep_incomplete_checkpoints(tmp_path)
    assert sorted(path.name for path in checkpoints.iterdir()) == sorted(names)
