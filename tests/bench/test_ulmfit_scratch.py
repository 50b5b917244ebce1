"""The from-scratch column of bench/ulmfit_imdb.py and bench/ulmfit_sst2.py: ULMFiT's stage-3 classifier from random
weights with its own recipe, which runs in the column, differs from ULMFiT's stage 3 in its training only, and is
what a run records (so a work dir of the old column is not continued with the new recipe)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from finetune.recipes import load_recipe
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import ulmfit_imdb  # bench/ scripts are top-level modules, imported as they import each other

ULMFIT = REPO_ROOT / "recipes" / "ulmfit"
# stage 3's recipe, the baseline's, and the baseline's LR as chosen on each task's held-out training rows
PAIRS = [
    ("imdb-3-classifier.yaml", "imdb-scratch-classifier.yaml", 1e-3),
    ("sst2-3-classifier.yaml", "sst2-scratch-classifier.yaml", 3e-3),
]


@pytest.mark.parametrize(("ulmfit", "scratch", "chosen_lr"), PAIRS)
def test_the_scratch_recipe_is_stage_3s_classifier_from_random_weights_with_its_own_lr(
    ulmfit, scratch, chosen_lr, monkeypatch
):
    monkeypatch.chdir(REPO_ROOT)  # recipes name paths from the project root
    stage3, baseline = (load_recipe(ULMFIT / name, check_paths=False) for name in (ulmfit, scratch))
    assert baseline.model.init == "random" and stage3.model.init == "pretrained"
    assert baseline.model.checkpoint == stage3.model.checkpoint  # the same language model's vocabulary and sizes
    assert baseline.task == stage3.task  # the same reviews or sentences, labels and lengths (BPT3C, whole reviews)
    assert baseline.unfreezing.mode == "none" and baseline.discriminative.factor == 1.0
    # below ULMFiT's LR of 1e-2, which on random weights never left ln 2 on IMDb (docs/benchmarks.md)
    assert baseline.training.lr == chosen_lr < stage3.training.lr
    for key in ("batch_size", "epochs", "adam_betas", "max_grad_norm"):
        assert getattr(baseline.training, key) == getattr(stage3.training, key), key
    assert baseline.schedule == stage3.schedule


def test_the_imdb_scratch_column_runs_its_own_recipe_and_records_it(tmp_path):
    args = type("Args", (), {"classifier_overrides": ["training.batch_size=16"]})()
    settings = ulmfit_imdb.column_settings(args, "scratch", 4, 3)
    assert settings == {
        "epochs": 4,
        "classifier_overrides": ["training.batch_size=16"],
        "recipe": "recipes/ulmfit/imdb-scratch-classifier.yaml",
    }
    assert "recipe" not in ulmfit_imdb.column_settings(args, "ulmfit", 4, 3)
    target = tmp_path / "2-target-lm" / "checkpoint"
    overrides = ulmfit_imdb.classifier_overrides("scratch", settings, {"target": target})
    # the recipe, not overrides of ULMFiT's, makes the column: only the data's, the budget's and the user's
    assert overrides == [
        f"model.checkpoint={target}",
        "task.files=null",
        "training.epochs=4",
        "keep_best=false",
        "eval_every=null",
        "training.batch_size=16",
    ]


def test_a_work_dir_of_the_old_scratch_column_is_not_continued(tmp_path):
    old = {"kind": "run", "side": "scratch", "labels": 1000, "test_rows": 2000}
    old["settings"] = {"epochs": 4, "classifier_overrides": []}  # what the old column recorded
    args = type("Args", (), {"classifier_overrides": []})()
    planned = {("scratch", 1000): ulmfit_imdb.column_settings(args, "scratch", 4, 3)}
    with pytest.raises(SystemExit, match="use another --work-dir"):
        ulmfit_imdb.check_resumable([old], planned, 2000, tmp_path / "runs.jsonl")


def test_the_scratch_recipes_exist_where_the_benchmarks_look():
    import ulmfit_sst2

    assert ulmfit_imdb.SCRATCH_CLASSIFIER == ULMFIT / "imdb-scratch-classifier.yaml"
    assert ulmfit_sst2.SCRATCH_CLASSIFIER == ULMFIT / "sst2-scratch-classifier.yaml"
    assert all(Path(path).is_file() for path in (ulmfit_imdb.SCRATCH_CLASSIFIER, ulmfit_sst2.SCRATCH_CLASSIFIER))
