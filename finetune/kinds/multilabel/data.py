"""Multi-label data (task kind multilabel): the label set of each example, read from a record of a TSV, CSV or JSON
Lines file (data/task_files.py reads the records and the texts) as a 0/1 row over the task's labels.

Two layouts: `label_column` holds a list (a JSON list in JSON Lines; in TSV/CSV the labels joined by
`label_separator`, e.g. PER|LOC, or a JSON list text, e.g. ["PER", "LOC"]; an empty field is no label), or
`label_columns` hold a 0/1 value each, one column per label.
"""

from __future__ import annotations

import json
from typing import Any

from finetune.errors import DataFileError
from finetune.kinds.multilabel.spec import multilabel_spec
from finetune.tasks.specs import TaskSpec, label_text

ONE, ZERO = {"1", "true"}, {"0", "false"}  # a 0/1 column's values; JSON's true and false read as their text


def label_set_columns(spec: TaskSpec) -> tuple[str, ...]:
    """The columns that hold a record's labels: the 0/1 columns, or the one list column."""
    return multilabel_spec(spec).label_columns or (spec.label_column,)


def has_label_set(spec: TaskSpec, record: dict) -> bool:
    """Whether a record carries labels (a file is labelled when its first record does)."""
    return any(column in record for column in label_set_columns(spec))


def label_set_row(spec: TaskSpec, record: dict, path, line: int) -> list[float]:
    """The record's labels as 0.0/1.0 per task label, in label order; anything unreadable names file and line."""
    for column in label_set_columns(spec):
        if column not in record:
            raise DataFileError(f"missing key {column} (earlier lines have it)", source=path, line=line, value=column)
    label_columns = multilabel_spec(spec).label_columns
    if label_columns is not None:
        return [_zero_or_one(record[column], column, path, line) for column in label_columns]
    labels = spec.labels
    # A multilabel spec always has labels: its label_columns, or the recipe's labels (required with label_column).
    assert labels is not None
    row = [0.0] * len(labels)
    for label in _listed_labels(record[spec.label_column], spec, path, line):
        if label not in labels:
            raise DataFileError(
                f"label '{label}' is not one of {', '.join(labels)}", source=path, line=line, value=label
            )
        row[labels.index(label)] = 1.0
    return row


def _zero_or_one(value: Any, column: str, path, line: int) -> float:
    text = label_text(value).strip().lower() if isinstance(value, (str, int, bool)) else None
    if text in ONE:
        return 1.0
    if text in ZERO:
        return 0.0
    raise DataFileError(
        f"column {column}: '{value}' is not 0 or 1 (a 0/1 column per label)", source=path, line=line, value=value
    )


def _listed_labels(value: Any, spec: TaskSpec, path, line: int) -> list[str]:
    """The labels of a list column: a JSON list, a JSON list text, or a separator-joined text ("" is none)."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise DataFileError(
                f"{spec.label_column}: invalid JSON list ({error.msg})", source=path, line=line, value=value
            ) from None
    if isinstance(value, list):
        if not all(isinstance(item, (str, int, bool)) for item in value):
            raise DataFileError(
                f"{spec.label_column}: a list of labels holds texts, not {value!r}", source=path, line=line, value=value
            )
        return [label_text(item) for item in value]
    if isinstance(value, str):
        return [part.strip() for part in value.split(multilabel_spec(spec).label_separator) if part.strip()]
    raise DataFileError(
        f"{spec.label_column}: expected a list of labels, found {value!r}", source=path, line=line, value=value
    )
