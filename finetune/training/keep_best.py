"""Keep-best and early stopping, as subscribers to a run's evaluations (training/events.py).

`KeepBest` follows the best evaluation by one dev metric (the BestSoFar record, carried through a resume), marks
each evaluation record `best_so_far`, and tells the run when one beats every earlier one (`on_new_best`: the stage
saves its weights beside the run). `EarlyStopping` asks the run to stop once `patience` evaluations in a row brought
no new best (training.early_stopping_patience).
"""

from __future__ import annotations

from finetune.training.events import TrainingEvents
from finetune.training.state import BestSoFar


class KeepBest(TrainingEvents):
    def __init__(self, best: BestSoFar):
        self.best = best

    def on_evaluate(self, loop, control, scores, record) -> None:
        if self.best.update(scores, loop.step):
            control.new_best = True
        record["best_so_far"] = self.best.step == loop.step

    def on_save(self, loop, control, state) -> None:
        state.best = self.best.record()

    def on_restore(self, loop, control, state) -> None:
        if state.best is not None:
            self.best.continue_from(state.best)


class EarlyStopping(TrainingEvents):
    """Subscribed after KeepBest, whose record it reads."""

    def __init__(self, best: BestSoFar):
        self.best = best

    def on_evaluate(self, loop, control, scores, record) -> None:
        control.should_stop = self.best.patience_exhausted

    def on_restore(self, loop, control, state) -> None:
        control.should_stop = self.best.patience_exhausted
