"""A task's rows written into its run folder (RUN_DIR/data) before the run starts, in the layout the stages read: the
Python API's in-memory data (a pandas DataFrame, a `datasets.Dataset`, a list of dicts) and the dataset of
`task.source: hub`. The run's recipe then reads that folder (task.data_dir), so `--resume` and `finetune eval` of the
run read the same rows without the data being given again."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from finetune.errors import InputError
from finetune.run_dir import check_run_dir_free
from finetune.tasks.specs import DATA_DIR, TaskSpec

SPLITS = ("train", "dev", "test")
SOURCE_FILE = "source.json"  # where the rows came from (the hub dataset, or the Python call)


def staged_task(recipe: Any, splits: Mapping[str, Any] | None = None, resume: bool = False) -> Any:
    """The recipe reading its task from RUN_DIR/data, once the rows are written there: `splits` (split -> rows)
    when given, else the dataset of a custom task's `source: hub`; any other recipe is returned as it is.

    `resume`: the run exists; rows of a hub dataset already written are kept (no download), and given `splits` must
    be the rows the run started with.
    """
    task = getattr(recipe, "task", None)
    hub: Any = getattr(task, "hub", None) if getattr(task, "source", None) == "hub" else None
    if task is None or (not splits and hub is None):
        return recipe
    folder = Path(recipe.run_dir) / DATA_DIR
    staged_section = task.model_copy(update={"data_dir": folder, "source": "files", "hub": None})
    staged = recipe.model_copy(update={"task": staged_section})
    if resume and not splits and folder.is_dir():
        return staged  # the rows written when the run started
    if not resume:
        check_run_dir_free(recipe)  # the run's own errors (a finished run, someone else's files) before writing
    if splits:
        unknown = sorted(set(splits) - set(SPLITS))
        if unknown:
            raise InputError(f"data: '{unknown[0]}' is not a task split (train, dev, test)")
        rows, source = dict(splits), {"from": "python"}
    else:
        from finetune.data.hub import load_hub_dataset, split_rows  # late: `datasets` is slow to import

        dataset = load_hub_dataset(hub.name, hub.config, hub.data_files)
        rows = {split: split_rows(dataset, name, hub.name) for split, name in hub.splits.items()}
        source = {"from": "hub", **hub.model_dump(mode="json")}
    files = {split: task_file_text(staged_section.spec(), split, data) for split, data in rows.items()}
    write_rows(folder, files, source, resume)
    return staged


def write_rows(folder: Path, files: dict[str, tuple[str, str]], source: dict[str, Any], resume: bool) -> None:
    """Write split -> (file name, text) into `folder`, replacing what was there (`resume`: it must be the same)."""
    if resume and folder.is_dir():
        for split, (name, text) in files.items():
            path = folder / name
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                raise InputError(
                    f"the {split} rows differ from those the run started with ({path}): a resumed run reads the same"
                )
        return
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, text in files.values():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")


def task_file_text(spec: TaskSpec, split: str, data: Any) -> tuple[str, str]:
    """(file name, contents) of one split's rows in the task's layout: its file name and format (JSON Lines for a
    custom task that names none); a missing column or a text that is not one is a one-line error naming the split."""
    records, columns = as_records(data, split)
    needed = list(spec.text_columns) + ([spec.label_column] if split != "test" and spec.label_column else [])
    missing = [column for column in needed if column not in columns]
    if missing:
        raise InputError(
            f"{split}: missing column(s) {', '.join(missing)} (columns: {', '.join(map(str, columns)) or 'none'})",
            value=missing,
        )
    kept = [
        column
        for column in (spec.index_column, *spec.text_columns, spec.label_column)
        if column in columns and column and (split == "test" or column != spec.index_column)
    ]
    rows = [_checked_row(record, kept, spec, split, number) for number, record in enumerate(records, start=1)]
    if not rows:
        raise InputError(f"{split}: no rows")
    name = spec.files[split] if spec.files and split in spec.files else f"{split}.{spec.file_format or 'jsonl'}"
    file_format = spec.file_format or Path(name).suffix.lstrip(".").lower()
    return name, _file_text(rows, kept, file_format, spec.headerless_columns.get(split), split)


def as_records(data: Any, split: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows as dicts, the column names) of a pandas DataFrame, a `datasets.Dataset` or a list of dicts."""
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame (pandas is not imported here)
        return data.to_dict("records"), [str(column) for column in data.columns]
    if hasattr(data, "features") and hasattr(data, "to_list"):  # a datasets.Dataset
        from finetune.data.hub import dataset_rows

        return dataset_rows(data), list(data.column_names)
    if isinstance(data, list | tuple) and all(isinstance(row, Mapping) for row in data):
        columns = sorted(set.intersection(*(set(row) for row in data))) if data else []
        return [dict(row) for row in data], columns
    raise InputError(f"{split}: expected a pandas DataFrame, a datasets.Dataset or a list of dicts, not {type(data)}")


def _checked_row(record: dict[str, Any], kept: list[str], spec: TaskSpec, split: str, number: int) -> dict[str, Any]:
    row = {}
    for column in kept:
        value = record[column]
        value = value.item() if hasattr(value, "item") else value  # numpy and torch scalars
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise InputError(f"{split} row {number}: {column} is empty", value=column)
        if column in spec.text_columns and not isinstance(value, str):
            raise InputError(f"{split} row {number}: {column} is not a text ({value!r})", value=value)
        row[column] = value
    return row


def _file_text(
    rows: list[dict[str, Any]], columns: list[str], file_format: str, headerless: tuple[str, ...] | None, split: str
) -> str:
    """JSON Lines, CSV or TSV (GLUE's: no quoting, so a tab or a line break in a value cannot be written)."""
    if file_format == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    header = list(headerless) if headerless else columns
    if file_format == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if not headerless:
            writer.writerow(header)
        writer.writerows([row.get(column, "") for column in header] for row in rows)
        return buffer.getvalue()
    lines = [] if headerless else ["\t".join(header)]
    for number, row in enumerate(rows, start=1):
        values = [str(row.get(column, "")) for column in header]
        if any("\t" in value or "\n" in value or "\r" in value for value in values):
            raise InputError(f"{split} row {number}: a tab or a line break in a value, which a TSV file cannot hold")
        lines.append("\t".join(values))
    return "\n".join(lines) + "\n"
