"""Gradual unfreezing: which layer groups train in which epoch (or optimizer step), counted from the top."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from finetune.training.events import TrainingEvents


def trainable_group_count(
    epoch: int,
    num_groups: int,
    mode: str,
    initial_groups: int = 1,
    groups_per_epoch: int = 1,
    schedule: Sequence[int] | None = None,
) -> int:
    """How many groups, from the top, are trainable in `epoch` (0-based).

    ULMFiT thaws one more group per epoch from the top; `schedule` lists the counts per epoch
    explicitly instead (its last entry holds for the epochs after it).
    """
    if mode == "none":
        return num_groups
    if schedule is not None:
        return min(num_groups, schedule[min(epoch, len(schedule) - 1)])
    return min(num_groups, initial_groups + epoch * groups_per_epoch)


def frozen_groups_note(unfreezing, groups: int, epochs: int) -> str | None:
    """What a run with per-epoch gradual unfreezing should know when its `epochs` leave lower groups frozen; None when
    every group thaws or a schedule says per epoch how many train (method contrastive's [1] means to freeze)."""
    if unfreezing.mode != "gradual" or unfreezing.schedule is not None:
        return None
    thawed = trainable_group_count(
        epochs - 1, groups, "gradual", unfreezing.initial_groups, unfreezing.groups_per_epoch, unfreezing.schedule
    )
    if thawed >= groups:
        return None
    return (
        f"note: gradual unfreezing thaws one more group per epoch; in {epochs} epoch(s) {thawed} of the {groups} "
        f"layer groups train and the lowest {groups - thawed} never do (more epochs, or unfreezing.every_fraction "
        "to thaw by steps)"
    )


def thaw_interval(total_steps: int, every_steps: int | None = None, every_fraction: float | None = None) -> int | None:
    """Optimizer steps between two thaws of step-wise unfreezing; None when unfreezing goes by epochs.

    A fraction is of the whole run (`total_steps`), rounded to the nearest step and at least one.
    """
    if every_steps is not None:
        return every_steps
    if every_fraction is not None:
        return max(1, round(every_fraction * total_steps))
    return None


def trainable_group_count_at_step(step: int, num_groups: int, initial_groups: int, interval: int) -> int:
    """How many groups, from the top, train in the optimizer step that follows `step` steps taken (step-wise).

    Steps 1 to `interval` train `initial_groups`, the next `interval` steps one group more, and so on. A pure
    function of the step, so a resumed run freezes exactly what the stopped run did at the same step.
    """
    return min(num_groups, initial_groups + step // interval)


def freeze_below(groups: list[list[nn.Parameter]], trainable: int) -> None:
    """Make the top `trainable` groups trainable and freeze the rest.

    Frozen parameters get `requires_grad=False`: autograd then computes nothing for them and,
    because every group below them is frozen too, no backward pass runs below the lowest
    trainable group. Their `.grad` is dropped so the optimizer skips them entirely.
    """
    first_trainable = len(groups) - trainable
    for index, parameters in enumerate(groups):
        for parameter in parameters:
            parameter.requires_grad_(index >= first_trainable)
            if index < first_trainable:
                parameter.grad = None


class GradualUnfreezing(TrainingEvents):
    """Gradual unfreezing as a subscriber to the run's events: at each epoch's start (by epochs) or before each
    optimizer step (by steps, every `thaw_every` steps), the top groups that train now are trainable and the rest
    frozen, with an `unfreeze` record in metrics.jsonl at the start and at each change.

    Written from the epoch or step alone (not from what this process did before), so a resumed run freezes and logs
    exactly what the stopped one would have: the stopped run wrote the record of its checkpoint's step, if any, only
    after that checkpoint; a resumed epoch logged its unfreezing before."""

    def __init__(self, groups: list[list[nn.Parameter]], unfreezing, thaw_every: int | None):
        self.groups, self.unfreezing, self.thaw_every = groups, unfreezing, thaw_every
        self.epoch_trainable = len(groups)  # by epochs: the groups trainable in the epoch in progress

    def on_epoch_begin(self, loop, control, epoch: int, batches_done: int) -> None:
        if self.thaw_every is not None:  # by steps: before each step
            return
        unfreezing = self.unfreezing
        self.epoch_trainable = trainable_group_count(
            epoch,
            len(self.groups),
            unfreezing.mode,
            unfreezing.initial_groups,
            unfreezing.groups_per_epoch,
            unfreezing.schedule,
        )
        freeze_below(self.groups, self.epoch_trainable)
        if not batches_done:  # a resumed epoch logged its unfreezing before
            self._log(loop, loop.step, epoch, self.epoch_trainable)

    def on_step_begin(self, loop, control, epoch: int) -> None:
        if self.thaw_every is None:
            return
        step = loop.step
        trainable = self.trainable_at_step(step)
        freeze_below(self.groups, trainable)  # idempotent, and cheap next to a step: one flag per parameter
        if step == 0 or trainable != self.trainable_at_step(step - 1):
            self._log(loop, step, epoch, trainable)

    def trainable_at_step(self, step: int) -> int:
        """By steps: the groups trainable in the step that follows `step` steps taken."""
        assert self.thaw_every is not None  # called only when unfreezing goes by steps (an interval)
        return trainable_group_count_at_step(step, len(self.groups), self.unfreezing.initial_groups, self.thaw_every)

    def trainable_in_last_step(self, step: int) -> int:
        """The groups that trained in the optimizer step before `step` steps taken (an epoch's summary line)."""
        return self.epoch_trainable if self.thaw_every is None else self.trainable_at_step(max(step - 1, 0))

    def _log(self, loop, step: int, epoch: int, trainable: int) -> None:
        # `step`: the steps taken before the change; it holds from step + 1 on (what plots.is_trainable reads).
        loop.metrics_log.write(
            {
                "phase": "unfreeze",
                "step": step,
                "epoch": epoch,
                "trainable_groups": trainable,
                "total_groups": len(self.groups),
            }
        )
