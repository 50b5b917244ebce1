"""Two "machines" on this host: two torchrun launchers of one process each, joined by a static rendezvous on
127.0.0.1 (what `accelerate launch --num_machines 2 --machine_rank R` starts on each machine), against one process
with the same global batch; and a machine killed mid-run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.finetune import run_finetune
from finetune.training.checkpoints import latest_training_checkpoint
from tests.conftest import REPO_ROOT, finetune_recipe, save_tiny_masked_lm, write_task, write_yaml
from tests.training.test_relaunch import assert_close_runs

pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="needs torch.distributed with gloo",
    ),
    pytest.mark.slow,  # ranks started by torchrun (make test-slow; CI runs it too)
]
TOLERANCE = 1e-5  # as tests/cli/test_distributed.py: only the order of floating-point sums differs

# One machine's process: reports the launch it sees, then runs the CLI; with SLOW_STEPS set, each optimizer step
# waits a little, so that a test can kill the other machine mid-run.
LAUNCHER = textwrap.dedent("""
    import os, sys, time
    from accelerate import PartialState
    from finetune.cli import app
    from finetune.training import loop as loop_module

    state = PartialState(cpu=True)
    machine = os.environ["GROUP_RANK"]
    print(f"PROCESS {state.process_index} OF {state.num_processes} ON MACHINE {machine} PID {os.getpid()}", flush=True)
    if os.environ.get("SLOW_STEPS"):
        step = loop_module.TrainingLoop._optimizer_step

        def slow_step(self, *arguments, **keywords):
            time.sleep(float(os.environ["SLOW_STEPS"]))
            return step(self, *arguments, **keywords)

        loop_module.TrainingLoop._optimizer_step = slow_step
    app(sys.argv[1:], prog_name="finetune")
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_machine(tmp_path: Path, rank: int, port: int, *arguments: str, **environ: str) -> subprocess.Popen:
    """Machine `rank` of 2: torchrun with one process, the main process's address 127.0.0.1:`port`."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port), str(launcher),
               *arguments]  # fmt: skip
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(REPO_ROOT), **environ}  # fmt: skip
    log = open(tmp_path / f"machine-{rank}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=tmp_path, start_new_session=True
    )


def finish(machine: subprocess.Popen, timeout: float = 240) -> int:
    try:
        return machine.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(machine.pid, signal.SIGKILL)
        raise


def test_two_machines_of_one_process_train_as_one_process(tmp_path):
    pretrained = save_tiny_masked_lm(tmp_path / "pretrained", dropout=0.0)
    task = write_task(tmp_path / "task", train_rows=33, dev_rows=23)

    def data(name: str, batch_size: int) -> dict:
        recipe = finetune_recipe(pretrained, task, tmp_path / name)
        recipe["classifier_dropout"] = 0.0
        recipe["training"]["batch_size"] = batch_size
        return recipe

    run_finetune(load_recipe(write_yaml(tmp_path / "single.yaml", data("single", 16))))
    path = write_yaml(tmp_path / "machines.yaml", data("machines", 8))
    port = free_port()
    machines = [start_machine(tmp_path, rank, port, "finetune", str(path)) for rank in (0, 1)]
    codes = [finish(machine) for machine in machines]
    logs = [(tmp_path / f"machine-{rank}.log").read_text() for rank in (0, 1)]
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert "PROCESS 0 OF 2 ON MACHINE 0" in logs[0] and "PROCESS 1 OF 2 ON MACHINE 1" in logs[1]
    steps = [
        record["step"] for record in read_metrics(tmp_path / "machines" / "metrics.jsonl") if record["phase"] == "train"
    ]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert_close_runs(tmp_path / "single", tmp_path / "machines", TOLERANCE)


def test_a_killed_machine_stops_the_run_with_a_message_and_a_checkpoint_to_resume(tmp_path):
    pretrained = save_tiny_masked_lm(tmp_path / "pretrained")
    data = finetune_recipe(pretrained, write_task(tmp_path / "task"), tmp_path / "run")
    data.update({"checkpoint_every": 1})
    data["training"]["epochs"] = 20
    path = write_yaml(tmp_path / "recipe.yaml", data)
    port = free_port()
    machines = [start_machine(tmp_path, rank, port, "finetune", str(path), SLOW_STEPS="0.3") for rank in (0, 1)]
    deadline = time.monotonic() + 120
    while latest_training_checkpoint(tmp_path / "run") is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert latest_training_checkpoint(tmp_path / "run") is not None, (tmp_path / "machine-0.log").read_text()[-2000:]
    # The second machine goes away: its training process and its launcher (torchrun starts the process in a session
    # of its own, so the launcher's group alone would leave it running).
    worker = int(re.search(r"PID (\d+)", (tmp_path / "machine-1.log").read_text()).group(1))
    os.kill(worker, signal.SIGKILL)
    os.killpg(machines[1].pid, signal.SIGKILL)
    code = finish(machines[0], timeout=180)
    log = (tmp_path / "machine-0.log").read_text()
    assert code != 0, log[-2000:]
    said = " ".join(log.split())
    checkpoint = latest_training_checkpoint(tmp_path / "run")
    # The line is ours; its cause in brackets is gloo's, whose words vary with where the death is seen
    # ("Connection closed by peer", "Read error ...: Connection reset by peer", a broken pipe).
    assert re.search(r"error: another process stopped after \d+ optimizer step\(s\) \(.+\); the newest", said)
    unwrapped = "".join(log.split())  # the console wraps long lines, paths included
    assert f"thenewestcheckpointis{checkpoint}:starteveryprocessagainwith--resume" in unwrapped
    # The checkpoint resumes, here on one process with the same global batch (2 x 8 = 1 x 16).
    result = CliRunner().invoke(app, ["finetune", str(path), "training.batch_size=16", "--resume"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()
