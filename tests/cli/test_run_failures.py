"""Runs that stop badly: killed (SIGKILL, also during a save), Ctrl-C, a full disk, a diverged loss, out of memory.

Killed and interrupted runs are real `python -m finetune` processes; each resumes with `--resume` to
exactly the run that never stopped (weights, metrics.jsonl, result.json). The failures end with one
line that says what to change, and never leave a run directory that looks finished.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import accelerate
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.stages.pretrain import run_pretrain
from finetune.training import checkpoints as checkpoints_module
from finetune.training.checkpoints import latest_training_checkpoint
from finetune.training.loop import TrainingLoop
from tests.conftest import REPO_ROOT, write_yaml
from tests.stages.test_pretrain_families import family_recipe
from tests.training.test_resume_finetune import assert_same_run, resumable_recipe

runner = CliRunner()

# `python -m finetune ARGS`, with every optimizer step slowed down (so that a test can kill the process at a
# step of its choosing) and, on request, a SIGKILL of the process itself in the middle of writing a checkpoint.
DRIVER = textwrap.dedent("""
    import os, runpy, signal, time
    import accelerate.optimizer
    import finetune.training.checkpoints as checkpoints

    delay = float(os.environ.get("TEST_STEP_DELAY", "0"))
    step = accelerate.optimizer.AcceleratedOptimizer.step

    def slow_step(self, *args, **kwargs):
        time.sleep(delay)
        return step(self, *args, **kwargs)

    accelerate.optimizer.AcceleratedOptimizer.step = slow_step
    write_model = checkpoints.write_model

    def write_model_then_die(model, tokenizer, folder, recipe=None):
        write_model(model, tokenizer, folder, recipe)  # the weights are on disk, progress.json is not yet
        if folder.name == os.environ.get("TEST_KILL_DURING_SAVE_OF"):
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoints.write_model = write_model_then_die
    runpy.run_module("finetune", run_name="__main__", alter_sys=True)
""")


def launch(tmp_path: Path, *arguments: str, step_delay: float = 0.0, kill_during_save_of: str = "") -> subprocess.Popen:
    """Start `python -m finetune ARGUMENTS` (through DRIVER) with the test process's thread count and offline."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
        "HF_HUB_OFFLINE": "1",
        "TEST_STEP_DELAY": str(step_delay),
        "TEST_KILL_DURING_SAVE_OF": kill_during_save_of,
    }
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, *arguments],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def logged_train_steps(run_dir: Path) -> list[int]:
    """The train steps in metrics.jsonl so far (a line being written is skipped)."""
    steps = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record["phase"] == "train":
            steps.append(record["step"])
    return steps


def wait_for_step(process: subprocess.Popen, run_dir: Path, ready, timeout: float = 120.0) -> list[int]:
    """Poll metrics.jsonl until `ready(steps)`; the process must still be running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = logged_train_steps(run_dir)
        if steps and ready(steps):
            return steps
        if process.poll() is not None:
            pytest.fail(f"the run ended before the test could stop it:\n{process.stdout.read()}")
        time.sleep(0.005)
    process.kill()
    pytest.fail("the run did not reach the step in time")


def one_error_line(output: str) -> str:
    """The single `error:` line of a failed command (its message on one line, no traceback)."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture(scope="module")
def finetune_reference(pretrained, tmp_path_factory) -> Path:
    """An uninterrupted run of the resumable finetune recipe (test_resume_finetune's), for comparisons."""
    from tests.conftest import write_task

    folder = tmp_path_factory.mktemp("reference")
    run_finetune(
        load_recipe(
            write_yaml(folder / "full.yaml", resumable_recipe(pretrained, write_task(folder / "task"), folder / "full"))
        )
    )
    return folder


def finetune_recipe_file(reference: Path, tmp_path: Path, **extra) -> Path:
    """The reference's recipe into tmp_path/run (the same task files, so the same run)."""
    data = resumable_recipe(
        Path(load_recipe(reference / "full.yaml").model.checkpoint), reference / "task", tmp_path / "run", **extra
    )
    return write_yaml(tmp_path / "recipe.yaml", data)


@pytest.mark.slow
def test_sigkill_at_an_arbitrary_step_then_resume_gives_the_uninterrupted_finetune_run(finetune_reference, tmp_path):
    path = finetune_recipe_file(finetune_reference, tmp_path)
    process = launch(tmp_path, "finetune", str(path), step_delay=0.08)
    # After the step-4 checkpoint, at a step that is no checkpoint's (5, 6 or 7): the resumed run repeats steps.
    wait_for_step(process, tmp_path / "run", lambda steps: steps[-1] > 4 and steps[-1] % 4 != 0)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    killed_after = logged_train_steps(tmp_path / "run")[-1]
    checkpoint_step = int(latest_training_checkpoint(tmp_path / "run").name.removeprefix("step-"))
    assert killed_after > checkpoint_step, "the kill fell on a checkpoint: nothing would be repeated"
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / RESULT_FILE).exists()

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(finetune_reference / "full", tmp_path / "run")


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_pretrain_run(tmp_path, corpus_file, tokenizers):
    for name in ("full", "run"):
        write_yaml(tmp_path / f"{name}.yaml", family_recipe("gpt2", corpus_file, tmp_path / name, tokenizers["gpt2"]))
    run_pretrain(load_recipe(tmp_path / "full.yaml"))
    process = launch(tmp_path, "pretrain", str(tmp_path / "run.yaml"), step_delay=0.08)
    wait_for_step(process, tmp_path / "run", lambda steps: steps[-1] > 4 and steps[-1] % 4 != 0)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    checkpoint_step = int(latest_training_checkpoint(tmp_path / "run").name.removeprefix("step-"))
    assert logged_train_steps(tmp_path / "run")[-1] > checkpoint_step

    result = runner.invoke(app, ["pretrain", str(tmp_path / "run.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    full, resumed = (load_file(tmp_path / name / "checkpoint" / "model.safetensors") for name in ("full", "run"))
    assert full.keys() == resumed.keys() and all(torch.equal(full[name], resumed[name]) for name in full)
    from tests.stages.test_pretrain_families import comparable_metrics

    assert comparable_metrics(tmp_path / "full") == comparable_metrics(tmp_path / "run")


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_at_the_step_boundary_and_resume_finishes_the_run(finetune_reference, tmp_path):
    path = finetune_recipe_file(finetune_reference, tmp_path, checkpoint_every=None)  # no periodic checkpoints
    process = launch(tmp_path, "finetune", str(path), step_delay=0.08)
    wait_for_step(process, tmp_path / "run", lambda steps: steps[-1] >= 2)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130, output
    last_line = output.strip().splitlines()[-1]
    checkpoint = latest_training_checkpoint(tmp_path / "run")
    step = int(checkpoint.name.removeprefix("step-"))
    assert last_line == (
        f"interrupted at step {step}; checkpoint saved to {checkpoint}; continue with: "
        f"finetune finetune {path} --resume"
    ), output
    assert logged_train_steps(tmp_path / "run")[-1] == step  # saved at the boundary of the step it was in
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / RESULT_FILE).exists()

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(finetune_reference / "full", tmp_path / "run")


@pytest.mark.slow
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_and_nothing_that_looks_complete(
    finetune_reference, tmp_path
):
    path = finetune_recipe_file(finetune_reference, tmp_path)
    process = launch(tmp_path, "finetune", str(path), kill_during_save_of="step-00000008.partial")
    assert process.wait(timeout=120) == -signal.SIGKILL
    checkpoints = tmp_path / "run" / "checkpoints"
    assert (checkpoints / "step-00000008.partial" / "model.safetensors").is_file()  # killed half-way
    assert not (checkpoints / "step-00000008").exists()
    assert latest_training_checkpoint(tmp_path / "run") == checkpoints / "step-00000004"

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert not (checkpoints / "step-00000008.partial").exists()
    assert_same_run(finetune_reference / "full", tmp_path / "run")


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_good_checkpoint(
    finetune_reference, tmp_path, monkeypatch
):
    path = finetune_recipe_file(finetune_reference, tmp_path)
    write_model = checkpoints_module.write_model

    def write_model_until_the_disk_is_full(model, tokenizer, folder, recipe=None):
        write_model(model, tokenizer, folder, recipe)
        if folder.name == "step-00000008.partial":  # the weights fitted, the rest does not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "progress.json"))

    monkeypatch.setattr(checkpoints_module, "write_model", write_model_until_the_disk_is_full)
    result = runner.invoke(app, ["finetune", str(path)])
    assert result.exit_code == 1
    checkpoints = tmp_path / "run" / "checkpoints"
    assert one_error_line(result.output) == (
        f"error: could not save the checkpoint {checkpoints / 'step-00000008'}: no space left on the device "
        f"(writing {checkpoints / 'step-00000008.partial' / 'progress.json'}); the last complete checkpoint, "
        f"{checkpoints / 'step-00000004'}, is kept - free some space (or lower keep_checkpoints) and continue "
        "with --resume"
    )
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best", "step-00000004"]  # the partial is gone
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / RESULT_FILE).exists()

    monkeypatch.undo()  # space freed
    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(finetune_reference / "full", tmp_path / "run")


def test_a_nan_loss_stops_the_run_naming_the_step_and_saves_nothing_poisoned(finetune_reference, tmp_path, monkeypatch):
    # Checked at logged steps (every 3), before evaluations and saves, and at epoch ends: the loss turns nan at
    # step 5, the last of epoch 1, and is found before that epoch's evaluation.
    path = finetune_recipe_file(finetune_reference, tmp_path)
    train_epoch = TrainingLoop.train_epoch

    def train_epoch_with_nan_from_step_5(self, loader, epoch, compute_loss, *arguments, **keywords):
        def poisoned(model, batch):
            loss, terms, items = compute_loss(model, batch)
            return (loss * float("nan") if self.step + 1 >= 5 else loss), terms, items

        return train_epoch(self, loader, epoch, poisoned, *arguments, **keywords)

    monkeypatch.setattr(TrainingLoop, "train_epoch", train_epoch_with_nan_from_step_5)
    result = runner.invoke(app, ["finetune", str(path), "training.log_every=3"])
    assert result.exit_code == 1
    run = tmp_path / "run"
    message = one_error_line(result.output)
    assert message.startswith("error: training diverged: the loss was not finite (nan or inf) at step 5; ")
    assert f"the last good checkpoint is {run / 'checkpoints' / 'step-00000004'}" in message
    assert all(
        hint in message
        for hint in ("training.lr", "training.max_grad_norm", "check the data", "training.mixed_precision=no")
    )
    assert latest_training_checkpoint(run) == run / "checkpoints" / "step-00000004"
    assert not (run / "checkpoint").exists() and not (run / RESULT_FILE).exists() and not (run / "timing.json").exists()
    assert "NaN" not in (run / "metrics.jsonl").read_text()
    assert max(logged_train_steps(run)) == 3  # nothing was logged after the nan
    for folder in (run / "checkpoints" / "step-00000004", run / "checkpoints" / "best"):
        assert all(torch.isfinite(tensor).all() for tensor in load_file(folder / "model.safetensors").values())


def test_out_of_memory_is_one_line_of_advice(finetune_reference, tmp_path, monkeypatch):
    path = finetune_recipe_file(finetune_reference, tmp_path)
    backward = accelerate.Accelerator.backward
    calls = []

    def backward_out_of_memory_at_step_3(self, loss, **keywords):
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return backward(self, loss, **keywords)

    monkeypatch.setattr(accelerate.Accelerator, "backward", backward_out_of_memory_at_step_3)
    result = runner.invoke(app, ["finetune", str(path)])
    assert result.exit_code == 1
    assert one_error_line(result.output) == (
        "error: out of GPU memory after 2 optimizer steps (training.batch_size=8, gradient_accumulation_steps=1, "
        "mixed_precision=auto): lower training.batch_size and raise training.gradient_accumulation_steps by the same "
        "factor (the effective batch stays the same), shorten the sequences (task.max_length or corpus.block_size), "
        "or use training.mixed_precision=bf16"
    )
    assert not (tmp_path / "run" / "checkpoint").exists()
