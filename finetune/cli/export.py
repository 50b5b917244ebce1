"""`finetune export`: a fine-tuned classifier in a format that runs without finetune (ONNX)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import _fail
from finetune.errors import RunFailed, UserError


def export(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="A fine-tuned sequence classifier: the checkpoint/ folder `finetune finetune` writes, or its run "
            "folder.",
            show_default=False,
        ),
    ],
    onnx: Annotated[
        bool, typer.Option("--onnx", help="Write model.onnx (the only format so far; the option is required).")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="A new (or empty) folder for model.onnx and the tokenizer; default: onnx/ beside the "
            "checkpoint folder.",
            show_default=False,
        ),
    ] = None,
    opset: Annotated[int, typer.Option(help="The ONNX opset to write (18 or newer).")] = 18,
    quantize: Annotated[
        bool,
        typer.Option(
            "--quantize",
            help="Also write model_int8.onnx (ONNX Runtime's dynamic quantization: int8 weights) and compare it with "
            "model.onnx on the task's dev rows (quantization.json).",
        ),
    ] = False,
) -> None:
    """Export a fine-tuned classifier to ONNX (dynamic batch and sequence length), its tokenizer beside it.

    ONNX Runtime's logits are checked against PyTorch's on a padded batch before the folder is written. Needs the
    `export` extra (onnx, onnxruntime, onnxscript).
    """
    from finetune.commands.export import run_export
    from finetune.commands.quantize import quantize as quantize_graph
    from finetune.commands.quantize import summary
    from finetune.console import quiet_library_chatter

    if not onnx:
        _fail("--onnx: say which format to export (ONNX is the only one): finetune export CHECKPOINT --onnx")
    try:
        quiet_library_chatter()
        exported = run_export(checkpoint, out, opset)
        quantized = quantize_graph(exported.model_file, exported.checkpoint) if quantize else None
    except UserError as error:
        _fail(str(error))
    except RunFailed as error:
        _fail(str(error), code=1)
    typer.echo(written(exported))
    if quantized is not None:
        typer.echo(summary(quantized))


def written(exported) -> str:
    """The line about the graph written: its inputs, its agreement with PyTorch, a calibrated model's rule."""
    calibrated = (
        f"; calibrated probabilities are softmax(logits / {exported.temperature:.4f}), config.json's "
        "calibration_temperature"
        if exported.temperature != 1.0
        else ""
    )
    return (
        f"wrote {exported.model_file} (opset {exported.opset}; inputs {', '.join(exported.inputs)}, batch and "
        f"sequence length dynamic; output logits) with its tokenizer; ONNX Runtime matches PyTorch within "
        f"{exported.difference:.1e}{calibrated}"
    )


def bench(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="A fine-tuned sequence classifier: the checkpoint/ folder `finetune finetune` writes, or its run "
            "folder.",
            show_default=False,
        ),
    ],
    onnx: Annotated[
        Path | None,
        typer.Option(
            help="An export folder (`finetune export --onnx [--quantize]`): its model.onnx and model_int8.onnx are "
            "timed too.",
            show_default=False,
        ),
    ] = None,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input",
            help="The inputs to time, as `finetune predict --input` reads them; default: the checkpoint's dev rows.",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Inputs per call for the throughput.")] = 32,
    latency_inputs: Annotated[int, typer.Option(min=1, help="Calls of one input each for the latency.")] = 100,
    throughput_inputs: Annotated[int, typer.Option(min=1, help="Inputs predicted for the throughput.")] = 512,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as a JSON record.", show_default=False)
    ] = None,
) -> None:
    """Time a fine-tuned classifier on this machine: latency at batch 1 and throughput at a larger batch, for the
    transformers pipeline (the reference), finetune's torch predictor and the ONNX exports; a Markdown table."""
    import json

    from finetune.commands.export import classifier_folder
    from finetune.commands.latency import markdown_table, run_bench
    from finetune.console import console, quiet_library_chatter

    try:
        quiet_library_chatter()
        folder = classifier_folder(checkpoint)
        record = run_bench(folder, onnx, input_file, batch_size, latency_inputs, throughput_inputs, console.print)
    except UserError as error:
        _fail(str(error))
    if json_file is not None:
        json_file.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    typer.echo(markdown_table(record))
