"""Micro-batches that hold the same examples per optimizer step on any number of processes, none of them twice.

accelerate deals a loader's batches to the processes in turn (batch i to process i mod P) and, when
their count is not a multiple of P, tops the last ones up with repeats of the first examples: those
would be trained on twice per epoch, and a run on P processes would not match one on 1 process.
`StepBatches` cuts an order into the batches accelerate then deals. Every full optimizer step is
batch_size x P x accumulation consecutive examples of the order, exactly what one process with a P
times larger batch would take. The last, short step is spread evenly over the processes so that the
batch count is a multiple of P and accelerate adds nothing; only when it holds fewer examples than
batches does a process get a padding batch: one copy of the dataset's first example that the loss
counts zero times (its process still has to join the gradient all-reduce).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
from torch.utils.data import Dataset

PADDING = None  # the index of a padding example in a batch of StepBatches
REAL_EXAMPLES = "real_examples"  # batch key: how many of the batch's examples are real (0 in a padding batch)


class SizedSampler(Protocol):
    """An order of example indices that knows its length (ResumableSampler, LengthGroupedSampler)."""

    def __iter__(self) -> Iterator[int]: ...

    def __len__(self) -> int: ...


class SizedDataset(Protocol):
    """Examples by index, with a length (a map-style Dataset that defines __len__, or a list)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class StepBatches:
    """Batches of indices from `sampler`, for DataLoader(batch_sampler=...), in the order accelerate deals them.

    Deliberately without a `batch_size` attribute: accelerate then shards batches of any length in turn
    and never refills a short one. `sampler` (e.g. one with `set_epoch`) is reachable as accelerate expects.
    """

    def __init__(self, sampler: SizedSampler, batch_size: int, processes: int = 1, accumulation: int = 1):
        self.sampler, self.micro_batch_size = sampler, batch_size
        self.processes, self.step_size = processes, batch_size * processes * accumulation

    def __iter__(self) -> Iterator[list[int | None]]:
        order: list[int | None] = list(self.sampler)
        full = len(order) - len(order) % self.step_size  # examples in whole optimizer steps
        for start in range(0, full, self.micro_batch_size):
            yield order[start : start + self.micro_batch_size]
        tail = order[full:]
        if tail:
            for part in np.array_split(np.asarray(tail, dtype=np.int64), self._tail_batches(len(tail))):
                yield part.tolist() if len(part) else [PADDING]

    def _tail_batches(self, examples: int) -> int:
        """Batches the last, short step is cut into: micro-batches of at most batch_size, a multiple of P of them."""
        batches = math.ceil(examples / self.micro_batch_size)
        return math.ceil(batches / self.processes) * self.processes

    def __len__(self) -> int:
        examples = len(self.sampler)
        return (examples // self.step_size) * (self.step_size // self.micro_batch_size) + self._tail_batches(
            examples % self.step_size
        )


class PaddableDataset(Dataset):
    """`dataset` as (item, real) pairs; index PADDING gives its first item again, not real."""

    def __init__(self, dataset: SizedDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | None) -> tuple[Any, bool]:
        return (self.dataset[0], False) if index is PADDING else (self.dataset[index], True)


class CountingCollator:
    """Collates the items of (item, real) pairs with `collate` and adds REAL_EXAMPLES, the count of real ones.

    With `pieces` (a batch's items -> groups of positions in it, e.g. by task_batches.length_pieces), a batch is
    collated as a list of such batches, one per group: each padded to its own longest item.
    """

    def __init__(
        self,
        collate: Callable[[list[Any]], dict[str, Any]],
        pieces: Callable[[list[Any]], list[np.ndarray]] | None = None,
    ):
        self.collate, self.pieces = collate, pieces

    def __call__(self, pairs: list[tuple[Any, bool]]) -> dict[str, Any] | list[dict[str, Any]]:
        if self.pieces is None:
            return self._counted(pairs)
        groups = self.pieces([item for item, _ in pairs])
        return [self._counted([pairs[index] for index in group]) for group in groups]

    def _counted(self, pairs: list[tuple[Any, bool]]) -> dict[str, Any]:
        batch = self.collate([item for item, _ in pairs])
        batch[REAL_EXAMPLES] = sum(real for _, real in pairs)  # a plain int: reading it never waits for a device
        return batch
