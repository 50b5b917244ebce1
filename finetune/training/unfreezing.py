"""Gradual unfreezing: which layer groups train in which epoch, counted from the top."""

from __future__ import annotations

from torch import nn


def trainable_group_count(epoch: int, num_groups: int, mode: str, initial_groups: int = 1,
                          groups_per_epoch: int = 1) -> int:
    """How many groups, from the top, are trainable in `epoch` (0-based)."""
    if mode == "none":
        return num_groups
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
