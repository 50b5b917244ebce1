"""task.dev_split: a dev set held out of the training rows of a task that has no dev file.

scikit-learn's train_test_split draws it with the recipe's seed, stratified by label where the kind has one label
per example (classification). The rows it took are written to RUN_DIR/dev_split.json (and copied beside the
checkpoint), so a resumed run, a re-run and `finetune eval` of the run hold out the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from finetune.data.examples import PackedRows, PackedStrings, TaskExamples
from finetune.data.task_files import read_task_split, task_file
from finetune.errors import DataFileError, InputError, UserError
from finetune.tasks.specs import TaskSpec

DEV_SPLIT_FILE = "dev_split.json"
Rows = TypeVar("Rows")  # a kind's examples read from a file: a dataclass of lists (or arrays) with a row each


def train_and_dev(
    spec: TaskSpec,
    task: Any,
    read: Callable[[str], Rows],
    seed: int,
    run_dir: Path,
    strata: Callable[[Rows], Any] | None = None,
) -> tuple[Rows, Rows, dict[str, Any] | None]:
    """The training and dev examples of every task kind: `read("train")` and `read("dev")`, or with task.dev_split
    the training file's rows shared between them, and the split's record for write_split (the run's split:
    held_out_rows). `strata`: a label per training row to draw dev in proportion by (classification)."""
    if task.dev_split is None:
        return read("train"), read("dev"), None
    refuse_a_dev_file(spec, task.data_dir)
    examples = read("train")
    record = held_out_rows(
        run_dir, row_count(examples), task.dev_split, seed, None if strata is None else strata(examples)
    )
    return take_rows(examples, record["train"]), take_rows(examples, record["dev"]), record


def refuse_a_dev_file(spec: TaskSpec, data_dir: Path | None) -> None:
    """task.dev_split makes the dev set: a task with a dev file (or the hub's) has one already."""
    if spec.source == "hub":
        raise UserError("task.dev_split: the hub's task has a dev split of its own; remove dev_split")
    try:
        found = task_file(spec, data_dir, "dev")
    except (DataFileError, InputError):
        return
    raise UserError(f"task.dev_split: the task has a dev file, {found}; remove dev_split or the dev file")


def row_count(examples: Any) -> int:
    """The rows of a kind's examples: the length of their first list (or array) field."""
    return next(len(value) for value in _columns(examples))


def take_rows(examples: Rows, rows: Sequence[int]) -> Rows:
    """The examples of `rows` only: every field with a value per row cut to those rows, the others kept."""
    count = row_count(examples)
    changes: dict[str, Any] = {}
    for field in fields(examples):  # type: ignore[arg-type]  # a dataclass instance (the kinds' readers')
        value = getattr(examples, field.name)
        if isinstance(value, np.ndarray) and len(value) == count:
            changes[field.name] = value[np.asarray(rows, dtype=np.int64)]
        elif isinstance(value, list) and len(value) == count:
            changes[field.name] = [value[row] for row in rows]
        elif isinstance(value, (PackedRows, PackedStrings)) and len(value) == count:
            changes[field.name] = value.take(rows)
    return replace(examples, **changes)  # type: ignore[type-var]


def _columns(examples: Any) -> list:
    return [
        getattr(examples, field.name)
        for field in fields(examples)
        if isinstance(getattr(examples, field.name), (list, np.ndarray, PackedRows, PackedStrings))
    ]


def drawn_split(
    count: int, share: float, seed: int, strata: Sequence | np.ndarray | None = None
) -> tuple[list[int], list[int]]:
    """(training rows, dev rows), each in file order: `share` of `count` rows drawn as dev with `seed`, in the
    same proportion from each stratum where `strata` (a label per row) is given."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(count)
    if count < 2:
        raise UserError(f"task.dev_split: the training data has {count} row(s); holding out dev rows needs 2 or more")
    try:
        train, dev = train_test_split(rows, test_size=share, random_state=seed, shuffle=True, stratify=strata)
    except ValueError as error:  # e.g. a class with one example cannot be split in proportion
        raise UserError(f"task.dev_split: {share:g} of the {count} training rows, by label: {error}") from None
    return sorted(int(row) for row in train), sorted(int(row) for row in dev)


def held_out_rows(
    run_dir: Path, count: int, share: float, seed: int, strata: Sequence | np.ndarray | None
) -> dict[str, Any]:
    """The split of the run (its record: share, seed, train_rows, train, dev): the one RUN_DIR/dev_split.json
    holds when it was drawn from the same rows, share and seed (a resumed run, a re-run), else a new draw, which
    write_split puts there once the run folder is the run's."""
    path = Path(run_dir) / DEV_SPLIT_FILE
    if path.is_file():
        recorded = read_split(path)
        if (recorded["train_rows"], recorded["share"], recorded["seed"]) == (count, share, seed):
            return recorded
    train, dev = drawn_split(count, share, seed, strata)
    return {"share": share, "seed": seed, "train_rows": count, "train": train, "dev": dev}


def write_split(run_dir: Path, record: dict[str, Any]) -> None:
    """RUN_DIR/dev_split.json: the rows a run held out (`held_out_rows`'s record)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / DEV_SPLIT_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")


def read_split(path: Path) -> dict:
    """A dev_split.json, checked: its rows are the training file's row numbers (from 0, file order)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        keys = ("share", "seed", "train_rows", "train", "dev")
        if not isinstance(record, dict) or any(key not in record for key in keys):
            raise ValueError(f"expected the keys {', '.join(keys)}")
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a dev split written by finetune ({error})") from None
    return record


def recorded_dev_rows(checkpoints: Sequence[str | Path], count: int) -> list[int]:
    """For `finetune eval` with task.dev_split: the dev rows of the runs whose checkpoints are scored (their
    dev_split.json beside the checkpoint or in its run folder), the same for all of them."""
    found: dict[str, list[int]] = {}
    for checkpoint in checkpoints:
        folder = Path(checkpoint)
        path = next((where for where in (folder, folder.parent) if (where / DEV_SPLIT_FILE).is_file()), None)
        if path is None:
            raise UserError(
                f"task.dev_split: no {DEV_SPLIT_FILE} beside {checkpoint} or in its run folder (the finetune run "
                "that held the dev rows out writes it)"
            )
        record = read_split(path / DEV_SPLIT_FILE)
        if record["train_rows"] != count:
            raise UserError(
                f"task.dev_split: {path / DEV_SPLIT_FILE} took its rows of {record['train_rows']} training rows; "
                f"the training file now has {count}"
            )
        found[str(checkpoint)] = record["dev"]
    splits = list(found.values())
    if any(split != splits[0] for split in splits[1:]):
        raise UserError("task.dev_split: the checkpoints held out different dev rows; score them one at a time")
    return splits[0]


def split_to_score(spec: TaskSpec, task: Any, recipe: Any) -> TaskExamples:
    """What `finetune eval` (an eval recipe) scores: the split's file, or with task.dev_split and split dev the
    training rows the scored runs (models, ensembles' members) held out."""
    if recipe.split != "dev":
        return read_task_split(spec, task.data_dir, recipe.split)
    checkpoints = [*(recipe.models or {}).values(), *(m for ms in (recipe.ensembles or {}).values() for m in ms)]
    return dev_examples(spec, task, checkpoints)


def dev_examples(
    spec: TaskSpec, task: Any, checkpoints: Sequence[str | Path], read: Callable[[str], Any] | None = None
) -> Any:
    """The dev rows the runs of `checkpoints` were scored on: the task's dev file, or with task.dev_split the
    training rows they held out (the same for all of them). `read(split)` reads a split's file: a table of the
    task's columns unless the kind reads another layout (a tagger's CoNLL columns)."""
    read = read or (lambda split: read_task_split(spec, task.data_dir, split))
    if getattr(task, "dev_split", None) is None:
        return read("dev")
    refuse_a_dev_file(spec, task.data_dir)
    examples = read("train")
    return take_rows(examples, recorded_dev_rows(checkpoints, row_count(examples)))
