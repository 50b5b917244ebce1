"""A task's rows written into its run folder (finetune/data/run_data.py): a custom task's hub dataset or in-memory rows
become the files the stages read, in the task's own layout, and the recipe reads them from RUN_DIR/data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.data.run_data import staged_task
from finetune.data.task_files import read_task_split
from finetune.errors import InputError, UserError
from finetune.recipes import FinetuneRecipe
from tests.conftest import finetune_recipe

datasets = pytest.importorskip("datasets", reason="task.source hub reads datasets with the datasets library")


def hub_recipe(tmp_path: Path, hub: dict, **task_keys) -> FinetuneRecipe:
    data = finetune_recipe(tmp_path / "lm", tmp_path, tmp_path / "run")
    task = {"name": "reviews", "source": "hub", "hub": hub, "text_columns": ["review"], "label_column": "label"}
    data["task"] = task | task_keys
    return FinetuneRecipe.model_validate(data)


def files_recipe(tmp_path: Path) -> FinetuneRecipe:
    """The same task read from files (a folder that exists): what the Python API's rows replace."""
    data = finetune_recipe(tmp_path / "lm", tmp_path, tmp_path / "run")
    data["task"] = {"name": "reviews", "data_dir": str(tmp_path), "text_columns": ["review"], "label_column": "label"}
    return FinetuneRecipe.model_validate(data)


def test_a_saved_dataset_becomes_the_tasks_json_lines_files(tmp_path):
    label = datasets.ClassLabel(names=["neg", "pos"])
    features = datasets.Features({"review": datasets.Value("string"), "label": label})
    rows = {"review": ["bad film", "good film"], "label": [0, 1]}
    splits = {name: datasets.Dataset.from_dict(rows, features=features) for name in ("train", "validation", "test")}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "saved"))

    staged = staged_task(hub_recipe(tmp_path, {"name": str(tmp_path / "saved")}, labels=["neg", "pos"]))

    folder = tmp_path / "run" / "data"
    assert staged.task.data_dir == folder and staged.task.source == "files" and staged.task.hub is None
    assert (folder / "train.jsonl").read_text().splitlines() == [
        '{"review": "bad film", "label": "neg"}',
        '{"review": "good film", "label": "pos"}',
    ]
    assert json.loads((folder / "source.json").read_text())["name"] == str(tmp_path / "saved")
    dev = read_task_split(staged.task.spec(), staged.task.data_dir, "dev")
    assert dev.texts == [("bad film",), ("good film",)] and list(dev.labels) == [0, 1]


def test_local_csv_files_through_the_builder_with_the_tasks_file_names(tmp_path):
    (tmp_path / "a.csv").write_text('review,label,extra\n"good, really",1,x\nbad,0,y\n', encoding="utf-8")
    (tmp_path / "b.csv").write_text("review,label\nfine,1\n", encoding="utf-8")
    hub = {"name": "csv", "data_files": {"train": str(tmp_path / "a.csv"), "held": str(tmp_path / "b.csv")}}
    hub["splits"] = {"train": "train", "dev": "held"}

    staged = staged_task(hub_recipe(tmp_path, hub, files={"train": "train.csv", "dev": "dev.tsv"}))

    folder = tmp_path / "run" / "data"
    assert (folder / "train.csv").read_text() == 'review,label\n"good, really",1\nbad,0\n'  # only the task's columns
    assert (folder / "dev.tsv").read_text() == "review\tlabel\nfine\t1\n"
    train = read_task_split(staged.task.spec(), folder, "train")
    assert train.texts == [("good, really",), ("bad",)] and list(train.labels) == [1, 0]


def test_a_missing_column_of_the_dataset_is_one_line(tmp_path):
    (tmp_path / "a.csv").write_text("text,label\ngood,1\n", encoding="utf-8")
    hub = {"name": "csv", "data_files": {"train": str(tmp_path / "a.csv")}, "splits": {"train": "train"}}
    with pytest.raises(InputError, match=r"^train: missing column\(s\) review \(columns: label, text\)$"):
        staged_task(hub_recipe(tmp_path, hub))
    assert not (tmp_path / "run").exists()


def test_rows_are_checked_row_by_row(tmp_path):
    recipe = files_recipe(tmp_path)
    with pytest.raises(InputError, match=r"^train row 2: review is not a text \(3\)$"):
        staged_task(recipe, {"train": [{"review": "a", "label": 1}, {"review": 3, "label": 0}]})
    with pytest.raises(InputError, match=r"^dev row 1: label is empty$"):
        staged_task(recipe, {"dev": [{"review": "a", "label": None}]})
    with pytest.raises(UserError, match="'validation' is not a task split"):
        staged_task(recipe, {"validation": [{"review": "a", "label": 1}]})
    with pytest.raises(UserError, match=r"expected a pandas DataFrame, a datasets\.Dataset or a list of dicts"):
        staged_task(recipe, {"train": "train.csv"})


def test_a_glue_task_gets_glue_tsv_files_without_a_tab_inside_a_value(tmp_path):
    data = finetune_recipe(tmp_path / "lm", tmp_path, tmp_path / "run") | {"task": {"name": "sst2", "data_dir": "."}}
    recipe = FinetuneRecipe.model_validate(data)

    staged = staged_task(recipe, {"train": [{"sentence": "a fine film", "label": 1, "other": 2}]})
    assert (tmp_path / "run" / "data" / "train.tsv").read_text() == "sentence\tlabel\na fine film\t1\n"
    assert read_task_split(staged.task.spec(), staged.task.data_dir, "train").texts == [("a fine film",)]
    with pytest.raises(InputError, match=r"^train row 1: a tab or a line break in a value"):
        staged_task(recipe, {"train": [{"sentence": "a\tfilm", "label": 1}]})


def test_a_finished_run_is_refused_before_any_row_is_written(tmp_path):
    recipe = files_recipe(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".finetune-run").write_text("{}\n")
    (run_dir / "checkpoint").mkdir()
    with pytest.raises(UserError, match="already holds a finished run"):
        staged_task(recipe, {"train": [{"review": "a", "label": 1}]})
    assert not (run_dir / "data").exists()


def test_the_run_folder_keeps_the_rows_its_run_reads_and_overwrite_drops_stale_ones(tmp_path):
    from finetune import run_lock
    from finetune.run_dir import check_run_dir_free, prepare_run_dir

    staged = staged_task(files_recipe(tmp_path), {"train": [{"review": "a", "label": 1}]})
    check_run_dir_free(staged)  # a folder holding only the rows written for it is free for its run
    prepare_run_dir(staged)
    assert (tmp_path / "run" / "data" / "train.jsonl").is_file()  # the run's own rows stay
    run_lock.release(tmp_path / "run")

    rerun = files_recipe(tmp_path).model_copy(update={"overwrite": True})  # the same run_dir, rows from data_dir
    prepare_run_dir(rerun)
    assert not (tmp_path / "run" / "data").exists()  # rows of an earlier run are not left for this one
    run_lock.release(tmp_path / "run")
