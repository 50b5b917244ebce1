"""A task's files read and checked: GLUE-layout TSV files (or CSV, JSON Lines, the hub) read by a TaskSpec into its
examples, every row, label and column checked, each fault one line naming its file and line."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from finetune.data.corpus import document_text
from finetune.data.examples import PackedRows, PackedStrings, TaskExamples
from finetune.data.task_paths import FORMAT_BY_EXTENSION, task_file
from finetune.errors import DataFileError
from finetune.kinds.multilabel.data import has_label_set, label_set_row
from finetune.tasks.specs import TaskSpec, label_text


def read_task_split(spec: TaskSpec, data_dir: Path | None, split: str) -> TaskExamples:
    """One split from the hub (`spec.source`) or from its file in `data_dir`, every row checked."""
    if spec.source == "hub":
        from finetune.data.hub import read_hub_split  # late import: `datasets` is slow to import

        return read_hub_split(spec, split)
    path = task_file(spec, data_dir, split)
    file_format = spec.file_format or FORMAT_BY_EXTENSION.get(path.suffix.lower())
    if file_format is None:
        raise DataFileError(
            f"unknown file type '{path.suffix}' (expected .tsv, .csv or .jsonl, or set task.format)",
            source=path,
            value=path.suffix,
        )
    return read_examples_file(spec, path, file_format, spec.headerless_columns.get(split))


def read_labelled_split(spec: TaskSpec, data_dir: Path | None, split: str) -> TaskExamples:
    """A split to learn from or to score against: without its label column, one line naming its file."""
    examples = read_task_split(spec, data_dir, split)
    if examples.labels is None:
        raise DataFileError(
            f"task '{spec.name}': {split_source(spec, data_dir, split)} has no '{spec.label_column}' "
            f"column to {'learn from' if split == 'train' else 'score against'}",
            value=split,
        )
    return examples


def split_source(spec: TaskSpec, data_dir: Path | None, split: str) -> str:
    """How a message names a split: its file, or the hub's split."""
    return (
        f"the hub's {split} split" if spec.source == "hub" else f"the {split} file {task_file(spec, data_dir, split)}"
    )


def read_examples_file(
    spec: TaskSpec, path: Path, file_format: str, headerless: tuple[str, ...] | None = None
) -> TaskExamples:
    """The examples of one TSV, CSV or JSON Lines file, every row checked; bad bytes name their line."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:  # -sig: MRPC starts with a BOM
            if file_format == "jsonl":
                return examples_from_records(spec, path, json_records(handle, path))
            return examples_from_records(spec, path, delimited_records(handle, path, spec, file_format, headerless))
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path, line=first_undecodable_line(path)) from None


def first_undecodable_line(path: Path) -> int:
    """The number of the first line of a file that is not UTF-8 (0 if every line decodes on its own)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


FLOAT32_MAX = float(np.finfo(np.float32).max)  # regression labels are stored as float32


def delimited_records(
    handle, path: Path, spec: TaskSpec, file_format: str, headerless: tuple[str, ...] | None
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {column: value}) per row of a TSV or CSV file; a row with the wrong column count names its line.

    TSV is read with quoting disabled (GLUE files hold stray quotes that belong to the text); CSV
    with the usual CSV quoting, since that is how CSV writers protect commas.
    """
    reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if file_format == "tsv" else csv.reader(handle)
    rows = _checked_rows(reader, path)
    columns = list(headerless) if headerless else next(rows, [])
    if not columns:
        raise DataFileError("no examples (the file is empty)", source=path)
    counts = Counter(columns)
    repeated = [name for name in counts if counts[name] > 1]
    if repeated and not headerless:  # dict(zip(...)) below would silently keep the last of them
        raise DataFileError(
            f"column '{repeated[0]}' appears {counts[repeated[0]]} times in the header",
            source=path,
            line=reader.line_num,
            value=repeated[0],
        )
    missing = [name for name in spec.text_columns if name not in columns]
    if missing:
        raise DataFileError(
            f"missing column(s) {', '.join(missing)} (header: {', '.join(columns)})", source=path, value=missing
        )
    for row in rows:
        if not row:  # an empty line (e.g. trailing): no example
            continue
        if len(row) != len(columns):
            raise DataFileError(
                f"expected {len(columns)} {'tab-' if file_format == 'tsv' else 'comma-'}separated "
                f"columns, found {len(row)}",
                source=path,
                line=reader.line_num,
                value=row,
            )
        yield reader.line_num, dict(zip(columns, row))


def _checked_rows(reader, path: Path) -> Iterator[list[str]]:
    """The rows of a csv reader; a row it cannot read (a field past the csv module's size limit) names its line."""
    try:
        yield from reader
    except csv.Error as error:
        limit = csv.field_size_limit()
        # No task text needs that much (examples are cut to task.max_length tokens): rather a broken file,
        # e.g. a CSV quote never closed. The limit is process-wide, so it stays as it is.
        reason = (
            f"a field longer than {limit:,} characters, the most a field may hold"
            if "field larger than field limit" in str(error)
            else str(error)
        )
        raise DataFileError(reason, source=path, line=reader.line_num) from None


def json_records(handle, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) per non-empty line of a JSON Lines file; invalid JSON names its line."""
    for line, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataFileError(f"invalid JSON ({error.msg})", source=path, line=line) from None
        if not isinstance(record, dict):
            raise DataFileError(
                f"expected a JSON object, found {type(record).__name__}", source=path, line=line, value=record
            )
        yield line, record


def examples_from_records(spec: TaskSpec, path: Path, records: Iterator[tuple[int, dict]]) -> TaskExamples:
    """Texts, labels and ids from checked records; a file is labelled when its first record has the label.

    The texts and ids are packed (PackedRows, PackedStrings): a large file's examples take about its size."""
    texts = PackedRows()
    labels: list[list[float] | float | int] = []  # a 0/1 row (multilabel), a score or a class index per example
    ids = PackedStrings()
    labelled = None
    for line, record in records:
        missing = [name for name in spec.text_columns if name not in record]
        if missing:
            raise DataFileError(f"missing key(s) {', '.join(missing)}", source=path, line=line, value=missing)
        texts.append(spec.model_texts(tuple(_text(record[name], name, path, line) for name in spec.text_columns)))
        ids.append(str(record[spec.index_column]) if spec.index_column in record else str(len(ids)))
        if labelled is None:
            labelled = has_label_set(spec, record) if spec.label_sets else spec.label_column in record
        if labelled and spec.label_sets:  # a 0/1 row over the task's labels
            labels.append(label_set_row(spec, record, path, line))
        elif labelled:
            if spec.label_column not in record:
                raise DataFileError(
                    f"missing key {spec.label_column} (earlier lines have it)",
                    source=path,
                    line=line,
                    value=spec.label_column,
                )
            labels.append(_parse_label(spec, record[spec.label_column], path, line))
    if not texts:
        raise DataFileError("no examples", source=path)
    if not labelled:
        return TaskExamples(texts, None, ids)
    dtype = np.float32 if spec.is_regression or spec.label_sets else np.int64
    return TaskExamples(texts, np.array(labels, dtype=dtype), ids)


def _text(value: Any, name: str, path: Path, line: int) -> str:
    """A text field; JSON can hold other types, which are refused rather than turned into strings."""
    if not isinstance(value, str):
        raise DataFileError(f"{name} is not a string ({value!r})", source=path, line=line, value=value)
    return value


def _parse_label(spec: TaskSpec, value: Any, path: Path, line: int) -> float | int:
    """A class index from the label string, or a float score; a bad label names the file and line."""
    if spec.is_regression:
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise DataFileError(f"label '{value}' is not a number", source=path, line=line, value=value) from None
        # NaN or inf (1e999 reads as inf; float32 labels make inf of anything past 3.4e38) poisons the loss and
        # the dev scores: refused here, where the line is known.
        if not math.isfinite(score) or abs(score) > FLOAT32_MAX:
            beyond = f" as a 32-bit float (past ±{FLOAT32_MAX:.1e})" if math.isfinite(score) else ""
            raise DataFileError(f"label '{value}' is not a finite number{beyond}", source=path, line=line, value=value)
        return score
    # JSON Lines may hold numbers and booleans: 1 stands for the text "1", true for "true" (1.0 for nothing).
    label, labels = label_text(value), spec.file_labels or spec.labels
    assert labels is not None  # a classifier's spec has its classes (regression returned above)
    if label not in labels:
        raise DataFileError(
            f"label '{value}' is not one of {', '.join(labels)}" + _label_hint(label, labels),
            source=path,
            line=line,
            value=value,
        )
    return labels.index(label)


YAML_BOOLEAN_WORDS = {"yes", "no", "on", "off"}  # what YAML 1.1 (PyYAML) also reads as true or false


def _label_hint(label: Any, labels: tuple[str, ...]) -> str:
    """Why a file's label may have missed the recipe's: a letter case, or YAML's reading of unquoted yes/no."""
    if not isinstance(label, str):
        return ""
    if label.lower() in YAML_BOOLEAN_WORDS and {"true", "false"} & set(labels):
        return f" (YAML reads an unquoted {label} in task.labels as true or false: quote it, '{label}')"
    same = next((known for known in labels if known.lower() == label.lower()), None)
    return f" (labels compare as written: '{same}' is not '{label}'; write '{label}' in task.labels)" if same else ""


def task_documents(spec: TaskSpec, data_dir: Path, splits: list[str]) -> list[str]:
    """Every non-empty text of the splits, one document each: a task's own text for language-model fine-tuning."""
    documents = []
    for split in splits:
        for texts in read_task_split(spec, data_dir, split).texts:
            documents += [document for document in map(document_text, texts) if document]
    return documents
