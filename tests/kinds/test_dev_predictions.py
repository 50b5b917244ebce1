"""RUN_DIR/dev_predictions.jsonl: the saved checkpoint's prediction of every dev row, with keep_best (the best
evaluation's, not the last weights') and without, through a resume too."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from finetune.kinds.classification.fine_tuning import ClassificationFineTuning
from finetune.recipes import load_recipe
from finetune.stages.finetune import RESULT_FILE, run_finetune
from tests.conftest import finetune_recipe, interrupted_at_step, write_yaml


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "dev_predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def accuracy_of(rows: list[dict]) -> float:
    return sum(row["label"] == row["predicted"] for row in rows) / len(rows)


def recipe(checkpoint: Path, task: Path, run_dir: Path, **keys) -> dict:
    """3 epochs of 5 steps, an evaluation every 2 steps: the best evaluation is seldom the last one."""
    data = finetune_recipe(checkpoint, task, run_dir)
    data.update({"eval_every": 2, "unfreezing": {"mode": "none"}, **keys})
    data["training"].update({"epochs": 3, "lr": 5e-3})
    return data


def test_keep_best_writes_the_best_evaluations_predictions(pretrained, task_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", recipe(pretrained, task_dir, run_dir))))
    result, rows = json.loads((run_dir / RESULT_FILE).read_text()), rows_of(run_dir)
    assert accuracy_of(rows) == pytest.approx(result["best"]["dev_accuracy"])
    dev_lines = (task_dir / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert [row["row"] for row in rows] == list(range(24))
    assert [row["key"] for row in rows] == [
        hashlib.sha1(line.rsplit("\t", 1)[0].encode()).hexdigest()[:12] for line in dev_lines
    ]  # the text columns' SHA-1: what pairs the rows of two runs
    assert [row["label"] for row in rows] == [line.rsplit("\t", 1)[1] for line in dev_lines]
    for row in rows:
        # Each probability is written rounded to 6 decimals: their sum is 1 within half a millionth per class (and
        # float noise), which pytest.approx's 1e-6 missed by 1e-16 on one run.
        rounding = 0.5e-6 * len(row["probabilities"]) + 1e-12
        assert list(row["probabilities"]) == ["0", "1"]
        assert sum(row["probabilities"].values()) == pytest.approx(1, abs=rounding)
        assert row["predicted"] == max(row["probabilities"], key=row["probabilities"].get)
    assert not (run_dir / "checkpoint" / "dev_predictions.jsonl").exists()  # the checkpoint stays a model folder


def test_without_keep_best_the_last_evaluations_predictions_even_after_a_resume(
    pretrained, task_dir, tmp_path, monkeypatch
):
    """The run stopped right after its last step's checkpoint, which came after its last evaluation: the resumed
    run has no evaluation left to make, and predicts the dev rows again with the (last) weights it saves."""

    def last_weights(name: str) -> Path:
        data = recipe(pretrained, task_dir, tmp_path / name, keep_best=False, eval_every=5, checkpoint_every=5)
        data["training"]["epochs"] = 1
        return write_yaml(tmp_path / f"{name}.yaml", data)

    run_finetune(load_recipe(last_weights("full")))
    result = json.loads((tmp_path / "full" / RESULT_FILE).read_text())
    assert accuracy_of(rows_of(tmp_path / "full")) == pytest.approx(result["last"]["dev_accuracy"])
    with interrupted_at_step(5):
        run_finetune(load_recipe(last_weights("resumed")))
    assert not (tmp_path / "resumed" / "dev_predictions.jsonl").exists()
    evaluations = []
    evaluate = ClassificationFineTuning.evaluate
    monkeypatch.setattr(ClassificationFineTuning, "evaluate", lambda self: evaluations.append(1) or evaluate(self))
    run_finetune(load_recipe(last_weights("resumed")), resume=True)
    assert evaluations == [1]  # no evaluation left to train through: the one that made the predictions
    assert rows_of(tmp_path / "resumed") == rows_of(tmp_path / "full")
