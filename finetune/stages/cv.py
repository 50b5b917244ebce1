"""`finetune cv`: k-fold cross-validation of one finetune recipe on its training file.

The training file's rows are split into K folds (scikit-learn's StratifiedKFold for a task with classes, KFold
otherwise; shuffled with the recipe's seed). Fold i trains on the other folds and is scored on fold i: its task files
are written to CV_DIR/fold-i/task (train and dev, in the training file's format, its header kept) and its run goes to
CV_DIR/fold-i/run, an ordinary run folder. CV_DIR/cv.md (printed too) and cv.json hold each fold's dev scores and
their mean and standard deviation. The task's own dev file is not used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from finetune.console import console
from finetune.data.task_files import read_labelled_split, task_file
from finetune.errors import UserError
from finetune.kinds.fine_tuning import RESULT_FILE
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from finetune.stages.search import refuse_several_processes
from finetune.stages.search_report import cv_markdown
from finetune.stages.seeds import summarise_values
from finetune.tasks.specs import task_spec

SUMMARY_MARKDOWN, SUMMARY_JSON = "cv.md", "cv.json"


def fold_indices(labels: np.ndarray, folds: int, seed: int, stratified: bool) -> list[np.ndarray]:
    """The rows of each fold's dev part (each row in exactly one), stratified by `labels` when asked."""
    from sklearn.model_selection import KFold, StratifiedKFold

    rows = np.arange(len(labels))
    if stratified:  # a class on fewer rows than folds would be missing from some fold's dev part
        classes, counts = np.unique(labels, return_counts=True)
        if counts.min() < folds:
            rarest = classes[counts.argmin()]
            raise UserError(
                f"--folds {folds}: class {rarest} has {counts.min()} training rows, fewer than the folds; "
                f"use --folds {max(2, int(counts.min()))} or fewer"
            )
    splitter = StratifiedKFold if stratified else KFold
    try:
        return [dev for _, dev in splitter(n_splits=folds, shuffle=True, random_state=seed).split(rows, labels)]
    except ValueError as error:  # fewer rows (or rows of a class) than folds
        raise UserError(f"--folds {folds}: {error}") from None


def run_cv(recipe_path: Path, overrides: list[str], folds: int, run_dir: Path | None = None) -> Path:
    """Cross-validate the recipe over `folds` folds; returns the folder holding the folds and the summary."""
    refuse_several_processes("cv")
    recipe: Any = load_recipe(recipe_path, overrides, expected_stage="finetune")  # a finetune recipe: a task section
    if recipe.seeds is not None:
        raise UserError(f"recipe {recipe_path}: seeds: a fold is one run; remove seeds")
    if recipe.draws is not None:
        raise UserError(f"recipe {recipe_path}: draws: a fold is one run; remove draws")
    if folds < 2:
        raise UserError(f"--folds {folds}: expected at least 2")
    spec = task_spec(recipe.task)
    if spec.source == "hub":
        raise UserError(f"recipe {recipe_path}: task.source: cv splits a training file; hub tasks are not supported")
    train_path = task_file(spec, recipe.task.data_dir, "train")
    labels = read_labelled_split(spec, recipe.task.data_dir, "train").labels
    assert labels is not None  # read_labelled_split refuses a file without labels
    header, rows = _split_lines(train_path, len(labels))
    stratified = spec.labels is not None and not spec.label_sets
    folder = Path(run_dir or f"{recipe.run_dir}-cv")
    results = {}
    for index, dev_rows in enumerate(fold_indices(labels, folds, recipe.seed, stratified)):
        console.print(f"[bold]fold {index}[/bold] ({index + 1} of {folds}): {len(dev_rows)} dev rows")
        task_dir = _write_fold(folder / f"fold-{index}" / "task", _fold_files(spec, train_path), header, rows, dev_rows)
        fold_dir = folder / f"fold-{index}" / "run"
        fold = load_recipe(
            recipe_path, [*overrides, f"run_dir={fold_dir}", f"task.data_dir={task_dir}"], expected_stage="finetune"
        )
        run_finetune(fold)
        result = json.loads((fold_dir / RESULT_FILE).read_text(encoding="utf-8"))
        results[index] = result["best" if result["saved"] == "best" else "last"]
    metrics = [name for name in results[0] if name.startswith("dev_")]
    summary = {
        "folds": folds,
        "splitter": "StratifiedKFold" if stratified else "KFold",
        "seed": recipe.seed,
        "train_file": str(train_path),
        "metrics": {name: summarise_values([results[i][name] for i in range(folds)]) for name in metrics},
    }
    (folder / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    markdown = cv_markdown(summary)
    (folder / SUMMARY_MARKDOWN).write_text(markdown, encoding="utf-8")
    console.print(markdown, markup=False, highlight=False, soft_wrap=True)
    return folder


def _split_lines(path: Path, examples: int) -> tuple[str | None, list[str]]:
    """The training file's header line (None: headerless) and its data lines, one per example."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) == examples + 1:
        return lines[0], lines[1:]
    if len(lines) == examples:
        return None, lines
    raise UserError(
        f"{path}: {examples} examples on {len(lines)} lines; cv splits files of one example per line "
        "(a header line allowed)"
    )


def _fold_files(spec, train_path: Path) -> dict[str, str]:
    """The names a fold's train and dev files take: task.files's, else train / dev with the training file's type."""
    if spec.files is not None:
        return {split: spec.files.get(split) or f"{split}{train_path.suffix}" for split in ("train", "dev")}
    return {split: f"{split}{train_path.suffix}" for split in ("train", "dev")}


def _write_fold(task_dir: Path, names: dict[str, str], header: str | None, rows: list[str], dev_rows) -> Path:
    """The fold's train and dev files: the training file's header and the rows of each part, in the file's order."""
    dev = set(dev_rows.tolist())
    head = [] if header is None else [header]
    parts = {"train": [row for i, row in enumerate(rows) if i not in dev], "dev": [rows[i] for i in sorted(dev)]}
    for split, lines in parts.items():
        path = task_dir / names[split]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(head + lines) + "\n", encoding="utf-8")
    return task_dir
