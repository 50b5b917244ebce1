"""What `finetune serve` accepts: the request body of POST /predict, its limits, and a bad request's one message.

A request is `{"texts": [...]}`: each item a string, or for a task of several text columns (a sentence pair, a
question and its context) a list of that many strings, in the task's column order. The body is checked by a
pydantic model made for the checkpoint (`request_model`), and every refusal is one JSON object,
`{"error": "FIELD: what is wrong and what to send", "field": "FIELD"}` (`describe_errors`), with a 4xx status.

The body's size is capped before it is parsed (`BodyLimit`, an ASGI middleware): a declared Content-Length over the
limit is refused at once, and a body streamed without one is counted as it arrives and refused when it passes the
limit; the rest of an oversized body is read and dropped (up to DRAIN_LIMIT), so that the client reads the 413
instead of a connection reset (a client that waits for "100 Continue" before it sends is answered at once).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BODY_EXAMPLE = '{"texts": ["a text", ...]}'
DRAIN_LIMIT = 256 * 2**20  # bytes of an oversized body read and dropped before the connection is left to close


@dataclass(frozen=True)
class Limits:
    """What one request may hold (the CLI's --max-texts, --max-chars, --max-body-bytes)."""

    max_texts: int = 256
    max_chars: int = 50_000
    max_body_bytes: int = 4_000_000


@dataclass(frozen=True)
class InputShape:
    """What one item of `texts` is for a checkpoint: its task's text columns, one (a string) or several (a list)."""

    columns: tuple[str, ...]

    @property
    def described(self) -> str:
        if len(self.columns) == 1:
            return "a string"
        return f"a list of {len(self.columns)} strings [{', '.join(self.columns)}]"

    def example(self) -> str:
        if len(self.columns) == 1:
            return BODY_EXAMPLE
        return '{"texts": [[' + ", ".join(f'"{column}"' for column in self.columns) + "], ...]}"


def request_model(shape: InputShape, limits: Limits) -> type[BaseModel]:
    """The pydantic model of POST /predict's body for a checkpoint's inputs, within `limits`; unknown fields refused
    (a misspelt `text` is named, not ignored)."""
    text = Annotated[str, StringConstraints(max_length=limits.max_chars)]
    item: Any = text if len(shape.columns) == 1 else tuple[(text,) * len(shape.columns)]  # type: ignore[misc]
    texts = Annotated[list[item], Field(min_length=1, max_length=limits.max_texts)]
    return create_model("PredictRequest", __config__=ConfigDict(extra="forbid", strict=True), texts=(texts, ...))


def field_name(location: tuple[Any, ...]) -> str:
    """A pydantic error's location as a client writes it: texts[3][1]; `body` for the body itself."""
    parts = [part for part in location if part != "body"] if location[:1] == ("body",) else list(location)
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "body"


def json_type(value: Any) -> str:
    """What a JSON value is, in the words of an error message."""
    if isinstance(value, str):
        return f"a string of {len(value):,} characters" if len(value) > 80 else "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return "null"


def describe_error(error: Any, shape: InputShape, limits: Limits) -> str:
    """One pydantic error as `FIELD: what is wrong; what to send`."""
    field, kind, context = field_name(tuple(error["loc"])), error["type"], error.get("ctx") or {}
    value = error.get("input")
    if kind == "json_invalid":
        return f"body: not valid JSON ({context.get('error', error['msg'])}); send {shape.example()}"
    if field == "body" or kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"body: expected a JSON object, got {json_type(value)}; send {shape.example()}"
    if kind == "missing" and field.count("[") == 2:  # a pair of one text: the item is what is wrong
        return f"{field.rpartition('[')[0]}: expected {shape.described}, got {json_type(value)}"
    if kind == "missing":
        return f"{field}: missing; send {shape.example()}"
    if kind == "extra_forbidden":
        return f"{field}: unknown field; the body is {shape.example()}"
    if field == "texts":
        if kind == "too_short":
            return "texts: empty; send at least one text"
        if kind == "too_long":
            return (
                f"texts: {len(value):,} texts, at most {limits.max_texts:,} per request (--max-texts); send them "
                "in several requests"
            )
        return f"texts: expected a list, got {json_type(value)}; send {shape.example()}"
    if kind == "string_too_long":
        return f"{field}: {len(value):,} characters, at most {limits.max_chars:,} per text (--max-chars)"
    if field.count("[") == 1:  # an item of texts
        return f"{field}: expected {shape.described}, got {json_type(value)}"
    return f"{field}: expected a string, got {json_type(value)}"  # a string of a pair


def describe_errors(errors: list[Any], shape: InputShape, limits: Limits) -> tuple[str, str]:
    """The message and field of a refused body: its first error, an error of `texts` as a whole before any of its
    items (1,000 texts are refused for their number, not for the first one too long)."""
    whole = [error for error in errors if field_name(tuple(error["loc"])) in ("body", "texts")]
    first = (whole or errors)[0]
    message = describe_error(first, shape, limits)
    unknown = [field_name(tuple(error["loc"])) for error in errors if error["type"] == "extra_forbidden"]
    if first["type"] == "missing" and unknown:  # a misspelt field: both names in one message
        message = message.replace(": missing;", f": missing (the body has {', '.join(unknown)});", 1)
    return message, message.partition(": ")[0]  # the field the message names


def error_body(message: str, field: str | None = None) -> bytes:
    """A refusal's JSON: {"error": message, "field": field}."""
    return json.dumps({"error": message, **({"field": field} if field else {})}, separators=(",", ":")).encode()


def body_too_large(size: int, limit: int, declared: bool) -> bytes:
    """The refusal of a body over the limit: its declared size, or (streamed) that it passed the limit."""
    size_said = f"{size:,} bytes" if declared else f"over {limit:,} bytes"
    return error_body(
        f"body: {size_said}, at most {limit:,} per request (--max-body-bytes); send fewer or shorter texts per request",
        "body",
    )


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 with a JSON error before the app sees it;
    a body within the limit is read whole here and handed on as one message."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if headers.get(b"expect", b"").lower() != b"100-continue":  # curl's large bodies wait to be asked for
                await self._drain(receive, 0)
            await self._refuse(send, body_too_large(int(declared), self.max_bytes, declared=True))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await self._drain(receive, size)
                await self._refuse(send, body_too_large(self.max_bytes, self.max_bytes, declared=False))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    @staticmethod
    async def _drain(receive: Receive, size: int) -> None:
        """Read the rest of the body and drop it (up to DRAIN_LIMIT bytes)."""
        while size <= DRAIN_LIMIT:
            message = await receive()
            size += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    @staticmethod
    async def _refuse(send: Send, body: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read in one message, then waits on the client (for its disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
