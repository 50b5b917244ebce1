"""`finetune cv`: k folds of the training file (stratified), a run per fold, the mean and spread of the dev scores."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.stages.cv import fold_indices
from tests.conftest import finetune_recipe, one_error_line, save_tiny_masked_lm, write_task, write_yaml

runner = CliRunner()


def test_folds_cover_every_row_once_and_keep_the_class_shares():
    labels = np.array([0] * 30 + [1] * 10)
    folds = fold_indices(labels, 5, seed=0, stratified=True)
    assert sorted(np.concatenate(folds).tolist()) == list(range(40))
    assert [int(labels[fold].sum()) for fold in folds] == [2] * 5  # 10 positives: 2 in each fold of 8
    assert [len(fold) for fold in fold_indices(np.zeros(10), 3, seed=0, stratified=False)] == [4, 3, 3]
    with pytest.raises(
        UserError, match="--folds 5: class 1 has 3 training rows, fewer than the folds; use --folds 3"
    ):  # 3 rows of a class cannot fill 5 folds
        fold_indices(np.array([0] * 10 + [1] * 3), 5, seed=0, stratified=True)


def test_two_fold_cv_writes_fold_task_files_runs_and_the_mean_and_spread(tmp_path: Path):
    checkpoint = save_tiny_masked_lm(tmp_path / "lm", layers=1, hidden=16)
    data = finetune_recipe(checkpoint, write_task(tmp_path / "task", train_rows=20), tmp_path / "runs" / "ft")
    data["training"].update(epochs=1, max_steps=2)
    recipe = write_yaml(tmp_path / "recipe.yaml", data)
    result = runner.invoke(app, ["cv", str(recipe), "--folds", "2"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "runs" / "ft-cv"
    header = (tmp_path / "task" / "train.tsv").read_text(encoding="utf-8").splitlines()[0]
    dev_rows = []
    for index in (0, 1):
        train = (folder / f"fold-{index}" / "task" / "train.tsv").read_text(encoding="utf-8").splitlines()
        dev = (folder / f"fold-{index}" / "task" / "dev.tsv").read_text(encoding="utf-8").splitlines()
        assert train[0] == header and dev[0] == header and len(train) - 1 == len(dev) - 1 == 10
        assert sum(line.endswith("\t1") for line in dev[1:]) == 5  # stratified: half of each fold is positive
        dev_rows += dev[1:]
        assert (folder / f"fold-{index}" / "run" / "result.json").is_file()
    original = (tmp_path / "task" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert sorted(dev_rows) == sorted(original)  # every training row scored once
    summary = json.loads((folder / "cv.json").read_text(encoding="utf-8"))
    accuracy = summary["metrics"]["dev_accuracy"]
    scores = [
        json.loads((folder / f"fold-{index}" / "run" / "result.json").read_text(encoding="utf-8"))["best"][
            "dev_accuracy"
        ]
        for index in (0, 1)
    ]
    assert accuracy["values"] == scores and accuracy["mean"] == pytest.approx(statistics.fmean(scores))
    assert accuracy["std"] == pytest.approx(statistics.stdev(scores)) and summary["splitter"] == "StratifiedKFold"
    markdown = (folder / "cv.md").read_text(encoding="utf-8")
    assert "| mean |" in markdown and "| std |" in markdown and "2-fold cross-validation" in result.output


def test_a_recipe_with_seeds_is_refused_in_one_line(tmp_path: Path):
    data = finetune_recipe(tmp_path / "lm", write_task(tmp_path / "task"), tmp_path / "runs" / "ft")
    data["seeds"] = [0, 1]
    (tmp_path / "lm").mkdir()
    result = runner.invoke(app, ["cv", str(write_yaml(tmp_path / "recipe.yaml", data)), "--folds", "2"])
    assert result.exit_code == 2 and "seeds: a fold is one run" in one_error_line(result)


def test_cv_under_several_processes_is_refused_in_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under accelerate launch
    data = finetune_recipe(tmp_path / "lm", write_task(tmp_path / "task"), tmp_path / "runs" / "ft")
    (tmp_path / "lm").mkdir()
    result = runner.invoke(app, ["cv", str(write_yaml(tmp_path / "recipe.yaml", data)), "--folds", "2"])
    assert result.exit_code == 2 and "`finetune cv` runs in one process" in one_error_line(result)
