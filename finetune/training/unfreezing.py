"""Gradual unfreezing: which layer groups train in which epoch (or optimizer step), counted from the top."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


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
