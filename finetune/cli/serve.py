"""`finetune serve`: a fine-tuned checkpoint as an HTTP JSON prediction service."""

from __future__ import annotations

from typing import Annotated

import typer

from finetune.cli.common import _fail, refuse_missing_model_folder
from finetune.errors import UserError

# serve's options, named here to keep its signature readable
CheckpointArgument = Annotated[
    str,
    typer.Argument(
        help="A checkpoint fine-tuned by `finetune finetune` (its checkpoint/ folder), or a hub name.",
        show_default=False,
    ),
]
HostOption = Annotated[
    str, typer.Option(help="The address to listen on; 0.0.0.0 serves other machines too (no authentication).")
]
PortOption = Annotated[int, typer.Option(min=0, max=65535, help="The port; 0: any free one (the line printed says).")]
MaxBatchOption = Annotated[
    int, typer.Option(min=1, help="Texts predicted together in one call of the model, at most (micro-batching).")
]
MaxWaitOption = Annotated[
    float,
    typer.Option(min=0, help="Milliseconds a request waits for others to join its batch (not with --max-batch 1)."),
]
MaxTextsOption = Annotated[int, typer.Option(min=1, help="Texts per request, at most (more: 422).")]
MaxCharsOption = Annotated[int, typer.Option(min=1, help="Characters per text, at most (more: 422).")]
MaxBodyOption = Annotated[
    int, typer.Option(min=1, help="Bytes of a request's body, at most; refused before it is parsed (413).")
]
BatchSizeOption = Annotated[int, typer.Option(min=1, help="Examples per forward pass within one call.")]
MaxLengthOption = Annotated[
    int | None, typer.Option(min=1, help="Tokens per example; default: the checkpoint's task.max_length.")
]


def serve(
    checkpoint: CheckpointArgument,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    max_batch: MaxBatchOption = 32,
    max_wait_ms: MaxWaitOption = 5.0,
    max_texts: MaxTextsOption = 256,
    max_chars: MaxCharsOption = 50_000,
    max_body_bytes: MaxBodyOption = 4_000_000,
    batch_size: BatchSizeOption = 64,
    max_length: MaxLengthOption = None,
) -> None:
    """Serve a fine-tuned checkpoint over HTTP: POST /predict {"texts": [...]} gives what `finetune predict` gives.

    Requests arriving together are predicted in one call of the model (micro-batching); GET /health names the
    model and counts what was served. A bad request gets a 4xx JSON error naming the field, and the server goes on
    serving. Needs the `serve` extra (fastapi, uvicorn). Ctrl-C stops it.
    """
    refuse_missing_model_folder(checkpoint)
    from finetune.commands.serve import ServeSettings, run_serve
    from finetune.commands.serve_requests import Limits
    from finetune.console import quiet_library_chatter

    settings = ServeSettings(
        host=host,
        port=port,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        batch_size=batch_size,
        max_length=max_length,
        limits=Limits(max_texts=max_texts, max_chars=max_chars, max_body_bytes=max_body_bytes),
    )

    try:
        quiet_library_chatter()
        served = run_serve(checkpoint, settings, typer.echo)
    except UserError as error:
        _fail(str(error))
    except KeyboardInterrupt:  # Ctrl-C while the checkpoint loads: nothing was served
        typer.echo("stopped", err=True)
        raise typer.Exit(code=130) from None
    typer.echo(
        f"stopped: served {served['requests']:,} request(s), {served['texts']:,} text(s), in "
        f"{served['model_calls']:,} model call(s)"
    )
