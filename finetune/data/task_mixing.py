"""Batches drawn from several tasks (multi-task fine-tuning): each optimizer step trains one task, chosen by a
sampling rule, on that task's next rows.

The tasks' training examples are concatenated (`MixedTasks`: index -> (task, its example)). `MixedTaskOrder` lays
out an epoch as `steps` optimizer steps of `step_examples` consecutive indices each, all of one task: step s's task is
drawn with the task shares (`task_shares`: MT-DNN's proportional rule, T5's temperature, or equal) from a generator
seeded by (seed, epoch), and takes the next rows of that task's own stream (every row once per pass, each pass
shuffled by (seed, task, pass)). Everything is a pure function of the seed and the epoch, so a resumed run reads
exactly what the stopped one had not reached (ResumableSampler's skip), on any number of processes: data/
step_batches.py's StepBatches cuts each step into the processes' micro-batches, so one step never mixes tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from finetune.data.sampling import ResumableSampler
from finetune.data.step_batches import SizedDataset

TASK_KEY = "task"  # batch key: the index of the task the batch's examples belong to


def task_shares(sizes: Sequence[int], rule: str, temperature: float = 1.0) -> np.ndarray:
    """Each task's share of the optimizer steps: proportional to its training rows, to their count to the power
    1/temperature (T5's examples-proportional mixing with temperature), or equal."""
    counts = np.asarray(sizes, dtype=np.float64)
    if rule == "equal":
        weights = np.ones_like(counts)
    elif rule == "temperature":
        weights = counts ** (1.0 / temperature)
    elif rule == "proportional":
        weights = counts
    else:
        raise ValueError(f"unknown sampling rule {rule!r}")
    return weights / weights.sum()


class MixedTaskOrder(ResumableSampler):
    """Indices into MixedTasks, `steps` x `step_examples` an epoch, each step's all of one task (see the module)."""

    def __init__(self, sizes: Sequence[int], shares: np.ndarray, seed: int, step_examples: int, steps: int):
        super().__init__(sum(sizes), seed)
        self.sizes, self.shares, self.step_examples, self.steps = list(sizes), shares, step_examples, steps
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def step_tasks(self, epoch: int) -> np.ndarray:
        """The task of each optimizer step of `epoch`."""
        generator = np.random.default_rng((self.seed, 7919, epoch))  # 7919: apart from the passes' own streams
        return generator.choice(len(self.sizes), size=self.steps, p=self.shares)

    def epoch_order(self) -> np.ndarray:
        tasks = self.step_tasks(self.epoch)
        done = np.zeros(len(self.sizes), dtype=np.int64)  # rows each task's stream gave before this epoch
        for earlier in range(self.epoch):
            done += np.bincount(self.step_tasks(earlier), minlength=len(self.sizes)) * self.step_examples
        streams = {}
        for task in np.unique(tasks):
            wanted = int(np.count_nonzero(tasks == task)) * self.step_examples
            streams[task] = self._stream(int(task), int(done[task]), wanted) + self.offsets[task]
        taken = dict.fromkeys(streams, 0)
        order = np.empty(self.steps * self.step_examples, dtype=np.int64)
        for step, task in enumerate(tasks):
            start = taken[task]
            order[step * self.step_examples : (step + 1) * self.step_examples] = streams[task][
                start : start + self.step_examples
            ]
            taken[task] = start + self.step_examples
        return order

    def _stream(self, task: int, start: int, count: int) -> np.ndarray:
        """Rows start .. start + count of task `task`'s stream: its rows once per pass, each pass shuffled."""
        size = self.sizes[task]
        first, last = start // size, (start + count - 1) // size
        passes = [np.random.default_rng((self.seed, task, index)).permutation(size) for index in range(first, last + 1)]
        joined = np.concatenate(passes)
        return joined[start - first * size : start - first * size + count]

    def __len__(self) -> int:
        return max(0, self.steps * self.step_examples - self.start)


class MixedTasks:
    """The training examples of several tasks as one dataset: index -> (task, the task's example)."""

    def __init__(self, datasets: Sequence[SizedDataset]):
        self.datasets = list(datasets)
        self.ends = np.cumsum([len(dataset) for dataset in self.datasets])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index: int) -> tuple[int, Any]:
        task = int(np.searchsorted(self.ends, index, side="right"))
        start = 0 if task == 0 else int(self.ends[task - 1])
        return task, self.datasets[task][index - start]


class MixedCollator:
    """Collates a batch of (task, example) pairs, all of one task, with that task's own collator; the batch names
    its task under TASK_KEY."""

    def __init__(self, collators: Sequence[Callable[[list[Any]], dict[str, Any]]]):
        self.collators = list(collators)

    def __call__(self, items: list[tuple[int, Any]]) -> dict[str, Any]:
        tasks = {task for task, _ in items}
        if len(tasks) != 1:
            raise RuntimeError(f"a multi-task batch mixes tasks {sorted(tasks)}")  # MixedTaskOrder never does
        task = tasks.pop()
        batch = self.collators[task]([example for _, example in items])
        batch[TASK_KEY] = task
        return batch


def steps_per_epoch(sizes: Sequence[int], step_examples: int, passes: int = 1) -> int:
    """Optimizer steps an epoch: as many as one pass over every task's rows takes (`passes` of them)."""
    return max(1, math.ceil(sum(sizes) * passes / step_examples))
