"""`finetune serve CHECKPOINT`: a fine-tuned checkpoint as an HTTP JSON service (FastAPI on uvicorn).

    POST /predict  {"texts": [...]}  ->  {"predictions": [...]}, one per text, in order
    GET  /health                     ->  {"status": "ok", "checkpoint", "task", "kind", "labels", "served": {...}}

The model is loaded once (`load_predictor`, as `finetune predict` loads it) and each prediction is the dict
`finetune predict` writes for that text, less the text columns it echoes: label and calibrated probabilities, a
score, labels, tags or an answer, by the checkpoint's kind. Every kind whose predictor reads the task's text columns
is served (a pair task takes [first, second]); a multiple-choice model, which reads questions, is refused at start.

Requests are gathered into micro-batches (serve_batching.py) and checked by the request model of serve_requests.py:
a bad request is answered 4xx with one JSON error naming the field; an error inside the model (none is expected) is
a 500 with a JSON error; either way the server goes on serving. fastapi and uvicorn are the `serve` extra's: they
are imported (serve_app.py) when the command runs, never by the rest of the CLI.
"""

from __future__ import annotations

import errno
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from finetune.commands.predict import load_predictor
from finetune.commands.serve_batching import MicroBatcher
from finetune.commands.serve_requests import InputShape, Limits
from finetune.console import console
from finetune.errors import UserError
from finetune.kinds.predictor import TaskPredictor, TextPredictor
from finetune.kinds.registry import kind_of

if TYPE_CHECKING:
    from fastapi import FastAPI

INSTALL_HINT = "pip install 'finetune[serve]' (fastapi, uvicorn)"


@dataclass(frozen=True)
class ServeSettings:
    """How `finetune serve` listens, batches and limits (the CLI's options)."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the line printed at start names it)
    max_batch: int = 32  # texts predicted in one call of the model, at most (a larger request is one call alone)
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others
    batch_size: int = 64  # examples per forward pass inside a call (finetune predict's --batch-size)
    max_length: int | None = None  # tokens per example; None: the checkpoint's task.max_length
    limits: Limits = field(default_factory=Limits)


def missing_packages() -> list[str]:
    """The packages of the `serve` extra that are not installed."""
    missing = []
    try:
        import fastapi  # noqa: F401  (only whether it is installed)
    except ImportError:
        missing.append("fastapi")
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        missing.append("uvicorn")
    return missing


def input_shape(predictor: TaskPredictor) -> InputShape:
    """What one item of a request's `texts` is for this checkpoint; a kind that reads no text columns is refused."""
    if not isinstance(predictor, TextPredictor):
        kind = kind_of(predictor.spec).name
        raise UserError(
            f"CHECKPOINT: a {kind} checkpoint reads its own input layout, not texts: serve takes checkpoints whose "
            "inputs are texts (or pairs); predict its files with `finetune predict`"
        )
    return InputShape(tuple(predictor.spec.text_columns))


def describe_service(checkpoint: str, predictor: TaskPredictor) -> dict[str, Any]:
    """What GET /health says of the model beside its status and counters."""
    spec = predictor.spec
    return {
        "checkpoint": checkpoint,
        "task": spec.name,
        "kind": kind_of(spec).name,
        "labels": list(spec.labels) if spec.labels is not None else None,
        "inputs": list(spec.text_columns),
    }


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for uvicorn to listen on; a port in use or an address that is not this
    machine's is a UserError (one line), found before the server starts."""
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on connections of a socket that says it is TCP; without it
    # a kept-alive client's every answer waited ~40 ms for the delayed ACK of its headers (Nagle's algorithm).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart at once on the port just left
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise UserError(
                f"--port: {host}:{port} is in use; stop what serves there or choose another --port"
            ) from None
        raise UserError(f"--host: cannot listen on {host}:{port} ({error.strerror or error})") from None
    return sock


def build_app(checkpoint: str, settings: ServeSettings) -> FastAPI:
    """The service of a checkpoint, loaded once, ready for uvicorn; its micro-batcher (with the counters) and what
    /health says of the model are in `app.state` (batcher, described). A kind that reads no texts is refused."""
    predictor = load_predictor(checkpoint, settings.batch_size, settings.max_length)
    shape = input_shape(predictor)
    from finetune.commands.serve_app import create_app  # fastapi: the serve extra's, imported when serving

    batcher = MicroBatcher(predictor.predict, settings.max_batch, settings.max_wait_ms / 1000)
    described = describe_service(checkpoint, predictor)
    app = create_app(batcher, shape, settings.limits, described)
    app.state.batcher, app.state.described = batcher, described
    return app


def run_serve(checkpoint: str, settings: ServeSettings, announce: Callable[[str], None]) -> dict[str, int]:
    """The CLI's work: load the checkpoint, bind, serve until Ctrl-C (or SIGTERM); `announce` is given the line
    naming the URL once the socket is bound. Returns the counters of what was served."""
    missing = missing_packages()
    if missing:
        raise UserError(f"serve needs {' and '.join(missing)}: {INSTALL_HINT}")
    import uvicorn

    app = build_app(checkpoint, settings)
    sock = bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=10)
    kind = app.state.described["kind"]
    announce(f"serving {checkpoint} ({kind}) on http://{shown}:{port}: POST /predict and GET /health; Ctrl-C stops")
    previous = signal.signal(signal.SIGTERM, _stop)  # uvicorn shuts down first, then hands the signal on to it
    # What the predictor draws for `finetune predict` (a bar per call, notes on long texts) would be a line per
    # batch here: the server's own output is the line above and uvicorn's warnings.
    console.quiet = True
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except (KeyboardInterrupt, Stopped):  # the server has shut down: Ctrl-C and SIGTERM are how it ends
        pass
    finally:
        console.quiet = False
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return app.state.batcher.stats.as_dict()


class Stopped(Exception):
    """SIGTERM, raised once uvicorn has shut down (it re-raises the signals it caught)."""


def _stop(signum: int, frame: Any) -> None:
    raise Stopped
