"""`--resume` on another launch (training/relaunch.py): the optimizer step split another way (batch size, gradient
accumulation, process count) reads the same examples; another global batch is refused; 2 processes -> 1 and 1 -> 2
under torchrun."""

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
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.finetune import run_finetune
from finetune.training.checkpoints import PROGRESS_FILE, TRAINING_STATE_DIR, latest_training_checkpoint
from tests.conftest import finetune_recipe, two_processes, write_yaml
from tests.training.test_resume_finetune import Stopped, stop_after_checkpoint

runner = CliRunner()
TOLERANCE = 1e-4  # another split of a step sums its examples in another order: float rounding only


def plain_recipe(checkpoint: Path, task: Path, run_dir: Path, **training) -> dict:
    """2 epochs of 40 examples in steps of 8 (5 a epoch), a checkpoint every 3 steps; no dropout, so that runs that
    batch the same step differently compute the same thing."""
    data = finetune_recipe(checkpoint, task, run_dir)
    data.update({"checkpoint_every": 3, "keep_checkpoints": 3, "classifier_dropout": 0.0})
    data["training"].update({"batch_size": 8, **training})
    return data


def assert_close_runs(reference: Path, resumed: Path, tolerance: float = TOLERANCE) -> None:
    """The same steps logged, the same losses and weights within float rounding (`tolerance`, relative), the same
    LRs."""
    one, two = (
        [record for record in read_metrics(path / "metrics.jsonl") if record["phase"] == "train"]
        for path in (reference, resumed)
    )
    assert [record["step"] for record in one] == [record["step"] for record in two] and one
    for first, second in zip(one, two):
        assert second["loss"] == pytest.approx(first["loss"], rel=tolerance), first["step"]
        assert second["lr"] == pytest.approx(first["lr"])
    weights = [load_file(path / "checkpoint" / "model.safetensors") for path in (reference, resumed)]
    for name, weight in weights[0].items():
        assert torch.allclose(weight, weights[1][name], rtol=tolerance, atol=1e-6), name


def stopped_run(data: dict, path: Path, monkeypatch, step: int) -> Path:
    """Run `data` (saved at `path`) until just after its checkpoint of `step`, as if killed there."""
    stop_after_checkpoint(monkeypatch, step)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(write_yaml(path, data)))
    monkeypatch.undo()
    return latest_training_checkpoint(Path(data["run_dir"]))


def test_a_resume_may_split_the_step_another_way(pretrained_without_dropout, task_dir, tmp_path, monkeypatch):
    """Saved with batches of 8, resumed with 4 x 2 accumulated (mid-epoch 2): the same examples in each step."""
    reference = plain_recipe(pretrained_without_dropout, task_dir, tmp_path / "reference")
    run_finetune(load_recipe(write_yaml(tmp_path / "reference.yaml", reference)))
    data = plain_recipe(pretrained_without_dropout, task_dir, tmp_path / "run")
    checkpoint = stopped_run(data, tmp_path / "run.yaml", monkeypatch, 6)
    progress = json.loads((checkpoint / TRAINING_STATE_DIR / PROGRESS_FILE).read_text())
    assert (progress["processes"], progress["batch_size"], progress["accumulation"]) == (1, 8, 1)
    assert (progress["epoch"], progress["batches_in_epoch"]) == (1, 1)

    split = ["training.batch_size=4", "training.gradient_accumulation_steps=2"]
    result = runner.invoke(app, ["finetune", str(tmp_path / "run.yaml"), *split, "--resume"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "saved on 1 process x batch 8 on 1 process x batch 4 x 2 accumulated" in said
    assert "the same 8 examples" in said and "random draws" not in said  # one generator before and after
    assert_close_runs(tmp_path / "reference", tmp_path / "run")


def test_a_resume_with_another_global_batch_is_refused_in_one_line(
    pretrained_without_dropout, task_dir, tmp_path, monkeypatch
):
    data = plain_recipe(pretrained_without_dropout, task_dir, tmp_path / "run")
    checkpoint = stopped_run(data, tmp_path / "run.yaml", monkeypatch, 3)
    before = {path: path.stat().st_mtime_ns for path in checkpoint.rglob("*") if path.is_file()}
    result = runner.invoke(app, ["finetune", str(tmp_path / "run.yaml"), "training.batch_size=4", "--resume"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "was saved with optimizer steps of 8 examples (1 process x batch 8)" in line
    assert "this launch makes them 4 (1 process x batch 4): set training.batch_size=8" in line
    assert "Traceback" not in result.output
    assert {path: path.stat().st_mtime_ns for path in checkpoint.rglob("*") if path.is_file()} == before
    # A changed key that is not the step's split is still refused as before.
    result = runner.invoke(app, ["finetune", str(tmp_path / "run.yaml"), "training.lr=0.1", "--resume"])
    assert result.exit_code == 2 and result.output.strip().endswith("in: training.lr")


# Under torchrun (2 processes): `run` stops its recipe after the step-STOP checkpoint, as a killed run would, or
# `resume` continues one with the overrides that follow.
LAUNCHER = textwrap.dedent("""
    import sys
    import pytest
    from accelerate import PartialState
    from finetune.cli import app
    from tests.training.test_resume_finetune import Stopped, stop_after_checkpoint

    state = PartialState(cpu=True)
    print(f"NUM_PROCESSES {state.num_processes}", flush=True)
    mode, recipe, *rest = sys.argv[1:]
    if mode == "run":
        stop_after_checkpoint(pytest.MonkeyPatch(), int(rest[0]))
        try:
            app(["finetune", recipe], prog_name="finetune", standalone_mode=False)
        except Stopped:
            print("STOPPED", flush=True)
    else:
        app(["finetune", recipe, *rest, "--resume"], prog_name="finetune", standalone_mode=False)
""")


def torchrun(tmp_path: Path, *arguments: str) -> str:
    result = two_processes(tmp_path, LAUNCHER, *arguments)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and output.count("NUM_PROCESSES 2") == 2, output[-3000:]
    return output


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
@pytest.mark.slow  # ranks started by torchrun (make test-slow; CI runs it too)
@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)], ids=["2-then-1", "1-then-2"])
def test_a_run_saved_on_one_process_count_resumes_on_another(
    first, then, pretrained_without_dropout, task_dir, tmp_path, monkeypatch
):
    """Global batch 8 (2 x 4 or 1 x 8), stopped after step 6 (epoch 2's first step) and resumed on the other count:
    the run one process makes of it uninterrupted, within float rounding; the loss of the open log window counted
    once, every process's share."""
    reference = plain_recipe(pretrained_without_dropout, task_dir, tmp_path / "reference", log_every=4)
    run_finetune(load_recipe(write_yaml(tmp_path / "reference.yaml", reference)))
    data = plain_recipe(pretrained_without_dropout, task_dir, tmp_path / "run", log_every=4, batch_size=8 // first)
    path = write_yaml(tmp_path / "run.yaml", data)
    if first == 2:
        assert "STOPPED" in torchrun(tmp_path, "run", str(path), "6")
        result = runner.invoke(app, ["finetune", str(path), "training.batch_size=8", "--resume"])
        assert result.exit_code == 0, result.output
        said = " ".join(result.output.split())
    else:
        stopped_run(data, path, monkeypatch, 6)
        said = " ".join(torchrun(tmp_path, "resume", str(path), "training.batch_size=4").split())
    before, after = ("2 processes x batch 4", "1 process x batch 8")[:: 1 if first == 2 else -1]
    assert f"resuming a run saved on {before} on {after}: each optimizer step holds the same 8 examples" in said
    assert f"random draws (dropout) came from {first} generator(s) and now from {then}" in said
    assert_close_runs(tmp_path / "reference", tmp_path / "run")


def test_a_checkpoint_that_predates_the_record_resumes_only_as_it_was_launched(
    pretrained_without_dropout, task_dir, tmp_path, monkeypatch
):
    data = plain_recipe(pretrained_without_dropout, task_dir, tmp_path / "run")
    checkpoint = stopped_run(data, tmp_path / "run.yaml", monkeypatch, 3)
    progress_file = checkpoint / TRAINING_STATE_DIR / PROGRESS_FILE
    progress = json.loads(progress_file.read_text())
    for key in ("processes", "batch_size", "accumulation"):  # as an older finetune wrote it
        del progress[key]
    progress_file.write_text(json.dumps(progress))
    split = ["training.batch_size=4", "training.gradient_accumulation_steps=2"]
    result = runner.invoke(app, ["finetune", str(tmp_path / "run.yaml"), *split, "--resume"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "did not record how its steps were split" in line and "(training.batch_size=8" in line
    result = runner.invoke(app, ["finetune", str(tmp_path / "run.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
