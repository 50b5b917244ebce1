"""The named events of a training run, and the control object its subscribers steer it with.

In the shape of transformers' `TrainerCallback` and fastai's callbacks: the run driver (training/driver.py) and the
loop (training/loop.py) fire each event at one place, in this order, and every part of the run that reacts to one
subscribes to it instead of being called by name:

    on_train_begin                   the run folder exists, the loop is built (not fired again on --resume)
    on_epoch_begin(epoch, batches)   before an epoch's first batch (or, resumed, its next one)
    on_step_begin(epoch)             before each optimizer step's first micro-batch (never inside an accumulation)
    on_evaluate(scores, record)      a dev evaluation is scored (`scores`: what keep-best compares; `record`: what
                                     metrics.jsonl will hold), before it is written: subscribers check it, mark it,
                                     and ask through `control` for a stop or a kept checkpoint
    on_new_best                      the evaluation just scored beat every earlier one
    on_evaluation_written(record)    the evaluation is in metrics.jsonl (every process)
    on_log(record)                   any record was written to metrics.jsonl (the main process)
    on_epoch_end(epoch, record)      after an epoch and its evaluation
    on_save(state)                   a periodic checkpoint is being saved: add your share of the TrainingState
    on_restore(state)                a run resumes: take your share back
    on_train_end                     the result is saved

Every handler receives the training loop (`loop`: its step, phase, total steps and accelerator) and the run's
`Control`. A subscriber that raises stops the run there, as any failure in the loop does (the divergence watch, the
search pruner). Who subscribes, in order, is the driver's `subscribers` (docs/architecture.md lists them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Control:
    """What subscribers ask of the run: read by the loop and the driver after each event."""

    should_stop: bool = False  # end the training after this step (early stopping); the result is still saved
    new_best: bool = False  # the evaluation being handled is the best so far (fires on_new_best, then resets)


class TrainingEvents:
    """A subscriber to a run's events: override the handlers it needs; every one does nothing by default."""

    def on_train_begin(self, loop, control: Control) -> None: ...

    def on_epoch_begin(self, loop, control: Control, epoch: int, batches_done: int) -> None: ...

    def on_step_begin(self, loop, control: Control, epoch: int) -> None: ...

    def on_evaluate(self, loop, control: Control, scores: dict[str, float], record: dict[str, Any]) -> None: ...

    def on_new_best(self, loop, control: Control) -> None: ...

    def on_evaluation_written(self, loop, control: Control, record: dict[str, Any]) -> None: ...

    def on_log(self, loop, control: Control, record: dict[str, Any]) -> None: ...

    def on_epoch_end(self, loop, control: Control, epoch: int, record: dict[str, Any]) -> None: ...

    def on_save(self, loop, control: Control, state) -> None: ...

    def on_restore(self, loop, control: Control, state) -> None: ...

    def on_train_end(self, loop, control: Control) -> None: ...


class Events:
    """The run's subscribers in order, and its one Control: `fire(name, loop, ...)` calls each subscriber's handler.

    Only the handlers a subscriber overrides are called (looked up once per event), so the loop's per-step event
    costs nothing for the subscribers that ignore it."""

    def __init__(self, subscribers: Sequence[TrainingEvents] = ()):
        self.subscribers = list(subscribers)
        self.control = Control()
        self._handlers: dict[str, list] = {}

    def fire(self, event: str, loop, *arguments) -> Control:
        handlers = self._handlers.get(event)
        if handlers is None:
            default = getattr(TrainingEvents, event)  # an unknown event name fails here, not silently
            handlers = [
                getattr(subscriber, event)
                for subscriber in self.subscribers
                if getattr(type(subscriber), event, default) is not default
            ]
            self._handlers[event] = handlers
        for handler in handlers:
            handler(loop, self.control, *arguments)
        return self.control

    def evaluated(self, loop, scores: dict[str, float], record: dict[str, Any]) -> None:
        """on_evaluate, then on_new_best when a subscriber (keep-best) marked the evaluation the best so far."""
        control = self.fire("on_evaluate", loop, scores, record)
        if control.new_best:
            control.new_best = False
            self.fire("on_new_best", loop)
