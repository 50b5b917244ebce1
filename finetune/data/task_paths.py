"""Where a task's files are: the file of each split in the task's folder, found by its name before anything is read.

Light on purpose (no numpy, no torch): the command line finds a missing task file here, with the recipe, before the
libraries that read the file load (finetune/data/task_files.py reads them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune.errors import DataFileError, InputError
from finetune.tasks.specs import STANDARD_FILES, TaskSpec, task_spec

FORMAT_BY_EXTENSION = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl"}


def task_file(spec: TaskSpec, data_dir: Path | None, split: str) -> Path:
    """The file of `split`, or a one-line error naming what exists (or that no folder was given to look in)."""
    splits = STANDARD_FILES if spec.files is None else spec.files
    if split not in splits:
        raise InputError(f"task '{spec.name}' has no split '{split}' (splits: {', '.join(splits)})", value=split)
    if data_dir is None:  # the recipes require a data_dir for files; a caller without one gets this, not a TypeError
        raise InputError(f"task '{spec.name}': no data folder to read its {split} file from", value=split)
    if spec.files is None:
        return found_task_file(spec, Path(data_dir), split)
    path = Path(data_dir) / spec.files[split]
    if not path.is_file():
        raise DataFileError(f"task '{spec.name}': no {split} file {path}", value=path)
    return path


def found_task_file(spec: TaskSpec, data_dir: Path, split: str) -> Path:
    """The one file of `split` in the folder, by what is there: SPLIT.tsv, SPLIT.csv or SPLIT.jsonl (any case)."""
    entries = data_dir.iterdir() if data_dir.is_dir() else []
    found = sorted(
        path for path in entries if path.stem == split and path.suffix.lower() in FORMAT_BY_EXTENSION and path.is_file()
    )
    if not found:
        looked_for = ", ".join(f"{split}{extension}" for extension in FORMAT_BY_EXTENSION)
        raise DataFileError(
            f"task '{spec.name}': no {split} file in {data_dir} (looked for {looked_for})", value=data_dir
        )
    if len(found) > 1:
        raise DataFileError(
            f"task '{spec.name}': {' and '.join(str(path) for path in found)} are both {split} "
            "files: keep one, or name it in task.files",
            value=found,
        )
    return found[0]


def training_splits(task: Any) -> tuple[str, ...]:
    """The splits a fine-tuning run reads: train and dev, or train alone when task.dev_split holds dev out of it."""
    return ("train",) if task.dev_split is not None else ("train", "dev")


def check_task_files(task: Any, splits: Sequence[str]) -> None:
    """The error reading the recipe's `task` would end in, raised now: the first of `splits` without its file. A
    task read with `datasets` (task.source: hub) has none to find; with task.dev_split, dev is read out of train."""
    if getattr(task, "source", "files") == "hub":
        return
    spec = task_spec(task)
    for split in splits:
        held_out_of_train = split == "dev" and getattr(task, "dev_split", None) is not None
        task_file(spec, task.data_dir, "train" if held_out_of_train else split)
