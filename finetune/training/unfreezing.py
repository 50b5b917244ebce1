"""Gradual unfreezing: which layer groups train in which epoch, counted from the top."""

from __future__ import annotations

from typing import Optional, Sequence

from torch import nn


def trainable_group_count(epoch: int, num_groups: int, mode: str, initial_groups: int = 1,
                          groups_per_epoch: int = 1, schedule: Optional[Sequence[int]] = None) -> int:
    """How many groups, from the top, are trainable in `epoch` (0-based).

    ULMFiT thaws one more group per epoch from the top; `schedule` lists the counts per epoch
    explicitly instead (its last entry holds for the epochs after it).
    """
    if mode == "none":
        return num_groups
    if schedule is not None:
        return min(num_groups, schedule[min(epoch, len(schedule) - 1)])
    return min(num_groups, initial_groups + epoch * groups_per_epoch)


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
