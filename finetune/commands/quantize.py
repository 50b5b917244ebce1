"""`finetune export --onnx --quantize`: the exported graph with int8 weights beside it, and what that costs on the
task's dev rows.

ONNX Runtime's dynamic quantization (`onnxruntime.quantization.quantize_dynamic`): the weights of every linear layer
(the graph's MatMul and Gemm nodes) are stored as int8, one scale per output channel, and the activations are quantized
batch by batch as the graph runs, so no calibration data is needed; the embeddings and LayerNorms stay fp32. It
writes a graph ONNX Runtime runs alone (no torch, no finetune), which is what a quantized export is for; torch's
dynamic quantization gives a torch model, which neither the ONNX exporter nor a server without torch can take.
bench/int8_speed.py measures both on CPU (docs/ship-it.md has the table).

The cost is measured, not assumed: both graphs predict the dev rows the checkpoint was scored on (the task's dev
file, or the rows task.dev_split held out), read as `finetune predict` reads them, and the task's metrics of each,
with the share of predictions on which they agree, are printed and written to quantization.json beside the graphs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from finetune.commands.predict import load_predictor
from finetune.errors import RunFailed, UserError
from finetune.inference.predict import logits_to_predictions
from finetune.kinds.dev_split import dev_examples
from finetune.recipes import FinetuneRecipe, load_recipe
from finetune.tasks.metrics import compute_metrics
from finetune.training.checkpoints import HYPERPARAMETERS_FILE

QUANTIZED_FILE = "model_int8.onnx"
REPORT_FILE = "quantization.json"
METHOD = (
    "ONNX Runtime dynamic quantization: int8 weights of the linear layers (MatMul, Gemm), a scale per output channel; "
    "activations per batch"
)


@dataclass(frozen=True)
class Quantized:
    """What `quantize` wrote: the int8 graph, both graphs' sizes, and the dev comparison (or why there is none)."""

    model_file: Path
    fp32_bytes: int
    int8_bytes: int
    dev: dict[str, Any] | None
    dev_not_measured: str | None = None


class GraphClassifier(nn.Module):
    """An ONNX Runtime session in the place of the classifier a predictor runs: the graph's logits for the same
    batches (the inputs it was exported with; `config`, the checkpoint's, says how examples are read)."""

    def __init__(self, graph: Path, config):
        super().__init__()
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self.input_names = [graph_input.name for graph_input in self.session.get_inputs()]
        self.config = config

    def forward(self, **batch: torch.Tensor) -> SequenceClassifierOutput:
        feed = {name: batch[name].cpu().numpy() for name in self.input_names}
        (logits,) = self.session.run(["logits"], feed)
        return SequenceClassifierOutput(logits=torch.from_numpy(logits))


def quantize(graph: Path, checkpoint: Path) -> Quantized:
    """Write `graph` (model.onnx) with int8 weights beside it as model_int8.onnx, compare the two on `checkpoint`'s
    dev rows, and write quantization.json; the int8 file appears under its name only once complete."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = graph.with_name(QUANTIZED_FILE)
    partial = graph.with_name(QUANTIZED_FILE + ".partial")
    try:
        # One scale per output channel: on MiniLM / SST-2, 0.6 points below fp32 where one per tensor lost 1.3.
        quantize_dynamic(graph, partial, weight_type=QuantType.QInt8, per_channel=True)
    except Exception as error:  # ONNX Runtime's own errors run to pages: their first line
        partial.unlink(missing_ok=True)
        cause = str(error).strip().splitlines() or [type(error).__name__]
        raise RunFailed(f"ONNX Runtime could not quantize {graph} ({cause[0]}); model.onnx is written") from None
    os.replace(partial, target)
    try:
        dev, reason = dev_comparison(checkpoint, {"fp32": graph, "int8": target}), None
    except UserError as error:  # the task's data moved, or its dev rows hold no labels: say so, keep the graph
        dev, reason = None, str(error)
    quantized = Quantized(target, graph.stat().st_size, target.stat().st_size, dev, reason)
    write_report(quantized, graph.parent / REPORT_FILE)
    return quantized


def dev_comparison(checkpoint: Path, graphs: dict[str, Path]) -> dict[str, Any]:
    """{"rows", "metrics": {graph: the task's metrics}, "agreement": share of rows predicted alike} of each graph on
    the checkpoint's dev rows, read as `finetune predict` reads an example."""
    recipe = load_recipe(checkpoint / HYPERPARAMETERS_FILE, expected_stage="finetune", check_paths=False)
    assert isinstance(recipe, FinetuneRecipe)  # expected_stage: any other recipe is refused
    predictor: Any = load_predictor(str(checkpoint))  # a classifier's (regression's, multi-label's) dataclass
    examples = dev_examples(predictor.spec, recipe.task, [checkpoint])
    if examples.labels is None:
        raise UserError(f"the dev rows of task '{predictor.spec.name}' hold no labels to score against")
    logits = {  # the line on examples longer than max_length once, for the first graph
        name: replace(predictor, model=GraphClassifier(path, predictor.model.config)).logits(
            examples, "dev" if index == 0 else None
        )
        for index, (name, path) in enumerate(graphs.items())
    }
    labels = np.asarray(examples.labels)
    metrics = {
        name: compute_metrics(predictor.spec, logits_to_predictions(predictor.spec, values), labels)
        if labels.ndim == 1  # a class or a score per row; a multi-label task's rows are label sets: agreement alone
        else {}
        for name, values in logits.items()
    }
    decided = [decisions(predictor.results(values)) for values in logits.values()]
    agree = [first == second for first, second in zip(*decided)] if len(decided) == 2 and any(decided[0]) else None
    return {"rows": len(labels), "metrics": metrics, "agreement": None if agree is None else float(np.mean(agree))}


def decisions(rows: list[dict]) -> list[dict]:
    """What each result decides (its label, or labels), without the numbers it decided by; a regression's score is
    a number only, so its rows decide nothing (agreement is not counted)."""
    return [{key: value for key, value in row.items() if key not in ("probabilities", "score")} for row in rows]


def write_report(quantized: Quantized, path: Path) -> None:
    report = {
        "method": METHOD,
        "files": {"fp32": quantized.model_file.with_name("model.onnx").name, "int8": quantized.model_file.name},
        "bytes": {"fp32": quantized.fp32_bytes, "int8": quantized.int8_bytes},
        "dev": quantized.dev,
        "dev_not_measured": quantized.dev_not_measured,
    }
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def summary(quantized: Quantized) -> str:
    """The command's lines about the int8 graph: its size, then its dev score beside fp32's (or why not measured)."""
    megabytes = (quantized.fp32_bytes / 1e6, quantized.int8_bytes / 1e6)
    written = (
        f"wrote {quantized.model_file} (int8 weights: {megabytes[1]:.1f} MB, {megabytes[0]:.1f} MB in fp32; "
        "ONNX Runtime runs it alone)"
    )
    lines = [written]
    dev = quantized.dev
    if dev is None:
        lines.append(f"dev score not measured: {quantized.dev_not_measured}")
        return "\n".join(lines)
    scores = []
    for metric, fp32 in dev["metrics"]["fp32"].items():
        int8 = dev["metrics"]["int8"][metric]
        scores.append(f"{metric} {fp32:.4f} fp32, {int8:.4f} int8 ({100 * (int8 - fp32):+.2f} points)")
    agreement = "" if dev["agreement"] is None else f"; the graphs agree on {100 * dev['agreement']:.1f}% of rows"
    lines.append(f"dev ({dev['rows']} rows): {'; '.join(scores) or 'no per-row score'}{agreement}; {REPORT_FILE}")
    return "\n".join(lines)
