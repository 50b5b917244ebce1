"""Task data: GLUE-layout TSV files read by a TaskSpec, tokenized into padded batches."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.errors import UserError
from finetune.glue.specs import TaskSpec


@dataclass
class TaskExamples:
    """One split of a task: the texts of each example, their labels (None for unlabeled test files), ids."""

    texts: list[tuple[str, ...]]
    labels: Optional[np.ndarray]  # class indices (int64) or scores (float32)
    ids: list[str]


def task_file(spec: TaskSpec, data_dir: Path, split: str) -> Path:
    """The file of `split`, or a one-line error naming what exists."""
    if split not in spec.files:
        raise UserError(f"task '{spec.name}' has no split '{split}' (splits: {', '.join(spec.files)})")
    path = Path(data_dir) / spec.files[split]
    if not path.is_file():
        raise UserError(f"task '{spec.name}': no {split} file {path}")
    return path


def read_task_split(spec: TaskSpec, data_dir: Path, split: str) -> TaskExamples:
    """Read a TSV with quoting disabled (GLUE files hold stray quotes) and check every row."""
    path = task_file(spec, data_dir, split)
    with open(path, encoding="utf-8-sig", newline="") as handle:  # -sig: MRPC starts with a BOM
        try:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        except UnicodeDecodeError:
            raise UserError(f"{path}: not valid UTF-8") from None
    if split in spec.headerless_columns:
        columns, first_line = list(spec.headerless_columns[split]), 1
    elif rows:
        columns, rows, first_line = rows[0], rows[1:], 2
    else:
        columns = []
    if not rows:
        raise UserError(f"{path}: no examples")
    position = {name: index for index, name in enumerate(columns)}
    missing = [name for name in spec.text_columns if name not in position]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(columns)})")
    labelled = spec.label_column in position
    texts, labels, ids = [], [], []
    for line, row in enumerate(rows, start=first_line):
        if len(row) != len(columns):
            raise UserError(f"{path} line {line}: expected {len(columns)} tab-separated columns, found {len(row)}")
        texts.append(tuple(row[position[name]] for name in spec.text_columns))
        ids.append(row[position[spec.index_column]] if spec.index_column in position else str(line - first_line))
        if labelled:
            labels.append(_parse_label(spec, row[position[spec.label_column]], path, line))
    if not labelled:
        return TaskExamples(texts, None, ids)
    dtype = np.float32 if spec.is_regression else np.int64
    return TaskExamples(texts, np.array(labels, dtype=dtype), ids)


def _parse_label(spec: TaskSpec, value: str, path: Path, line: int) -> float | int:
    """A class index from the label string, or a float score; a bad label names the file and line."""
    if spec.is_regression:
        try:
            return float(value)
        except ValueError:
            raise UserError(f"{path} line {line}: label '{value}' is not a number") from None
    if value not in spec.labels:
        raise UserError(f"{path} line {line}: label '{value}' is not one of {', '.join(spec.labels)}")
    return spec.labels.index(value)


def task_documents(spec: TaskSpec, data_dir: Path, splits: list[str]) -> list[str]:
    """Every non-empty text of the splits, one document each: a task's own text for language-model fine-tuning."""
    documents = []
    for split in splits:
        for texts in read_task_split(spec, data_dir, split).texts:
            documents += [text.strip() for text in texts if text.strip()]
    return documents


class EncodedTask(Dataset):
    """Tokenized examples (truncated, unpadded); `DataCollatorWithPadding` pads each batch to its longest."""

    def __init__(self, examples: TaskExamples, tokenizer, max_length: int):
        columns = list(zip(*examples.texts))
        second = columns[1] if len(columns) > 1 else None
        self.encodings = tokenizer(list(columns[0]), list(second) if second else None,
                                   truncation=True, max_length=max_length)
        self.labels = examples.labels

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = {key: values[index] for key, values in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = self.labels[index].item()
        return item
