"""Listeners to the evaluations of training runs: the hook a hyperparameter search prunes by.

Inside `evaluations_reported_to(listener)`, every evaluation of every run is reported to `listener(step, record)`
once it is written to the run's metrics log (`record`: its dev scores, e.g. {"dev_accuracy": 0.8, ...}). An
exception the listener raises stops the run there, as any failure inside the training loop does: the run folder
keeps what it had (metrics.jsonl up to that evaluation), the run's lock is released, nothing is saved as its result
(finetune/stages/search.py raises optuna's TrialPruned and marks the trial pruned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from finetune.training.events import TrainingEvents

EvaluationListener = Callable[[int, dict[str, Any]], None]
_listeners: ContextVar[tuple[EvaluationListener, ...]] = ContextVar("evaluation_listeners", default=())


@contextmanager
def evaluations_reported_to(listener: EvaluationListener) -> Iterator[None]:
    """Report every evaluation of the runs inside the block to `listener` (see the module docstring)."""
    token = _listeners.set((*_listeners.get(), listener))
    try:
        yield
    finally:
        _listeners.reset(token)


def report_evaluation(step: int, record: dict[str, Any]) -> None:
    """Tell the listeners in force (none outside `evaluations_reported_to`) about an evaluation at `step`."""
    for listener in _listeners.get():
        listener(step, record)


class ReportedEvaluations(TrainingEvents):
    """The run's subscriber that reports each evaluation, once written, to the listeners in force (on every process,
    so that a listener's exception stops every process at the same step)."""

    def on_evaluation_written(self, loop, control, record) -> None:
        report_evaluation(loop.step, record)
