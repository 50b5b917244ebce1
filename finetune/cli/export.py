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
) -> None:
    """Export a fine-tuned classifier to ONNX (dynamic batch and sequence length), its tokenizer beside it.

    ONNX Runtime's logits are checked against PyTorch's on a padded batch before the folder is written. Needs the
    `export` extra (onnx, onnxruntime, onnxscript).
    """
    from finetune.commands.export import run_export
    from finetune.console import quiet_library_chatter

    if not onnx:
        _fail("--onnx: say which format to export (ONNX is the only one): finetune export CHECKPOINT --onnx")
    try:
        quiet_library_chatter()
        exported = run_export(checkpoint, out, opset)
    except UserError as error:
        _fail(str(error))
    except RunFailed as error:
        _fail(str(error), code=1)
    calibrated = (
        f"; calibrated probabilities are softmax(logits / {exported.temperature:.4f}), config.json's "
        "calibration_temperature"
        if exported.temperature != 1.0
        else ""
    )
    typer.echo(
        f"wrote {exported.model_file} (opset {exported.opset}; inputs {', '.join(exported.inputs)}, batch and "
        f"sequence length dynamic; output logits) with its tokenizer; ONNX Runtime matches PyTorch within "
        f"{exported.difference:.1e}{calibrated}"
    )
