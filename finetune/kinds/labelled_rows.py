"""task.labels_per_class: few labels, drawn class by class from the training rows (kinds classification and
multilabel), and the record of the rows taken.

The recipe's `draw` decides the data and its `seed` the training: task.dev_split holds its dev rows out with the draw
as seed, and the labelled rows are then drawn from the rows left for training with NumPy's generator seeded by the
draw (a run of `draws` runs draw d with seed d), so the same draw of the same training file gives the same rows to
every seed. Classification: per class, in label order, labels_per_class of its rows without replacement (all of them
when it has fewer, said in one line). Multi-label: the labels from the rarest up, then the rows of no label as one
more class, each topped up to labels_per_class rows carrying it with rows not drawn yet; a label common among the
rows drawn for rarer ones may so get more. The rows taken (the training file's row numbers from 0, in file order)
go to RUN_DIR/labelled_rows.json with their count per class, and a resumed run checks it draws the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from finetune.console import console
from finetune.data.examples import TaskExamples
from finetune.data.task_files import read_labelled_split
from finetune.errors import UserError
from finetune.kinds.dev_split import Rows, drawn_split, row_count, take_rows, train_and_dev
from finetune.tasks.specs import TaskSpec, task_spec

LABELLED_ROWS_FILE = "labelled_rows.json"
NO_LABEL = "(no label)"  # a multi-label task's rows without any label, drawn as one more class


def class_rows(labels: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The rows of each class (class indices), or of each label and of no label (multi-label 0/1 rows)."""
    labels = np.asarray(labels)
    if labels.ndim == 1:
        return {name: np.flatnonzero(labels == index) for index, name in enumerate(names)}
    present = labels.astype(bool)
    groups = {name: np.flatnonzero(present[:, index]) for index, name in enumerate(names)}
    return groups | {NO_LABEL: np.flatnonzero(~present.any(axis=1))}


def check_classes(groups: dict[str, np.ndarray], per_class: int, draw: int) -> None:
    """A class of the task must have rows to draw, and more than one when more are asked for."""
    for name, rows in groups.items():
        if name == NO_LABEL:
            continue
        if len(rows) == 0 or (len(rows) == 1 and per_class > 1):
            count = "no training rows" if len(rows) == 0 else "1 training row"
            raise UserError(
                f"task.labels_per_class: class '{name}' has {count} (draw {draw}, after any dev_split) to draw "
                f"{per_class} from; label more rows of it" + (", or set labels_per_class: 1" if rows.size else "")
            )


def draw_rows(labels: np.ndarray, names: tuple[str, ...], per_class: int, draw: int) -> list[int]:
    """The rows drawn (positions in `labels`, sorted): per_class of each class, with `draw` as seed."""
    generator = np.random.default_rng(draw)
    groups = class_rows(labels, names)
    if np.asarray(labels).ndim == 1:
        taken = [generator.permutation(rows)[:per_class] for rows in groups.values()]
        return sorted(int(row) for rows in taken for row in rows)
    chosen: set[int] = set()
    labelled = [name for name in names if len(groups[name])]
    for name in [*sorted(labelled, key=lambda label: len(groups[label])), NO_LABEL]:  # stable: ties in label order
        rows = groups[name]
        needed = per_class - sum(int(row) in chosen for row in rows)
        candidates = [int(row) for row in generator.permutation(rows) if int(row) not in chosen]
        chosen.update(candidates[: max(needed, 0)])
    return sorted(chosen)


def labelled_subset(
    labels: np.ndarray, names: tuple[str, ...], per_class: int, draw: int, file_rows: list[int]
) -> dict[str, Any]:
    """The draw's record: labels_per_class, draw, pool_rows (the training rows drawn from), rows (their training file
    row numbers; `file_rows` maps the pool's positions to those), counts per class and the classes that had fewer."""
    groups = class_rows(labels, names)
    check_classes(groups, per_class, draw)
    positions = draw_rows(labels, names, per_class, draw)
    taken = set(positions)
    counts = {name: sum(int(row) in taken for row in rows) for name, rows in groups.items() if len(rows)}
    return {
        "labels_per_class": per_class,
        "draw": draw,
        "pool_rows": len(file_rows),
        "rows": [int(file_rows[position]) for position in positions],
        "positions": positions,
        "counts": counts,
        "fewer": {name: len(rows) for name, rows in groups.items() if 0 < len(rows) < per_class},
    }


def describe(record: dict[str, Any]) -> str:
    """One line: the rows drawn of how many, per class, and the classes that had fewer rows than asked."""
    counts = ", ".join(f"{name} {count}" for name, count in record["counts"].items())
    fewer = "; ".join(f"class '{name}' has {count} rows, all taken" for name, count in record["fewer"].items())
    return (
        f"task.labels_per_class {record['labels_per_class']}, draw {record['draw']}: {len(record['rows'])} of the "
        f"{record['pool_rows']} training rows ({counts})" + (f"; {fewer}" if fewer else "")
    )


def check_same_rows(run_dir: Path, record: dict[str, Any]) -> None:
    """For --resume: the rows drawn now are those the run started with (RUN_DIR/labelled_rows.json)."""
    path = Path(run_dir) / LABELLED_ROWS_FILE
    if not path.is_file():
        return
    recorded = json.loads(path.read_text(encoding="utf-8"))
    if recorded.get("rows") != record["rows"]:
        raise UserError(
            f"task.labels_per_class: draw {record['draw']} now takes other training rows than {path} recorded (the "
            "training file or dev_split changed since the run started); restore them, or start again with "
            "overwrite=true"
        )


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """RUN_DIR/labelled_rows.json: the rows a run trained on (the pool's positions left out)."""
    kept = {key: value for key, value in record.items() if key != "positions"}
    (Path(run_dir) / LABELLED_ROWS_FILE).write_text(json.dumps(kept) + "\n", encoding="utf-8")


def drawn_training_rows(train: Rows, spec: TaskSpec, recipe, held_out: dict | None, resuming: bool, say: bool = True):
    """A run's training examples cut to the draw's rows, and the draw's record (said in one line, where `say`;
    `resuming`: checked against the one the run started with)."""
    file_rows = held_out["train"] if held_out is not None else list(range(row_count(train)))
    labels, names = getattr(train, "labels", None), spec.labels
    assert labels is not None and names is not None  # the kinds with labels_per_class read labelled classes
    record = labelled_subset(labels, names, recipe.task.labels_per_class, recipe.draw, file_rows)
    if resuming:
        check_same_rows(recipe.run_dir, record)
    if say:
        console.print(describe(record), markup=False, highlight=False, soft_wrap=True)
    return take_rows(train, record["positions"]), record


def training_and_dev_rows(
    spec: TaskSpec, recipe, read: Callable[[str], Rows], strata=None, resuming: bool = False, say: bool = True
) -> tuple[Rows, Rows, dict | None, dict | None]:
    """A run's training and dev examples, `read` from their files, or with task.dev_split held out of the training
    rows (kinds/dev_split.py: seeded, stratified by `strata`); with task.labels_per_class, the training rows drawn
    class by class. Returns them with dev_split's record and the draw's (None where the recipe has neither)."""
    per_class = getattr(recipe.task, "labels_per_class", None)  # a key of the kinds that draw rows
    data_seed = recipe.seed if per_class is None else recipe.draw  # with labels_per_class, the draw picks the data
    train, dev, held_out = train_and_dev(spec, recipe.task, read, data_seed, recipe.run_dir, strata)
    drawn = None
    if per_class is not None:
        train, drawn = drawn_training_rows(train, spec, recipe, held_out, resuming, say)
    return train, dev, held_out, drawn


def labelled_rows(recipe) -> tuple[TaskExamples, TaskExamples]:
    """The training and dev rows a classification run of `recipe` reads (read again, without a word): what
    self-training counts per class and leaves out of the text it labels."""
    spec = task_spec(recipe.task)
    train, dev, _, _ = training_and_dev_rows(
        spec,
        recipe,
        lambda split: read_labelled_split(spec, recipe.task.data_dir, split),
        lambda examples: examples.labels,
        say=False,
    )
    return train, dev


def check_draws(recipe) -> None:
    """Before a run of draws trains: every draw's rows can be drawn, and the draws differ (some class has more rows
    than labels_per_class takes); each refusal one line naming the key."""
    task, per_class = recipe.task, recipe.task.labels_per_class
    spec = task_spec(task)
    assert spec.labels is not None  # the kinds with labels_per_class list their classes
    labels = read_labelled_split(spec, task.data_dir, "train").labels
    assert labels is not None  # read_labelled_split refuses a file without labels
    for draw in range(recipe.draws):
        rows = list(range(len(labels)))
        if task.dev_split is not None:  # the rows it leaves for training, as each run of the draw holds out
            strata = labels if labels.ndim == 1 else None
            rows = drawn_split(len(labels), task.dev_split, draw, strata)[0]
        record = labelled_subset(labels[rows], spec.labels, per_class, draw, rows)
        if recipe.draws > 1 and len(record["rows"]) == len(rows):
            raise UserError(
                f"draws: every draw would take all {len(rows)} training rows (no class has more than "
                f"task.labels_per_class {per_class}), so the {recipe.draws} draws would be the same; lower "
                "labels_per_class, or set draws: 1"
            )
