"""A 4-class task with f1_macro: trained, its best checkpoint picked by metric_for_best, its per-class scores in
result.json, the model card and `finetune eval`'s report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.commands.evaluate import run_eval
from finetune.recipes import load_recipe
from finetune.reporting.class_report import confusion_png_name
from finetune.reporting.compare import load_run, markdown_table
from finetune.run_dir import read_metrics
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.training.state import BestSoFar
from tests.conftest import eval_recipe, finetune_recipe, interrupted_at_step, write_task, write_yaml

LABELS = ["0", "1", "2", "3"]


def four_label_task(folder: Path) -> Path:
    """The generated task relabelled into four classes."""
    folder.mkdir(parents=True, exist_ok=True)
    source = write_task(folder.parent / "source")
    for split in ("train", "dev"):
        lines = (source / f"{split}.tsv").read_text().splitlines()
        relabelled = [lines[0]] + [f"{line.rsplit(chr(9), 1)[0]}\t{index % 4}" for index, line in enumerate(lines[1:])]
        (folder / f"{split}.tsv").write_text("\n".join(relabelled) + "\n")
    return folder


def four_class_recipe(pretrained: Path, tmp_path: Path) -> dict:
    data = finetune_recipe(pretrained, four_label_task(tmp_path / "four"), tmp_path / "run")
    data["task"].update({"labels": LABELS, "metrics": ["accuracy", "f1_macro"]})
    return data


def test_four_classes_train_with_f1_macro_picking_the_best_and_report_per_class(pretrained, tmp_path):
    data = four_class_recipe(pretrained, tmp_path)
    data.update({"eval_every": 1, "unfreezing": {"mode": "none"}, "metric_for_best": "f1_macro"})
    data["training"].update({"epochs": 2, "lr": 5e-3})
    checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))

    result = json.loads((tmp_path / "run" / RESULT_FILE).read_text())
    evaluations = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "eval"]
    assert result["main_metric"] == "f1_macro"
    best = max(evaluations, key=lambda record: record["dev_f1_macro"])  # the first of equal ones
    assert result["best_step"] == best["step"]
    assert result["best"]["dev_f1_macro"] == pytest.approx(best["dev_f1_macro"])
    classes = result["classes"]
    assert classes["labels"] == LABELS
    assert sum(row["support"] for row in classes["per_class"].values()) == 24  # the dev split
    assert sum(map(sum, classes["confusion_matrix"])) == 24
    mean_f1 = sum(row["f1"] for row in classes["per_class"].values()) / 4
    assert mean_f1 == pytest.approx(result["best"]["dev_f1_macro"])  # the saved checkpoint's evaluation
    assert "Per class (dev" in (checkpoint / "README.md").read_text()
    run = load_run(tmp_path / "run")  # finetune runs compare: a macro-F1 column, and the curve of metric_for_best
    assert run.main_metric == "dev_f1_macro" and "dev_f1_macro" in markdown_table([run]).splitlines()[0]

    run_dir = tmp_path / "eval"
    recipe = eval_recipe(tmp_path / "four", run_dir, {"tiny": str(checkpoint)})
    recipe["task"].update({"labels": LABELS, "metrics": ["accuracy", "f1_macro"]})
    report = run_eval(load_recipe(write_yaml(tmp_path / "eval.yaml", recipe)))
    scored = report["results"]["tiny"]
    assert set(scored["classes"]["per_class"]) == set(LABELS)
    assert scored["f1_macro"] == pytest.approx(sum(row["f1"] for row in scored["classes"]["per_class"].values()) / 4)
    png = run_dir / confusion_png_name("tiny")
    assert png.is_file()
    markdown = (run_dir / "report.md").read_text()
    assert f"]({confusion_png_name('tiny')})" in markdown and "| 3 |" in markdown


def test_metric_for_best_defaults_to_the_first_metric_computes_the_one_named_and_refuses_an_unknown_one(
    pretrained, tmp_path
):
    data = four_class_recipe(pretrained, tmp_path)
    assert load_recipe(write_yaml(tmp_path / "recipe.yaml", data)).selection_metric() == "accuracy"
    data["metric_for_best"] = "f1_macro"
    assert load_recipe(write_yaml(tmp_path / "recipe.yaml", data)).selection_metric() == "f1_macro"
    data["metric_for_best"] = "mcc"  # a metric the task does not list: computed as well, reported after its own
    recipe = load_recipe(write_yaml(tmp_path / "recipe.yaml", data))
    assert recipe.selection_metric() == "mcc" and recipe.task.spec().metrics == ("accuracy", "f1_macro", "mcc")
    del data["task"]["metrics"]  # the default accuracy, then the one named
    assert load_recipe(write_yaml(tmp_path / "recipe.yaml", data)).task.spec().metrics == ("accuracy", "mcc")
    data["metric_for_best"] = "f1"  # the positive class's F1 needs two labels: four cannot compute it
    refused = (
        r"metric_for_best: 'f1' is not a metric of the task; one of accuracy, mcc, f1_macro, f1_weighted, "
        "precision_macro, recall_macro"
    )
    with pytest.raises(Exception, match=refused):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))
    data.update(metric_for_best="pearson", task={"name": "sst2", "data_dir": data["task"]["data_dir"]})
    with pytest.raises(Exception, match=r"metric_for_best: 'pearson' is not a metric of the task; one of accuracy$"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))


def test_four_classes_refuse_the_positive_class_f1(pretrained, tmp_path):
    data = four_class_recipe(pretrained, tmp_path)
    data["task"]["metrics"] = ["f1"]
    with pytest.raises(Exception, match=r"needs 2 labels, not 4; f1_macro or f1_weighted"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))


def test_a_resumed_run_keeps_the_per_class_scores_of_a_best_before_the_stop(pretrained, tmp_path):
    data = four_class_recipe(pretrained, tmp_path)
    data.update({"eval_every": 1, "checkpoint_every": 2, "unfreezing": {"mode": "none"}})
    data["training"].update({"epochs": 2, "lr": 1e-9})  # no progress after step 1: the best is before the stop
    full = run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", data)))
    data["run_dir"] = str(tmp_path / "resumed")
    stopped = load_recipe(write_yaml(tmp_path / "resumed.yaml", data))
    with interrupted_at_step(4):
        run_finetune(stopped)
    resumed = run_finetune(stopped, resume=True)
    expected = json.loads((full.parent / RESULT_FILE).read_text())
    assert expected["best_step"] < 4
    assert json.loads((resumed.parent / RESULT_FILE).read_text())["classes"] == expected["classes"]
    assert not (resumed / "best_classes.json").exists()  # not left in the checkpoint


def test_metric_for_best_picks_the_evaluation_of_its_metric_where_accuracy_disagrees(pretrained, tmp_path):
    # Step 1 predicts the majority class everywhere (accuracy high, macro F1 low); step 2 finds every class.
    evaluations = [
        (1, {"dev_accuracy": 0.70, "dev_f1_macro": 0.21}),
        (2, {"dev_accuracy": 0.65, "dev_f1_macro": 0.58}),
        (3, {"dev_accuracy": 0.68, "dev_f1_macro": 0.40}),
    ]
    data = four_class_recipe(pretrained, tmp_path)
    for metric_for_best, best_step in ((None, 1), ("f1_macro", 2)):
        data["metric_for_best"] = metric_for_best
        recipe = load_recipe(write_yaml(tmp_path / "recipe.yaml", data))
        best = BestSoFar(f"dev_{recipe.selection_metric()}", patience=None)  # as the stage builds it
        for step, scores in evaluations:
            best.update(scores, step)
        assert best.step == best_step
