"""The order in which a loader reads a dataset: a pure function of (seed, epoch), resumable mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Indices of an epoch, shuffled by (seed, epoch) or in order, starting after the ones already trained on.

    The order never depends on the global random state, so a resumed run reads exactly the
    indices the interrupted run had not reached: `skip(n)` leaves out the epoch's first n.
    Under accelerate several processes share one sampler's order, each taking its own batches.
    Another order (e.g. `data.task_batches.LengthGroupedSampler`) only overrides `pass_order`.

    `passes`: an epoch reads every index that many times, each pass in its own order (a few labelled rows then make
    enough optimizer steps between two evaluations: training/budget.py). Pass p of epoch e is ordered as epoch
    e x passes + p would be with one pass, so one pass per epoch is the order it always was.
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True, passes: int = 1):
        self.size, self.seed, self.shuffle, self.passes = size, seed, shuffle, passes
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int) -> None:
        """Take the order of `epoch`, from its beginning when the epoch changes.

        Setting the current epoch again keeps the skip: accelerate's loaders call this at the start of
        every iteration with their own epoch count.
        """
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def skip(self, count: int) -> None:
        """Leave out the first `count` indices of the current epoch (those trained on before a resume)."""
        self.start = count

    def skip_batches(self, batches: int, batch_size: int, num_processes: int = 1) -> None:
        """Leave out what `batches` batches of each process read: under accelerate the processes take turns at
        the batches of one order, so each batch done by every process is batch_size x processes indices of it."""
        self.skip(batches * batch_size * num_processes)

    def epoch_order(self) -> np.ndarray:
        """Every index of the current epoch (each `passes` times), in the order it is read."""
        if self.passes == 1:
            return self.pass_order(self.epoch)
        return np.concatenate([self.pass_order(self.epoch * self.passes + done) for done in range(self.passes)])

    def pass_order(self, index: int) -> np.ndarray:
        """Every index once, in the order of pass `index` (the epoch's, with one pass an epoch)."""
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng((self.seed, index)).permutation(self.size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order()[self.start :].tolist())

    def __len__(self) -> int:
        return max(0, self.size * self.passes - self.start)
