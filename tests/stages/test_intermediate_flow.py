"""`finetune intermediate`: task A, then task B from A's encoder under a new head, and B alone to compare (STILTs),
through the real CLI on a tiny BERT and two generated tasks whose labels are the same (so that only model.new_head
keeps A's head from carrying over)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.recipes import IntermediateRecipe, load_recipe
from finetune.recipes.loader import recipe_to_yaml
from finetune.run_dir import MARKER_FILE
from tests.conftest import custom_task_section, save_tiny_masked_lm, write_task, write_yaml

runner = CliRunner()
STAGES = ("1-intermediate", "2-target", "3-target-alone")
HEAD = "classifier.weight"  # BERT's sequence classifier: the head's output layer


def stage(task: Path, name: str, epochs: int = 1) -> dict[str, Any]:
    """A finetune section (without stage and run_dir): the generated task under `name`, a few steps."""
    return {
        "task": {**custom_task_section(task), "name": name},
        "training": {"epochs": epochs, "batch_size": 8, "lr": 2e-3, "log_every": 1, "device": "cpu"},
        "keep_best": False,
    }


def intermediate_recipe(checkpoint: Path, task_a: Path, task_b: Path, run_dir: Path) -> dict[str, Any]:
    """A tiny, valid intermediate recipe: task A (2 epochs) from `checkpoint`, then task B (1 epoch)."""
    first = stage(task_a, "task-a", epochs=2)
    return {
        "stage": "intermediate",
        "description": "tiny test flow",
        "run_dir": str(run_dir),
        "seed": 0,
        "intermediate": {**first, "model": {"checkpoint": str(checkpoint)}},
        "target": stage(task_b, "task-b"),
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("intermediate")
    return {
        "checkpoint": save_tiny_masked_lm(folder / "base"),
        "task_a": write_task(folder / "task-a"),
        "task_b": write_task(folder / "task-b", train_rows=24, dev_rows=16),
        "folder": folder,
    }


def run_flow(recipe: dict[str, Any], folder: Path, *arguments: str):
    return runner.invoke(app, ["intermediate", str(write_yaml(folder / "flow.yaml", recipe)), *arguments])


@pytest.fixture(scope="module")
def finished(inputs) -> Path:
    """The flow run once for the module; tests that change it work on a copy."""
    run_dir = inputs["folder"] / "run"
    # run_dir relative to the folder the flow runs in, as a user writes it: a copy elsewhere resumes as its own
    recipe = intermediate_recipe(inputs["checkpoint"], inputs["task_a"], inputs["task_b"], Path("run"))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(inputs["folder"])
        result = run_flow(recipe, inputs["folder"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # as one line: the console wraps it at its width
    assert "intermediate stage 3 of 3" in output and "over the target alone" in output
    (run_dir.parent / "flow-output.txt").write_text(output, encoding="utf-8")
    return run_dir


def test_the_three_stages_run_and_the_summary_compares_the_target_with_and_without(finished, inputs):
    assert all((finished / folder / "checkpoint" / "model.safetensors").is_file() for folder in STAGES)
    summary = json.loads((finished / "result.json").read_text())
    assert [summary[section]["task"] for section in ("intermediate", "target", "target_alone")] == [
        "task-a",
        "task-b",
        "task-b",
    ]
    gain = summary["gain"]
    assert gain["metric"] == summary["target"]["main_metric"] == "accuracy"
    assert gain["with_intermediate"] == summary["target"]["dev"]["dev_accuracy"]
    assert gain["without"] == summary["target_alone"]["dev"]["dev_accuracy"]
    assert gain["difference"] == pytest.approx(gain["with_intermediate"] - gain["without"])
    report = (finished / "report.md").read_text()
    assert report.startswith("# Intermediate-task training: task-a before task-b")
    rows = [line for line in report.splitlines() if line.startswith("| target")]
    assert len(rows) == 2 and f"{gain['without']:.4f}" in rows[1]
    assert f"{gain['difference']:+.4f} accuracy" in report


def test_the_target_starts_from_the_intermediate_encoder_and_the_comparison_from_the_base(finished, inputs):
    saved = {folder: yaml.safe_load((finished / folder / "recipe.yaml").read_text()) for folder in STAGES[1:]}
    assert saved["2-target"]["model"]["checkpoint"] == str(Path("run") / "1-intermediate" / "checkpoint")
    assert saved["3-target-alone"]["model"]["checkpoint"] == str(inputs["checkpoint"])
    assert saved["2-target"]["model"]["new_head"] is True and saved["3-target-alone"]["model"]["new_head"] is True
    assert {recipe["task"]["name"] for recipe in saved.values()} == {"task-b"}


def test_new_head_replaces_a_head_whose_labels_are_the_tasks(finished):
    """Task B's labels are task A's, so the checkpoint's head would load as it is: model.new_head renews it, and
    only it (the flow's target stage said so as it started)."""
    from finetune.models.heads import load_classifier
    from finetune.models.task_heads import renew_head
    from finetune.recipes import FinetuneRecipe
    from finetune.tasks.specs import task_spec

    trained = load_file(finished / "1-intermediate" / "checkpoint" / "model.safetensors")
    saved = yaml.safe_load((finished / "2-target" / "recipe.yaml").read_text())
    saved["model"]["checkpoint"] = str(finished / "1-intermediate" / "checkpoint")  # saved relative to the flow's
    recipe = FinetuneRecipe.model_validate(saved)
    model = load_classifier(recipe.model, task_spec(recipe.task), recipe.classifier_dropout, recipe.pooling)
    assert torch.equal(model.state_dict()[HEAD], trained[HEAD]), "the same labels: the checkpoint's head loads"
    renewed = renew_head(model)
    weights = model.state_dict()
    assert renewed == weights[HEAD].numel() + weights["classifier.bias"].numel()
    assert not torch.equal(weights[HEAD], trained[HEAD]), "new_head left the intermediate task's head"
    backbone = [name for name in trained if name.startswith("bert.")]  # the encoder and its pooler
    assert backbone and all(torch.equal(weights[name], trained[name]) for name in backbone)
    assert "model.new_head: the head's 66 parameters start anew" in (finished.parent / "flow-output.txt").read_text()


def test_the_target_checkpoint_loads_in_transformers(finished):
    model = AutoModelForSequenceClassification.from_pretrained(finished / "2-target" / "checkpoint")
    assert model.config.num_labels == 2 and model.config.id2label == {0: "0", 1: "1"}


def test_resume_runs_again_only_what_starts_from_a_stage_that_runs(finished, tmp_path, inputs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    kept = ("1-intermediate", "3-target-alone")
    untouched = {folder: (copy / folder / "checkpoint" / "model.safetensors").stat().st_mtime_ns for folder in kept}
    (copy / "result.json").unlink()
    shutil.rmtree(copy / "2-target")
    recipe = intermediate_recipe(inputs["checkpoint"], inputs["task_a"], inputs["task_b"], Path("run"))
    result = run_flow(recipe, tmp_path, "--resume")
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()).count("finished before, kept") == 2, result.output
    assert (copy / "2-target" / "checkpoint" / "model.safetensors").is_file() and (copy / "result.json").is_file()
    for folder in kept:
        assert (copy / folder / "checkpoint" / "model.safetensors").stat().st_mtime_ns == untouched[folder]

    # Stage 1 asked to change: a finished stage is kept only unchanged, and nothing is touched.
    result = run_flow({**recipe, "intermediate": {**recipe["intermediate"], "seed": 5}}, tmp_path, "--resume")
    assert result.exit_code == 2 and "intermediate.seed changed" in " ".join(result.output.split()), result.output


def test_target_seeds_and_no_comparison(inputs, tmp_path):
    recipe = intermediate_recipe(inputs["checkpoint"], inputs["task_a"], inputs["task_b"], tmp_path / "run")
    recipe["intermediate"]["training"]["epochs"] = 1
    recipe["target"]["seeds"] = [0, 1]
    recipe["compare"] = False
    result = run_flow(recipe, tmp_path)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "(mean of the seeds)" in output and "stage 2 of 2" in output and "stage 3" not in output
    assert not (tmp_path / "run" / "3-target-alone").exists()
    summary = json.loads((tmp_path / "run" / "result.json").read_text())
    assert "target_alone" not in summary and "gain" not in summary
    values = summary["target"]["spread"]["dev_accuracy"]["values"]
    assert len(values) == 2 and summary["target"]["dev"]["dev_accuracy"] == pytest.approx(sum(values) / 2)
    assert all((tmp_path / "run" / "2-target" / f"seed-{seed}" / "checkpoint").is_dir() for seed in (0, 1))
    assert ", ".join(f"{value:.4f}" for value in values) in (tmp_path / "run" / "report.md").read_text()


def test_the_python_api_and_the_saved_recipe(inputs, tmp_path):
    recipe = intermediate_recipe(inputs["checkpoint"], inputs["task_a"], inputs["task_b"], tmp_path / "run")
    recipe["intermediate"]["training"]["epochs"] = 1
    result = finetune.intermediate(recipe, {"compare": False})
    assert result.run_dir == tmp_path / "run" and result.checkpoint == tmp_path / "run" / "2-target" / "checkpoint"
    assert result.report["target"]["task"] == "task-b" and (tmp_path / "run" / MARKER_FILE).is_file()
    loaded = load_recipe(tmp_path / "run" / "recipe.yaml")
    assert isinstance(loaded, IntermediateRecipe)
    again = tmp_path / "again.yaml"
    again.write_text(recipe_to_yaml(loaded), encoding="utf-8")
    assert load_recipe(again).model_dump() == loaded.model_dump()


def test_recipes_keys_lists_the_flow_and_its_sections():
    result = runner.invoke(app, ["recipes", "--keys", "intermediate"])
    assert result.exit_code == 0, result.output
    for key in ("compare", "intermediate.*", "target.*"):
        assert key in result.output


def test_the_summary_says_when_the_target_and_the_comparison_trained_differently(tmp_path):
    """method auto decides on each starting checkpoint, and stage 1's may be a sentence-embedding model where the
    base is not: a comparison of two methods is said to be one, in the summary, the report and the console."""
    from finetune.stages.intermediate import summarise, summary_line

    task = custom_task_section(tmp_path)
    sections = {
        "intermediate": {"model": {"checkpoint": "base"}, "task": {**task, "name": "task-a"}},
        "target": {"task": {**task, "name": "task-b"}},
    }
    recipe = IntermediateRecipe.model_validate({"stage": "intermediate", "run_dir": str(tmp_path / "run"), **sections})
    for folder, method, score in (("1-intermediate", "plain", 0.6), ("2-target", "contrastive", 0.8),
                                  ("3-target-alone", "plain", 0.7)):  # fmt: skip
        run_dir = tmp_path / "run" / folder
        write_yaml(run_dir / "checkpoint" / "finetune_recipe.yaml", {"method": method})
        (run_dir / "result.json").write_text(json.dumps({"saved": "last", "last": {"dev_accuracy": score}}))
    summary = summarise(recipe)
    assert summary["gain"]["difference"] == pytest.approx(0.1)
    assert summary["warning"].startswith("the target trained with method contrastive, the target alone with plain")
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| target | task-b | stage 1's encoder, a new head | contrastive | 0.8000 |" in report
    assert "Note: the target trained with method contrastive" in report
    assert "set target.method to compare like with like" in summary_line(summary, tmp_path / "run")
