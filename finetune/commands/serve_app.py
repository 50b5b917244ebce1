"""`finetune serve`'s FastAPI application: POST /predict, GET /health, and every error as one JSON object.

This module imports fastapi at its top, so only `run_serve` imports it, when the command runs (the `serve` extra);
its endpoints' annotations are real classes (no postponed annotations here): FastAPI reads them to hand an endpoint
its `Request`.
"""

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from finetune._version import __version__
from finetune.commands.serve_batching import MicroBatcher
from finetune.commands.serve_requests import BodyLimit, InputShape, Limits, describe_errors, error_body, request_model
from finetune.errors import UserError

ENDPOINTS = "POST /predict and GET /health"


def create_app(batcher: MicroBatcher, shape: InputShape, limits: Limits, described: dict[str, Any]) -> FastAPI:
    """The service around a micro-batcher (started and stopped with the app) of a checkpoint whose inputs are
    `shape`; `described`: what GET /health says of the model. A body over the limit is refused by BodyLimit before
    it is parsed, one that is not a request by the request model, with one JSON error each."""
    model = request_model(shape, limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        yield
        await batcher.stop()

    title = f"finetune serve {described.get('checkpoint', '')}"
    app = FastAPI(title=title, version=__version__, lifespan=lifespan, redoc_url=None)
    add_error_handlers(app, shape, limits)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    schema = {"content": {"application/json": {"schema": model.model_json_schema()}}, "required": True}

    @app.post("/predict", openapi_extra={"requestBody": schema})
    async def predict(request: Request) -> JSONResponse:
        """Labels and probabilities (or the kind's prediction) of each text, as `finetune predict` gives them."""
        try:
            texts = model.model_validate_json(await request.body()).texts  # type: ignore[attr-defined]
        except ValidationError as error:
            message, name = describe_errors(error.errors(), shape, limits)
            return JSONResponse({"error": message, "field": name}, status_code=422)
        try:
            predictions = await batcher.predict([text if isinstance(text, str) else tuple(text) for text in texts])
        except UserError as error:  # the kind's own check of an input (none is expected past the model above)
            return JSONResponse({"error": f"texts: {error}", "field": "texts"}, status_code=422)
        return JSONResponse({"predictions": predictions})

    @app.get("/health")
    async def health() -> dict:
        """The model served, and how many requests, texts and model calls so far."""
        return {"status": "ok", **described, "served": batcher.stats.as_dict()}

    return app


def add_error_handlers(app: FastAPI, shape: InputShape, limits: Limits) -> None:
    """Every error as {"error": ..., "field": ...}: FastAPI's validation errors (422), its HTTP errors (404, 405)
    and, past them, any exception (500; uvicorn logs its traceback and the server goes on serving)."""

    def reply(status: int, message: str, name: str | None = None) -> Response:
        return Response(error_body(message, name), status_code=status, media_type="application/json")

    async def invalid(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        message, name = describe_errors(list(error.errors()), shape, limits)
        return reply(422, message, name)

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        return reply(
            error.status_code, f"{request.method} {request.url.path}: {error.detail}; the service answers {ENDPOINTS}"
        )

    async def internal(request: Request, error: Exception) -> Response:
        return reply(500, f"internal error ({type(error).__name__}: {error}); the server goes on serving")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal)
