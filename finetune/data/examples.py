"""The examples of one split of a task, as every reader returns them (files, the hub) and every model reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class TaskExamples:
    """One split of a task: the texts of each example, their labels (None for unlabeled test files), ids."""

    texts: list[tuple[str, ...]]
    labels: Optional[np.ndarray]  # class indices (int64), scores (float32), or 0/1 rows (multilabel, float32)
    ids: list[str]
