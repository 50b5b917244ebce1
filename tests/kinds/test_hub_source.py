"""The task keys of `source: hub` for any dataset (finetune/kinds/recipe.py): `hub` names it, checked like every key."""

from __future__ import annotations

import pytest

from finetune.recipes import task_config

CUSTOM = {"name": "reviews", "text_columns": ["review"], "label_column": "label", "labels": ["neg", "pos"]}


def test_a_custom_task_from_a_named_dataset():
    task = task_config(**CUSTOM, source="hub", hub={"name": "imdb", "splits": {"train": "train", "dev": "test"}})
    assert task.hub is not None and task.hub.name == "imdb" and task.hub.config is None
    assert task.hub.splits == {"train": "train", "dev": "test"}
    assert task_config(**CUSTOM, source="hub", hub={"name": "imdb"}).hub.splits == {
        "train": "train",
        "dev": "validation",
        "test": "test",
    }


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"source": "hub"}, "'reviews' is a custom task: name its dataset in hub"),
        ({"hub": {"name": "imdb"}, "data_dir": "."}, "hub names the dataset of source hub: set source: hub"),
        ({"source": "hub", "hub": {"name": "imdb", "splits": {"validation": "test"}}}, "'validation' is not a task"),
        ({"source": "hub", "hub": {"name": ""}}, "at least 1 character"),
        ({"source": "hub", "hub": {"name": "imdb", "revision": "main"}}, "revision"),
    ],
)
def test_hub_mistakes_are_named(keys, message):
    with pytest.raises(ValueError, match=message):
        task_config(**CUSTOM | keys)


def test_a_glue_task_reads_its_own_hub_dataset():
    with pytest.raises(ValueError, match="'sst2' is a GLUE task with its own columns; remove hub"):
        task_config(name="sst2", source="hub", hub={"name": "imdb"})


def test_multilabel_reads_its_files_only():
    multilabel = {"name": "topics", "kind": "multilabel", "text_columns": ["text"], "label_column": "topics"}
    with pytest.raises(ValueError, match=r"kind multilabel reads the task's files: give data_dir \(not source hub"):
        task_config(**multilabel, data_dir=".", hub={"name": "imdb"})
