"""Uneven classes and tasks without a dev file through the CLI: training.class_weights, label_smoothing and
pos_weight's refusals, task.dev_split's held-out rows (the run folder, the checkpoint, eval and --resume)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from finetune.cli import app
from finetune.kinds.dev_split import DEV_SPLIT_FILE
from finetune.recipes import load_recipe
from finetune.run_dir import METRICS_FILE, read_metrics
from finetune.stages.finetune import run_finetune
from tests.conftest import eval_recipe, finetune_recipe, make_sentence, one_error_line, write_yaml
from tests.training.test_resume_finetune import Stopped, assert_same_run, stop_after_checkpoint

runner = CliRunner()


def write_imbalanced_task(folder: Path, train_rows: int = 40, positives: int = 4, dev: bool = True) -> Path:
    """train.tsv with `positives` positive rows (every 10th) of `train_rows`, and a balanced dev.tsv (or none)."""
    rng = random.Random(5)
    folder.mkdir(parents=True, exist_ok=True)
    step = train_rows // positives
    splits = {"train": [index % step == 0 for index in range(train_rows)]}
    if dev:
        splits["dev"] = [index % 2 == 0 for index in range(12)]
    for split, labels in splits.items():
        rows = ["sentence\tlabel"] + [f"{make_sentence(rng, positive)}\t{int(positive)}" for positive in labels]
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def recipe_data(checkpoint: Path, task: Path, run_dir: Path, **training) -> dict:
    data = finetune_recipe(checkpoint, task, run_dir)
    data["training"].update({"epochs": 1, **training})
    return data


def first_loss(run_dir: Path) -> float:
    return next(record["loss"] for record in read_metrics(run_dir / METRICS_FILE) if "loss" in record)


def test_balanced_class_weights_and_label_smoothing_train_and_are_said(tmp_path, pretrained):
    task = write_imbalanced_task(tmp_path / "task")
    plain = write_yaml(tmp_path / "plain.yaml", recipe_data(pretrained, task, tmp_path / "plain"))
    assert runner.invoke(app, ["finetune", str(plain)]).exit_code == 0
    weighted = recipe_data(pretrained, task, tmp_path / "weighted", class_weights="balanced", label_smoothing=0.1)
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "weighted.yaml", weighted))])
    assert result.exit_code == 0, result.output
    assert "class weights: balanced" in result.output and "label smoothing 0.1" in result.output
    # 36 negatives and 4 positives: 40 / (2 x 36) and 40 / (2 x 4), scikit-learn's balanced weights
    assert "class weights in the cross-entropy: 0 0.556, 1 5" in result.output
    assert first_loss(tmp_path / "weighted") != pytest.approx(first_loss(tmp_path / "plain"), abs=1e-4)
    # The saved recipe keeps the keys and loads again (what --resume and eval read).
    saved = tmp_path / "weighted" / "checkpoint" / "finetune_recipe.yaml"
    again = load_recipe(saved)
    assert again.training.class_weights == "balanced" and again.training.label_smoothing == 0.1


def test_named_class_weights_are_read_by_label(tmp_path, pretrained):
    task = write_imbalanced_task(tmp_path / "task")
    data = recipe_data(pretrained, task, tmp_path / "run", class_weights={1: 3.0})
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))])
    assert result.exit_code == 0, result.output
    assert "class weights in the cross-entropy: 0 1, 1 3" in result.output


REGRESSION = {"labels": None, "metrics": None}  # a custom task without labels: kind regression


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"training": {"class_weights": {"positive": 2}}},
            "training.class_weights: unknown label 'positive' (labels: 0, 1)",
        ),
        (
            {"training": {"pos_weight": "balanced"}},
            "training.pos_weight: not for task kind classification (a key of kind multilabel)",
        ),
        ({"task": {"dev_split": 1.5}}, "task.dev_split: a share of the training rows, above 0 and below 1 (got 1.5)"),
        (
            {"task": REGRESSION, "training": {"class_weights": "balanced"}},
            "training.class_weights: not for task kind regression (a key of kind classification)",
        ),
        (
            {"task": REGRESSION, "training": {"label_smoothing": 0.1}},
            "training.label_smoothing: not for task kind regression (a key of kind classification, choices)",
        ),
    ],
)
def test_bad_loss_keys_and_dev_split_are_one_line_errors(tmp_path, change, expected):
    task = write_imbalanced_task(tmp_path / "task")
    data = recipe_data(tmp_path / "lm", task, tmp_path / "run")
    for section, keys in change.items():
        data[section].update(keys)
    line = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert expected in line


def test_dev_split_with_a_dev_file_asks_to_choose(tmp_path, pretrained):
    task = write_imbalanced_task(tmp_path / "task")
    data = recipe_data(pretrained, task, tmp_path / "run")
    data["task"]["dev_split"] = 0.2
    line = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert f"task.dev_split: the task has a dev file, {task / 'dev.tsv'}; remove dev_split or the dev file" in line


def test_dev_split_holds_out_stratified_rows_that_eval_scores_again(tmp_path, pretrained):
    task = write_imbalanced_task(tmp_path / "task", dev=False)
    data = recipe_data(pretrained, task, tmp_path / "run")
    data["task"]["dev_split"] = 0.25
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))])
    assert result.exit_code == 0, result.output
    assert "30 training and 10 dev examples" in result.output
    record = json.loads((tmp_path / "run" / DEV_SPLIT_FILE).read_text())
    assert len(record["dev"]) == 10 and sorted(record["train"] + record["dev"]) == list(range(40))
    assert sum(index % 10 == 0 for index in record["dev"]) == 1  # 10% positives, as in train
    assert (tmp_path / "run" / "checkpoint" / DEV_SPLIT_FILE).read_text() == json.dumps(record) + "\n"
    # eval of the run scores the same held-out rows
    evaluation = eval_recipe(task, tmp_path / "eval", {"run": str(tmp_path / "run" / "checkpoint")})
    evaluation["task"]["dev_split"] = 0.25
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", evaluation))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["examples"] == 10
    trained = json.loads((tmp_path / "run" / "result.json").read_text())["last"]["dev_accuracy"]
    assert report["results"]["run"]["accuracy"] == pytest.approx(trained)


def test_a_resumed_run_holds_out_the_same_rows(tmp_path, pretrained, monkeypatch):
    task = write_imbalanced_task(tmp_path / "task", dev=False)

    def recipe(name: str) -> Path:
        data = recipe_data(pretrained, task, tmp_path / name)
        data["training"]["epochs"] = 2
        data["task"]["dev_split"] = 0.25
        data.update({"eval_every": 2, "checkpoint_every": 2})
        return write_yaml(tmp_path / f"{name}.yaml", data)

    assert runner.invoke(app, ["finetune", str(recipe("full"))]).exit_code == 0
    stop_after_checkpoint(monkeypatch, 4)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(recipe("resumed")))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")
    files = [(tmp_path / name / DEV_SPLIT_FILE).read_text() for name in ("full", "resumed")]
    assert files[0] == files[1]
    saved = yaml.safe_load((tmp_path / "resumed" / "checkpoint" / "finetune_recipe.yaml").read_text())
    assert saved["task"]["dev_split"] == 0.25


def test_pos_weight_trains_a_multilabel_classifier_and_names_its_labels(tmp_path, pretrained):
    from tests.kinds.test_multilabel import multilabel_recipe, write_marker_task

    task = write_marker_task(tmp_path / "task", counts=(("train", 16), ("dev", 8)))
    data = multilabel_recipe(pretrained, task, tmp_path / "run")
    data["training"].update({"epochs": 1, "pos_weight": {"MUSIC": 2.5}})
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))])
    assert result.exit_code == 0, result.output
    assert "positive weights: MUSIC 2.5" in result.output
    assert "binary cross-entropy: GREAT 1, AWFUL 1, MUSIC 2.5" in result.output
    data["training"]["pos_weight"] = {"JAZZ": 2}
    line = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert "training.pos_weight: unknown label 'JAZZ' (labels: GREAT, AWFUL, MUSIC)" in line
    data["training"]["pos_weight"], data["training"]["class_weights"] = None, "balanced"
    line = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert "training.class_weights: not for task kind multilabel (a key of kind classification)" in line


def test_label_smoothing_over_each_questions_own_choices():
    import torch

    from finetune.kinds.choices.training import smoothed_choice_loss

    torch.manual_seed(0)
    logits, labels = torch.randn(3, 4), torch.tensor([0, 3, 1])
    every_choice = torch.ones(3, 4, dtype=torch.bool)
    expected = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.2)
    torch.testing.assert_close(smoothed_choice_loss(logits, labels, every_choice, 0.2), expected)
    # A question of 3 choices (a padding choice at -inf) is smoothed over its 3, as torch's over 3 classes.
    mask = every_choice.clone()
    mask[:, 3] = False
    labels = torch.tensor([0, 2, 1])
    padded = logits.masked_fill(~mask, float("-inf"))
    expected = torch.nn.functional.cross_entropy(logits[:, :3], labels, label_smoothing=0.2)
    torch.testing.assert_close(smoothed_choice_loss(padded, labels, mask, 0.2), expected)


def test_a_choices_task_without_dev_file_trains_with_label_smoothing_and_dev_split(tmp_path, pretrained):
    from tests.kinds.test_multiple_choice import choices_recipe, write_questions

    write_questions(tmp_path / "task" / "train.jsonl", 20, 1)
    data = choices_recipe(pretrained, tmp_path / "task", tmp_path / "run", dev_split=0.2)
    data["training"].update({"epochs": 1, "label_smoothing": 0.1})
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))])
    assert result.exit_code == 0, result.output
    assert "16 training and 4 dev examples" in result.output and "label smoothing 0.1" in result.output
    assert len(json.loads((tmp_path / "run" / DEV_SPLIT_FILE).read_text())["dev"]) == 4


def test_documents_read_in_chunks_train_on_the_weighted_loss(tmp_path, pretrained):
    """long_documents chunks: the loss of each document's pooled logits is the weighted one too."""
    task = write_imbalanced_task(tmp_path / "task", positives=20)  # every batch holds positives, whatever its order
    losses = {}
    for name, training in (("plain", {}), ("weighted", {"class_weights": {"1": 9.0}})):
        data = recipe_data(pretrained, task, tmp_path / name, **training)
        data["task"].update({"max_length": 6, "long_documents": {"mode": "chunks", "overlap": 2}})
        result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / f"{name}.yaml", data))])
        assert result.exit_code == 0, result.output
        losses[name] = first_loss(tmp_path / name)
    assert losses["weighted"] != pytest.approx(losses["plain"], abs=1e-4)
