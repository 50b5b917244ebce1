"""`task.source: hub` for a custom task through the CLI: the dataset's rows written to RUN_DIR/data when the run
starts, read from there by the run, by its --resume (without the dataset) and by `finetune eval` of the run."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from finetune.cli import app
from tests.conftest import finetune_recipe, interrupted_at_step, make_sentence, save_tiny_masked_lm, write_yaml

datasets = pytest.importorskip("datasets", reason="task.source hub reads datasets with the datasets library")


class Stopped(Exception):
    """The run killed after its periodic checkpoint (interrupted_at_step)."""


def save_reviews(folder: Path) -> Path:
    """A DatasetDict (train 32, validation 12 rows; labels neg/pos as a ClassLabel) saved with save_to_disk."""
    rng = random.Random(5)
    label = datasets.ClassLabel(names=["neg", "pos"])
    features = datasets.Features({"review": datasets.Value("string"), "label": label})

    def split(count: int) -> datasets.Dataset:
        labels = [index % 2 for index in range(count)]
        reviews = [make_sentence(rng, label == 1) for label in labels]
        return datasets.Dataset.from_dict({"review": reviews, "label": labels}, features=features)

    datasets.DatasetDict({"train": split(32), "validation": split(12)}).save_to_disk(str(folder))
    return folder


def test_a_saved_dataset_trains_resumes_without_it_and_evaluates(tmp_path):
    checkpoint = save_tiny_masked_lm(tmp_path / "lm", layers=1, hidden=16)
    saved = save_reviews(tmp_path / "reviews")
    run_dir = tmp_path / "run"
    recipe = finetune_recipe(checkpoint, tmp_path, run_dir) | {"checkpoint_every": 2}
    recipe["training"]["epochs"] = 1
    recipe["task"] = {
        "name": "reviews",
        "source": "hub",
        "hub": {"name": str(saved), "splits": {"train": "train", "dev": "validation"}},
        "text_columns": ["review"],
        "label_column": "label",
        "labels": ["neg", "pos"],  # the dataset's class names: its class ids are written as these
        "metrics": ["accuracy", "f1"],
        "max_length": 16,
    }
    recipe_file = write_yaml(tmp_path / "recipe.yaml", recipe)
    with interrupted_at_step(2, Stopped):
        CliRunner().invoke(app, ["finetune", str(recipe_file)], catch_exceptions=False)
    assert (run_dir / "data" / "train.jsonl").is_file() and not (run_dir / "checkpoint").exists()

    shutil.rmtree(saved)  # --resume reads the rows written when the run started
    resumed = CliRunner().invoke(app, ["finetune", str(recipe_file), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    saved_recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert saved_recipe["task"]["source"] == "files" and saved_recipe["task"]["data_dir"] == str(run_dir / "data")

    evaluation = {"stage": "eval", "run_dir": str(tmp_path / "eval"), "task": saved_recipe["task"], "device": "cpu"}
    evaluation["models"] = {"run": str(run_dir / "checkpoint")}
    scored = CliRunner().invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", evaluation))])
    assert scored.exit_code == 0, scored.output
    report = yaml.safe_load((tmp_path / "eval" / "report.json").read_text())
    assert report["examples"] == 12 and set(report["results"]["run"]) >= {"accuracy", "f1"}


def test_a_dataset_that_cannot_be_loaded_is_one_line_and_leaves_no_run(tmp_path):
    recipe = finetune_recipe(tmp_path / "lm", tmp_path, tmp_path / "run")
    recipe["task"] = {
        "name": "reviews",
        "source": "hub",
        "hub": {"name": str(tmp_path / "not-there")},
        "text_columns": ["review"],
        "label_column": "label",
    }
    save_tiny_masked_lm(tmp_path / "lm", layers=1, hidden=16)
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", recipe))])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: cannot load dataset {tmp_path / 'not-there'}: ")
    assert not (tmp_path / "run").exists()
