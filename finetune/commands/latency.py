"""`finetune bench CHECKPOINT`: how fast a fine-tuned classifier predicts on this machine, in each form it ships in.

Each engine predicts the same inputs (the checkpoint's dev rows, or --input's), read as `finetune predict` reads them:

- the transformers `pipeline("text-classification")` on the same model: the reference a user would write;
- finetune's predictor in torch fp32 (`finetune predict`, `finetune.predict`): length-sorted batches, and BERT
  classifiers computing their real tokens only;
- ONNX Runtime on the export's model.onnx (fp32) and model_int8.onnx (`finetune export --onnx --quantize`), when
  the folder holds them, through the same predictor (the same tokenization and batching; the graph in place of the
  model).

For each: latency at batch 1 (one input per call, tokenization included: median and 95th percentile over
`latency_inputs` calls, after warm-up calls) and throughput at `batch_size` (inputs per second over
`throughput_inputs` inputs, after one warm-up batch). torch and ONNX Runtime use their default threads (every core);
the table and the JSON record name the CPU, its cores and torch's threads beside the figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from finetune.commands.export import MODEL_FILE
from finetune.commands.predict import load_predictor
from finetune.commands.quantize import QUANTIZED_FILE, GraphClassifier
from finetune.console import silenced
from finetune.errors import UserError
from finetune.kinds.predictor import predict_inputs
from finetune.models.flops import cpu_model
from finetune.models.heads import fitted_max_length
from finetune.recipes import FinetuneRecipe, load_recipe
from finetune.training.checkpoints import HYPERPARAMETERS_FILE

WARMUP_CALLS = 3
PIPELINE = "transformers pipeline"


@dataclass(frozen=True)
class Timing:
    """One engine's figures: latency at batch 1 (milliseconds) and throughput at the batch size (inputs/s)."""

    engine: str
    median_ms: float
    p95_ms: float
    inputs_per_second: float


@dataclass(frozen=True)
class Engine:
    """A way to predict a list of inputs (a text, or a tuple of a pair task's texts, each)."""

    name: str
    predict: Callable[[list], Any]


def read_inputs(predictor: Any, checkpoint: Path, source: Path | None) -> list:
    """The inputs to time: --input's examples, else the dev rows the checkpoint was scored on."""
    if source is not None:
        if not source.is_file():
            raise UserError(f"--input: no such file: {source}")
        inputs = predict_inputs(predictor.read_source(str(source), None))
    else:
        recipe = load_recipe(checkpoint / HYPERPARAMETERS_FILE, expected_stage="finetune", check_paths=False)
        assert isinstance(recipe, FinetuneRecipe)  # expected_stage: any other recipe is refused
        try:
            inputs = predictor.dev_inputs(recipe.task, checkpoint)
        except UserError as error:
            raise UserError(f"{error}; give the inputs to time with --input FILE") from None
    if not inputs:
        raise UserError("no inputs to time: --input (or the dev rows) holds no example")
    return inputs


def engines(predictor: Any, onnx: Path | None, batch_size: int) -> list[Engine]:
    """The pipeline, our torch predictor, and the ONNX graphs `onnx` holds (an export folder)."""
    found = [
        Engine(PIPELINE, pipeline_predict(predictor, batch_size)),
        Engine("finetune, torch fp32", predictor.predict),
    ]
    if onnx is None:
        return found
    graphs = [(name, onnx / file) for name, file in (("fp32", MODEL_FILE), ("int8", QUANTIZED_FILE))]
    if not any(path.is_file() for _, path in graphs):
        raise UserError(f"--onnx: {onnx} holds no {MODEL_FILE} (finetune export CHECKPOINT --onnx writes one)")
    for name, path in graphs:
        if path.is_file():
            graph = GraphClassifier(path, predictor.model.config)
            found.append(Engine(f"finetune, ONNX Runtime {name}", replace(predictor, model=graph).predict))
    return found


def pipeline_predict(predictor: Any, batch_size: int) -> Callable[[list], Any]:
    """transformers' text-classification pipeline on the predictor's model and tokenizer, cutting inputs at the
    length the predictor reads."""
    from transformers import pipeline

    classify = pipeline("text-classification", model=predictor.model, tokenizer=predictor.tokenizer, device="cpu")
    length = fitted_max_length(predictor.reading.max_length, predictor.model)

    def predict(inputs: list) -> Any:
        given: Any = [item if isinstance(item, str) else {"text": item[0], "text_pair": item[1]} for item in inputs]
        return classify(given, batch_size=batch_size, truncation=True, max_length=length)

    return predict


def time_engine(engine: Engine, inputs: list, latency_inputs: int, throughput_inputs: int, batch_size: int) -> Timing:
    """Latency at batch 1 over the first `latency_inputs` inputs, throughput over `throughput_inputs` of them."""
    singles = repeat_to(inputs, latency_inputs)
    for item in singles[:WARMUP_CALLS]:
        engine.predict([item])
    seconds = []
    for item in singles:
        started = time.perf_counter()
        engine.predict([item])
        seconds.append(time.perf_counter() - started)
    batch = repeat_to(inputs, throughput_inputs)
    engine.predict(batch[:batch_size])
    started = time.perf_counter()
    engine.predict(batch)
    elapsed = time.perf_counter() - started
    milliseconds = 1000 * np.asarray(seconds)
    return Timing(
        engine.name, float(np.median(milliseconds)), float(np.percentile(milliseconds, 95)), len(batch) / elapsed
    )


def repeat_to(inputs: Sequence, count: int) -> list:
    """`count` inputs: the first ones, cycled when there are fewer."""
    return [inputs[index % len(inputs)] for index in range(count)]


def run_bench(
    checkpoint: Path,
    onnx: Path | None = None,
    source: Path | None = None,
    batch_size: int = 32,
    latency_inputs: int = 100,
    throughput_inputs: int = 512,
    progress: Callable[[str], None] = lambda line: None,
) -> dict:
    """The JSON record of the benchmark: the machine, the inputs and each engine's Timing."""
    if min(batch_size, latency_inputs, throughput_inputs) < 1:
        raise UserError("--batch-size, --latency-inputs and --throughput-inputs: give 1 or more")
    predictor = load_predictor(str(checkpoint), batch_size)
    inputs = read_inputs(predictor, checkpoint, source)
    timings = []
    for engine in engines(predictor, onnx, batch_size):
        progress(f"timing {engine.name}")
        with silenced():  # the predictor's notes (examples cut at max_length) at every call
            timings.append(time_engine(engine, inputs, latency_inputs, throughput_inputs, batch_size))
    return {
        "checkpoint": str(checkpoint),
        "onnx": None if onnx is None else str(onnx),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "inputs": "the dev rows" if source is None else str(source),
        "batch_size": batch_size,
        "latency_inputs": latency_inputs,
        "throughput_inputs": throughput_inputs,
        "engines": [asdict(timing) for timing in timings],
    }


def markdown_table(record: dict) -> str:
    """The record as a Markdown table, each engine beside the pipeline's figures."""
    reference = next(engine for engine in record["engines"] if engine["engine"] == PIPELINE)
    title = (
        f"Prediction speed of {record['checkpoint']} on {record['cpu']} ({record['cores']} cores, torch "
        f"{record['torch_threads']} threads); latency at batch 1 over {record['latency_inputs']} calls, "
        f"throughput at batch {record['batch_size']} over {record['throughput_inputs']} inputs"
    )
    lines = [
        title,
        "",
        "| engine | latency median (ms) | latency p95 (ms) | throughput (inputs/s) | vs the pipeline |",
        "|---|---:|---:|---:|---:|",
    ]
    for engine in record["engines"]:
        ratio = engine["inputs_per_second"] / reference["inputs_per_second"]
        lines.append(
            f"| {engine['engine']} | {engine['median_ms']:.1f} | {engine['p95_ms']:.1f} | "
            f"{engine['inputs_per_second']:,.0f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)
