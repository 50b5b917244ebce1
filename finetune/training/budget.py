"""How many optimizer steps a fine-tuning run takes, and why: the step budget as a pure function of the data size.

A few labelled rows give a few steps an epoch: 32 rows in batches of 32 make one optimizer step, and a run of one
epoch saves a model near chance (issue 57: 49% on a 4-class task). With `training.epochs` left out (null), a run
takes at least `training.min_steps` optimizer steps: one epoch when the rows give that many, else up to
FEW_ROWS_EPOCHS epochs (each ends with a dev evaluation, which keep_best chooses among), each passing over the
rows as many times as the budget needs (data/sampling.py: each pass in its own order). Given `training.epochs` or
`training.max_steps`, the run takes what they say, and a run of under FEW_STEPS steps says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FEW_ROWS_EPOCHS = 5  # evaluations of a run that repeats its rows: keep_best picks among them, each costs a dev pass
FEW_STEPS = 50  # below this a run is told that its model may have learnt little


@dataclass(frozen=True)
class StepPlan:
    """The run's length: epochs, passes over the training rows in each, and where the numbers come from."""

    epochs: int
    passes: int  # passes over the training rows in one epoch
    reason: str


def plan_steps(
    rows: int, step_examples: int, epochs: int | None, max_steps: int | None, min_steps: int | None
) -> StepPlan:
    """The plan for `rows` training rows read `step_examples` an optimizer step (batch x processes x accumulation).

    An epoch's passes follow each other in one order, so its batches are full across them: an epoch of `passes`
    passes takes ceil(rows x passes / step_examples) steps.
    """
    per_pass = max(1, math.ceil(rows / step_examples))
    if max_steps:
        return StepPlan(epochs or 1, 1, f"training.max_steps {max_steps}")
    if epochs is not None:
        return StepPlan(epochs, 1, f"training.epochs {epochs} x {per_pass} step(s)")
    if not min_steps or per_pass >= min_steps:
        floor = f", at least training.min_steps {min_steps}" if min_steps else ""
        return StepPlan(1, 1, f"one epoch of {rows:,} rows in {per_pass} step(s){floor}")
    passes_needed = math.ceil(min_steps * step_examples / max(1, rows))
    run_epochs = min(FEW_ROWS_EPOCHS, passes_needed)
    passes = math.ceil(passes_needed / run_epochs)
    return StepPlan(
        run_epochs,
        passes,
        f"{rows:,} rows make {rows / step_examples:.3g} step(s) of {step_examples} a pass, fewer than "
        f"training.min_steps {min_steps}: {run_epochs} epoch(s) of {passes} pass(es) over them",
    )


def steps_summary(steps: int, plan: StepPlan) -> str:
    """The line a run prints before it trains: its optimizer steps and why."""
    return f"optimizer steps: {steps:,} ({plan.reason})"


def few_steps_note(steps: int) -> str | None:
    """A warning for a run too short to learn much, with the keys that lengthen it."""
    if steps >= FEW_STEPS:
        return None
    return (
        f"note: only {steps} optimizer step(s), fewer than {FEW_STEPS}: the model may have learnt little; leave "
        "training.epochs out (training.min_steps then sets the budget) or raise training.epochs / max_steps"
    )
