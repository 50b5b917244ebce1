"""Any `datasets` dataset by name (finetune/data/hub.py): a folder saved with save_to_disk, local data files through
load_dataset's builders, and a one-line error for a dataset that cannot be loaded. Offline: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.data.hub import load_hub_dataset, split_rows
from finetune.errors import DataFileError, InputError

datasets = pytest.importorskip("datasets", reason="task.source hub reads datasets with the datasets library")


def saved_reviews(folder: Path) -> Path:
    """A DatasetDict (train, validation) with a ClassLabel label, saved with save_to_disk."""
    label = datasets.ClassLabel(names=["neg", "pos"])
    features = datasets.Features({"review": datasets.Value("string"), "label": label})
    splits = {
        "train": datasets.Dataset.from_dict({"review": ["bad", "good", "fine"], "label": [0, 1, 1]}, features=features),
        "validation": datasets.Dataset.from_dict({"review": ["awful"], "label": [0]}, features=features),
    }
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def test_a_folder_saved_with_save_to_disk_gives_its_rows_with_class_names(tmp_path):
    dataset = load_hub_dataset(str(saved_reviews(tmp_path / "reviews")))

    assert split_rows(dataset, "train", "reviews") == [
        {"review": "bad", "label": "neg"},
        {"review": "good", "label": "pos"},
        {"review": "fine", "label": "pos"},
    ]
    with pytest.raises(InputError, match=r"^dataset reviews has no split 'test' \(splits: train, validation\)$"):
        split_rows(dataset, "test", "reviews")


def test_local_csv_files_are_read_by_the_csv_builder(tmp_path):
    (tmp_path / "train.csv").write_text('text,label\n"a, quoted text",yes\nplain,no\n', encoding="utf-8")

    dataset = load_hub_dataset("csv", data_files={"train": str(tmp_path / "train.csv")})

    expected = [{"text": "a, quoted text", "label": "yes"}, {"text": "plain", "label": "no"}]
    assert split_rows(dataset, "train", "csv") == expected


def test_a_dataset_that_cannot_be_loaded_is_one_line(tmp_path, monkeypatch):
    def offline(*arguments, **keywords):
        raise ConnectionError("Couldn't reach 'someone/reviews' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataFileError) as raised:
        load_hub_dataset("someone/reviews", "default")
    assert str(raised.value) == (
        "cannot load dataset someone/reviews (default): Couldn't reach 'someone/reviews' on the Hub "
        "(LocalEntryNotFoundError)"
    )


def test_an_unknown_name_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataFileError) as raised:
        load_hub_dataset("no-such-user/no-such-dataset-x")
    message = str(raised.value)
    assert message.startswith("cannot load dataset no-such-user/no-such-dataset-x: ") and "\n" not in message


def test_a_single_split_saved_to_disk_is_refused_with_what_to_save(tmp_path):
    folder = tmp_path / "one"
    datasets.Dataset.from_dict({"text": ["a"]}).save_to_disk(str(folder))
    with pytest.raises(InputError, match="a single split saved with save_to_disk; save a DatasetDict"):
        load_hub_dataset(str(folder))
