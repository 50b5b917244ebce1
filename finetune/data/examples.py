"""The examples of one split of a task, as every reader returns them (files, the hub) and every model reads them;
and the dataset of their encodings that the task kinds with their own layout build (tagging, choices, spans)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch.utils.data import Dataset


@dataclass
class TaskExamples:
    """One split of a task: the texts of each example, their labels (None for unlabeled test files), ids."""

    texts: list[tuple[str, ...]]
    labels: np.ndarray | None  # class indices (int64), scores (float32), or 0/1 rows (multilabel, float32)
    ids: list[str]


class EncodedItems(Dataset):
    """A dataset of encoded items, one dict per training example (a sentence, a question, a window), in `items`;
    `lengths` (tokens of each) is what length grouping sorts by."""

    items: list[dict]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]

    @property
    def lengths(self) -> list[int]:
        return [len(item["input_ids"]) for item in self.items]
