"""GLUE from the hub's `nyu-mll/glue` dataset, for users with a network: the same examples as the TSV folders."""

from __future__ import annotations

import numpy as np

from finetune.data.examples import TaskExamples
from finetune.errors import DataFileError, InputError
from finetune.glue.specs import HUB_DATASET, TaskSpec

UNLABELED = -1  # the hub's label on test examples (classes and STS-B scores alike)


def read_hub_split(spec: TaskSpec, split: str) -> TaskExamples:
    """One split of a GLUE task from the hub, labels mapped from the hub's class ids to the task's label strings."""
    if spec.hub is None or split not in spec.hub.splits:
        raise InputError(
            f"task '{spec.name}' has no split '{split}' on the hub "
            f"(splits: {', '.join(spec.hub.splits) if spec.hub else 'none'})",
            value=split,
        )
    import datasets

    try:
        dataset = datasets.load_dataset(HUB_DATASET, spec.hub.config)
    except Exception as error:  # offline, the hub down, a broken cache: datasets raises many kinds
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DataFileError(
            f"task '{spec.name}': cannot load {HUB_DATASET} ({spec.hub.config}) from the hub: {first_line}"
        ) from None
    rows = dataset[spec.hub.splits[split]]
    texts = list(zip(*(rows[column] for column in spec.hub.text_columns)))
    ids = [str(index) for index in rows["idx"]]
    values = rows["label"]
    if not texts:
        raise DataFileError(
            f"task '{spec.name}': the hub's {spec.hub.splits[split]} split has no examples", value=split
        )
    if all(value == UNLABELED for value in values):
        return TaskExamples(texts, None, ids)
    labels = spec.labels
    if spec.is_regression or labels is None:
        return TaskExamples(texts, np.array(values, dtype=np.float32), ids)
    hub_labels = spec.hub.labels or labels
    return TaskExamples(texts, np.array([labels.index(hub_labels[value]) for value in values], dtype=np.int64), ids)
