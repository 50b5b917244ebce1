"""Datasets of the `datasets` library: GLUE from the hub's `nyu-mll/glue` (the same examples as the TSV folders), and
any dataset by name for `task.source: hub` (a hub name, a folder saved with `save_to_disk`, or local data files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from finetune.data.examples import TaskExamples
from finetune.errors import DataFileError, InputError
from finetune.glue.specs import HUB_DATASET
from finetune.tasks.specs import TaskSpec

UNLABELED = -1  # the hub's label on test examples (classes and STS-B scores alike)
DATA_FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def load_hub_dataset(name: str, config: str | None = None, data_files: dict[str, Any] | None = None) -> Any:
    """A DatasetDict: `name` a folder saved with `save_to_disk`, a builder (csv, json, parquet) reading `data_files`,
    or a dataset on the hub; anything that fails (offline, an unknown name, a broken file) is one line naming it."""
    import datasets

    folder = Path(name).expanduser()
    try:
        if data_files is None and folder.is_dir() and (folder / "dataset_dict.json").is_file():
            return datasets.load_from_disk(str(folder))
        if data_files is None and folder.is_dir() and (folder / "dataset_info.json").is_file():
            raise InputError(f"dataset {name}: a single split saved with save_to_disk; save a DatasetDict of splits")
        return datasets.load_dataset(name, config, data_files=data_files)
    except InputError:
        raise
    except Exception as error:  # offline, the hub down, an unknown name, a broken cache: datasets raises many kinds
        where = f" ({config})" if config else ""
        raise DataFileError(f"cannot load dataset {name}{where}: {_first_line(error)}", value=name) from None


def split_rows(dataset: Any, split: str, name: str) -> list[dict[str, Any]]:
    """The rows of one split as dicts, class ids (ClassLabel columns) as their names; a missing split is one line."""
    if split not in dataset:
        raise InputError(f"dataset {name} has no split '{split}' (splits: {', '.join(dataset)})", value=split)
    return dataset_rows(dataset[split])


def dataset_rows(rows: Any) -> list[dict[str, Any]]:
    """A `datasets.Dataset` as a list of dicts, class ids (ClassLabel columns) written as their names."""
    import datasets

    named = {column: feature for column, feature in rows.features.items() if isinstance(feature, datasets.ClassLabel)}
    records = rows.to_list()
    for record in records:
        for column, feature in named.items():
            if record[column] is not None and record[column] >= 0:  # -1: unlabelled (a test split)
                record[column] = feature.int2str(record[column])
            else:
                del record[column]
    return records


def read_hub_split(spec: TaskSpec, split: str) -> TaskExamples:
    """One split of a GLUE task from the hub, labels mapped from the hub's class ids to the task's label strings."""
    if spec.hub is None or split not in spec.hub.splits:
        raise InputError(
            f"task '{spec.name}' has no split '{split}' on the hub "
            f"(splits: {', '.join(spec.hub.splits) if spec.hub else 'none'})",
            value=split,
        )
    try:
        dataset = load_hub_dataset(HUB_DATASET, spec.hub.config)
    except DataFileError as error:
        raise DataFileError(f"task '{spec.name}': {error}") from None
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
