"""Text without labels, read as a task's examples: what `finetune predict` predicts and what self-training
pseudo-labels (`unlabelled_text`).

A file is a table by its extension (.tsv, .csv, .jsonl: the task's text columns by name, any other column, a label
column included, ignored) or else plain text, one example per non-empty line (a task of several text columns: their
texts separated by tabs, in the task's column order). The texts are the text columns as they are, not yet what the
model reads (a `task.text` template is filled in by whoever reads them to a model).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from finetune.data.examples import TaskExamples
from finetune.data.task_files import FORMAT_BY_EXTENSION, first_undecodable_line, read_examples_file
from finetune.errors import DataFileError
from finetune.tasks.specs import TaskSpec

NO_COLUMN = "\0"  # a column no file has: the label and index columns of a file read without labels


def without_labels(spec: TaskSpec) -> TaskSpec:
    """The spec that reads a file of the task's text columns alone: labels and ids ignored, no template applied."""
    return spec.without_labels(NO_COLUMN)


def is_table(path: Path) -> bool:
    """Whether a file is read as a table (by its extension) rather than as plain lines."""
    return Path(path).suffix.lower() in FORMAT_BY_EXTENSION


def read_unlabelled_file(path: Path, spec: TaskSpec) -> TaskExamples:
    """A file's examples without labels: a table by extension, anything else one example per line."""
    path = Path(path)
    if is_table(path):
        return read_examples_file(without_labels(spec), path, FORMAT_BY_EXTENSION[path.suffix.lower()])
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            return plain_lines(handle, str(path), spec)
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path, line=first_undecodable_line(path)) from None


def plain_lines(lines: Iterable[str], name: str, spec: TaskSpec) -> TaskExamples:
    """One example per non-empty line, its line number as id; the texts of several text columns separated by tabs."""
    texts, ids = [], []
    width = len(spec.text_columns)
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = tuple(line.split("\t")) if width > 1 else (line,)
        if len(parts) != width:
            raise DataFileError(
                f"task '{spec.name}' reads {width} tab-separated texts ({', '.join(spec.text_columns)}), "
                f"found {len(parts)}",
                source=name,
                line=number,
            )
        texts.append(parts)
        ids.append(str(number))
    if not texts:
        raise DataFileError("no text (every line is empty)", source=name)
    return TaskExamples(texts, None, ids)


def read_unlabelled_text(paths: list[Path], spec: TaskSpec, limit: int | None = None) -> TaskExamples:
    """Self-training's text: the examples of every file in turn, the first `limit` of them (None: all). Plain text
    is one text a line, so a task of several text columns needs a table that names them."""
    texts: list[tuple[str, ...]] = []
    for path in paths:
        if limit is not None and len(texts) >= limit:
            break
        if not is_table(path) and len(spec.text_columns) > 1:
            raise DataFileError(
                f"plain text holds one text a line, and task '{spec.name}' reads {len(spec.text_columns)} text "
                f"columns ({', '.join(spec.text_columns)}): give a .tsv, .csv or .jsonl file with those columns",
                source=path,
            )
        texts += [tuple(row) for row in read_unlabelled_file(path, spec).texts]
    texts = texts[:limit]
    return TaskExamples(texts, None, [str(row) for row in range(len(texts))])
