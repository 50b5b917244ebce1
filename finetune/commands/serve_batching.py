"""`finetune serve`'s micro-batching: the requests that arrive together are predicted in one call of the model.

One asyncio task gathers the pending requests (up to `max_batch` texts, or what came within `max_wait` seconds of
the first) and runs the predictor once for all of them in a single worker thread, so the event loop keeps accepting
requests while the model runs and the model never runs twice at once (a torch model is not made for concurrent
calls, and on a CPU one call already uses every core). Requests that arrive while a batch runs are gathered for the
next one without waiting: under load the batches fill by themselves; with one client the wait is `max_wait` at most,
and none with a `max_batch` of 1.

A batch whose call fails is retried one request at a time, so that one request's bad input fails that request
alone; the others are answered as if it had not been sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

Predict = Callable[[list[Any]], list[dict]]


@dataclass
class Pending:
    """One request's inputs and the future its handler awaits."""

    inputs: list[Any]
    future: asyncio.Future = field(repr=False)


@dataclass
class BatchStats:
    """What the server has done, shown by GET /health: a client (or a test) sees that requests were batched when
    `model_calls` is below `requests`."""

    requests: int = 0  # answered with predictions
    texts: int = 0  # in those requests
    model_calls: int = 0  # calls of the predictor, each on one micro-batch
    largest_batch: int = 0  # the most texts one call predicted

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class MicroBatcher:
    """Gathers requests into micro-batches and predicts each batch in one call on one worker thread."""

    def __init__(self, predict: Predict, max_batch: int, max_wait: float):
        self.predict_batch, self.max_batch, self.max_wait = predict, max_batch, max_wait
        self.stats = BatchStats()
        self._queue: asyncio.Queue[Pending] | None = None
        self._held: Pending | None = None  # a request that would have overfilled the last batch: the next one's first
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Begin gathering (inside the server's event loop, which owns the queue)."""
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="finetune-serve-model")
        self._task = asyncio.create_task(self._gather_forever())

    async def stop(self) -> None:
        """Stop gathering; requests still waiting are told the server is stopping; a model call in flight ends."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        waiting = [self._held] if self._held is not None else []
        while self._queue is not None and not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for pending in waiting:
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("the server is stopping"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def predict(self, inputs: Sequence[Any]) -> list[dict]:
        """The predictions of one request's inputs, in their order, predicted with whatever else is pending."""
        assert self._queue is not None, "start() the batcher first"
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(Pending(list(inputs), future))
        return await future

    async def _gather_forever(self) -> None:
        while True:
            batch = await self._next_batch()
            try:
                await self._run(batch)
            except Exception as error:  # a fault of the batching itself must not stop it: that batch gets the error
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)

    async def _next_batch(self) -> list[Pending]:
        """The next batch: the first pending request, then those already queued or arriving before the deadline,
        while the texts fit in max_batch (a single request larger than max_batch is a batch of its own)."""
        assert self._queue is not None
        first = self._held if self._held is not None else await self._queue.get()
        self._held = None
        batch, size = [first], len(first.inputs)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        while size < self.max_batch:
            pending = await self._next_pending(deadline - loop.time())
            if pending is None:
                break
            if size + len(pending.inputs) > self.max_batch:
                self._held = pending
                break
            batch.append(pending)
            size += len(pending.inputs)
        return batch

    async def _next_pending(self, seconds: float) -> Pending | None:
        """A request already queued, or one that arrives within `seconds`; None when none does."""
        assert self._queue is not None
        if not self._queue.empty():
            return self._queue.get_nowait()
        if seconds <= 0:
            return None
        try:
            return await asyncio.wait_for(self._queue.get(), seconds)
        except asyncio.TimeoutError:
            return None

    async def _run(self, batch: list[Pending]) -> None:
        """Predict a batch in one call and hand each request its slice; a failed call of several requests is
        retried one request at a time, so that the error reaches the request that caused it alone."""
        batch = [pending for pending in batch if not pending.future.done()]  # a client that went away
        if not batch:
            return
        inputs = [item for pending in batch for item in pending.inputs]
        assert self._executor is not None
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.predict_batch, inputs)
            if len(results) != len(inputs):
                raise RuntimeError(f"the predictor gave {len(results)} results for {len(inputs)} inputs")
        except Exception as error:
            if len(batch) > 1:
                for pending in batch:
                    await self._run([pending])
            elif not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        self._count(batch, len(inputs))
        start = 0
        for pending in batch:
            end = start + len(pending.inputs)
            if not pending.future.done():
                pending.future.set_result(results[start:end])
            start = end

    def _count(self, batch: list[Pending], texts: int) -> None:
        self.stats.requests += len(batch)
        self.stats.texts += texts
        self.stats.model_calls += 1
        self.stats.largest_batch = max(self.stats.largest_batch, texts)
