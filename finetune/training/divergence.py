"""When a run has diverged, and the one line that says so: a non-finite training loss or gradient norm (the
loop finds those), or a validation loss that is not finite or has risen far above the run's first one.

"Far above" is `training.divergence_factor` times the first evaluation's validation loss, and at least one more
than it: a first loss near zero (an easy task) would otherwise stop a run that merely overfits a little.
Overfitting moves a validation loss by a factor of a few; a learning rate that is too high moves it by orders of
magnitude (or to nan). There is no evaluation before the first step, so the first evaluation is the start.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from finetune.errors import RunFailed
from finetune.training.checkpoints import remove_checkpoint, training_checkpoints
from finetune.training.events import TrainingEvents

DIVERGENCE_MARGIN = 1.0  # a validation loss must also exceed the first one by this much (see the module docstring)


def divergence_threshold(first_loss: float, factor: float) -> float:
    """The validation loss past which a run whose first evaluation's loss was `first_loss` has diverged."""
    return max(first_loss * factor, first_loss + DIVERGENCE_MARGIN)


class ValidationWatch:
    """Follows the validation losses of a run (its evaluations' `validation_loss`) and stops a diverged one.

    `factor`: training.divergence_factor; None (or a range test, whose LR grows on purpose) checks only that the
    loss is finite. `first`: the first evaluation's loss and step, carried through a resume (TrainingState).
    """

    def __init__(self, factor: float | None):
        self.factor = factor
        self.first: tuple[int, float] | None = None  # (step, validation loss) of the run's first evaluation

    def problem(self, record: dict[str, Any], step: int) -> tuple[str, bool] | None:
        """What is wrong with an evaluation `record` of `step`, and whether it is a finite loss that rose past the
        threshold (None: nothing is; the first finite loss is the start)."""
        loss = record.get("validation_loss")
        if not isinstance(loss, (int, float)):  # a stage whose evaluations hold no loss: nothing to follow
            return None
        if not math.isfinite(loss):
            return f"the validation loss was not finite ({loss}) at step {step}", False
        if self.first is None:
            self.first = (step, float(loss))
            return None
        first_step, first_loss = self.first
        if self.factor is not None and loss > divergence_threshold(first_loss, self.factor):
            what = (
                f"the validation loss rose to {loss:.4g} at step {step}, past training.divergence_factor "
                f"{self.factor:g} x the first evaluation's {first_loss:.4g} (step {first_step})"
            )
            return what, True
        return None

    def record(self) -> list[float] | None:
        """What a checkpoint keeps: [step, loss] of the first evaluation."""
        return None if self.first is None else [self.first[0], self.first[1]]

    def continue_from(self, record: list[float] | None) -> None:
        """Continue from `record()` of a stopped run."""
        self.first = None if record is None else (int(record[0]), float(record[1]))


class DivergenceWatch(TrainingEvents):
    """The run's subscriber that stops it when an evaluation shows it diverged (first of every run's subscribers, so
    a diverged model is never kept as the best nor saved as the result). Raised on every process together: they
    share the validation loss."""

    def __init__(self, training_config):
        self.training = training_config
        self.watch = ValidationWatch(getattr(training_config, "divergence_factor", None))

    def on_evaluate(self, loop, control, scores, record) -> None:
        """A periodic checkpoint of this very step holds the diverged weights: it is removed, so that neither the
        message nor `--resume` offers it as a good one."""
        problem = self.watch.problem(record, loop.step)
        if problem is None:
            return
        what, rising = problem
        if loop.last_checkpoint is not None and loop.saved_step == loop.step:
            if loop.accelerator.is_main_process:
                remove_checkpoint(loop.last_checkpoint)
            older = [path for path in training_checkpoints(loop.last_checkpoint.parent) if path != loop.last_checkpoint]
            loop.last_checkpoint = older[-1] if older else None
        raise diverged(what, loop.last_checkpoint, self.training.lr, factor_hint=rising)

    def on_save(self, loop, control, state) -> None:
        state.first_evaluation = self.watch.record()

    def on_restore(self, loop, control, state) -> None:
        self.watch.continue_from(state.first_evaluation)


def diverged(what: str, kept: Path | None, lr: float, factor_hint: bool = False) -> RunFailed:
    """The one line of a diverged run: what went wrong at which step, what was (not) saved, and what to lower."""
    kept_text = f"the last good checkpoint is {kept}" if kept is not None else "no checkpoint was saved before it"
    hint = (
        ", or raise training.divergence_factor (null: never stop on a rising validation loss) if the loss is meant "
        "to rise this much"
        if factor_hint
        else ""
    )
    return RunFailed(
        f"training diverged: {what}; the run stopped without saving these weights ({kept_text}) - lower "
        f"training.lr (now {lr:g}), keep gradient clipping on (training.max_grad_norm), check the data, or train "
        f"without mixed precision (training.mixed_precision=no){hint}"
    )
