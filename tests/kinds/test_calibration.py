"""Recipe key `calibration` end to end through the CLI (finetune/kinds/calibration.py): the temperature fitted on the
saved weights' dev logits, result.json's record, the reliability diagram, the checkpoint's config.json, `finetune
predict` dividing by it; calibration none measuring only; kinds that cannot take it refusing it; --resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.data.task_files import read_labelled_split
from finetune.inference.calibration import BINS, fit_temperature
from finetune.kinds.calibration import BEST_LOGITS_FILE
from finetune.models.heads import TEMPERATURE_KEY
from finetune.recipes import load_recipe
from finetune.reporting.plots import PLOTS_DIR, RELIABILITY_PLOT
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.tasks.specs import task_spec
from tests.conftest import drawing_plots, eval_recipe, finetune_recipe, one_error_line, write_task, write_yaml
from tests.reporting.test_plots import EXPECTED_SIZE, png_size
from tests.training.test_resume_finetune import Stopped, assert_same_run, resumable_recipe, stop_after_checkpoint

runner = CliRunner()
MEASURES = {"ece_before", "ece_after", "brier_before", "brier_after", "nll_before", "nll_after"}


def calibrated_recipe(checkpoint: Path, task: Path, run_dir: Path, calibration: str = "temperature") -> dict:
    """The tiny recipe for 2 epochs, evaluated every 2 steps (keep_best picks among 6 evaluations)."""
    data = finetune_recipe(checkpoint, task, run_dir)
    data.update(calibration=calibration, eval_every=2)
    return data


def dev_rows(checkpoint: Path) -> tuple[list[str], np.ndarray]:
    """The dev texts and class indices of the task a checkpoint was fine-tuned on."""
    task = load_recipe(checkpoint / "finetune_recipe.yaml", check_paths=False).task
    examples = read_labelled_split(task_spec(task), task.data_dir, "dev")
    return [texts[0] for texts in examples.texts], np.asarray(examples.labels)


def transformers_logits(checkpoint: Path, texts: list[str]) -> np.ndarray:
    """The checkpoint's logits through transformers alone, one text at a time (no padding), as a user loads it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        rows = [
            model(**tokenizer(text, truncation=True, max_length=16, return_tensors="pt")).logits[0] for text in texts
        ]
    return torch.stack(rows).double().numpy()


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, pretrained) -> dict:
    """A run with calibration: temperature through the CLI: its folder and output."""
    root = tmp_path_factory.mktemp("calibrated")
    data = calibrated_recipe(pretrained, write_task(root / "task"), root / "run")
    # Enough to learn the task (a temperature inside its range), with later evaluations than the best one: the fit
    # must read the best weights' logits, not the last ones' that the run ends with in memory.
    data.update(pooling="mean", unfreezing={"mode": "none"}, discriminative={"factor": 1.0})
    data["training"].update(epochs=4, lr=1e-2)
    recipe = write_yaml(root / "r.yaml", data)
    with drawing_plots():  # the tests look at its reliability diagram
        result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    return {"run": root / "run", "output": result.output}


def test_temperature_is_fitted_on_the_saved_weights_and_predict_divides_by_it(calibrated):
    run, checkpoint = calibrated["run"], calibrated["run"] / "checkpoint"
    calibration = json.loads((run / RESULT_FILE).read_text())["calibration"]
    temperature = calibration["temperature"]
    assert calibration["method"] == "temperature" and temperature > 0
    assert calibration["bins"] == BINS and calibration["rows"] == 24 and set(calibration["dev"]) == MEASURES
    assert calibration["dev"]["nll_after"] <= calibration["dev"]["nll_before"] + 1e-12  # T = 1 was a candidate
    assert calibration["dev"]["brier_after"] >= 0 and 0 <= calibration["dev"]["ece_after"] <= 1
    assert f"calibration: temperature {temperature:.4f} fitted on dev (24 rows): ECE" in calibrated["output"]
    # The checkpoint keeps T in config.json (what transformers carries), and none of the run's working files.
    assert json.loads((checkpoint / "config.json").read_text())[TEMPERATURE_KEY] == temperature
    assert not (checkpoint / BEST_LOGITS_FILE).exists()
    assert "## Calibration" in (checkpoint / "README.md").read_text()
    assert png_size(run / PLOTS_DIR / f"{RELIABILITY_PLOT}.png") == EXPECTED_SIZE
    # T is the fit of the saved weights' own dev logits (with keep_best, not the last weights').
    texts, labels = dev_rows(checkpoint)
    logits = transformers_logits(checkpoint, texts)
    assert fit_temperature(logits, labels) == pytest.approx(temperature, rel=1e-3)
    # predict (CLI and Python) gives softmax(logits / T) of transformers' own model, and the logits' labels.
    expected = torch.softmax(torch.from_numpy(logits) / temperature, dim=-1).numpy()
    predicted = finetune.predict(str(checkpoint), texts)
    got = np.array([[row["probabilities"]["0"], row["probabilities"]["1"]] for row in predicted])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [row["label"] for row in predicted] == [str(index) for index in logits.argmax(axis=1)]
    cli = runner.invoke(app, ["predict", str(checkpoint)], input="\n".join(texts[:3]) + "\n")
    assert cli.exit_code == 0, cli.output
    rows = [json.loads(line) for line in cli.stdout.splitlines() if line.startswith("{")]
    assert [row["probabilities"] for row in rows] == [
        row["probabilities"] for row in finetune.predict(str(checkpoint), texts[:3])
    ]


def test_an_ensemble_averages_its_members_calibrated_probabilities(calibrated, tmp_path, monkeypatch):
    """eval divides each member's logits by its own temperature before the ensemble's mean of probabilities."""
    import finetune.kinds.classification.evaluation as evaluate_module

    checkpoint = calibrated["run"] / "checkpoint"
    plain = tmp_path / "plain"
    shutil.copytree(checkpoint, plain)
    config = json.loads((plain / "config.json").read_text())
    temperature = config.pop(TEMPERATURE_KEY)
    (plain / "config.json").write_text(json.dumps(config))
    members = []
    ensemble_outputs = evaluate_module.ensemble_outputs
    monkeypatch.setattr(
        evaluate_module,
        "ensemble_outputs",
        lambda spec, outputs: members.extend(outputs) or ensemble_outputs(spec, outputs),
    )
    task = load_recipe(checkpoint / "finetune_recipe.yaml", check_paths=False).task.data_dir
    data = eval_recipe(task, tmp_path / "eval", {})
    data["ensembles"] = {"pair": [str(checkpoint), str(plain)]}
    data.pop("models")
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", data))])
    assert result.exit_code == 0, result.output
    calibrated_member, plain_member = members
    np.testing.assert_array_equal(calibrated_member, plain_member / np.float32(temperature))


@pytest.mark.usefixtures("plots_drawn")
def test_calibration_none_measures_the_model_own_probabilities(tmp_path, pretrained, task_dir):
    data = calibrated_recipe(pretrained, task_dir, tmp_path / "run", calibration="none")
    data["keep_best"] = False  # the last weights: their logits are the last evaluation's
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))])
    assert result.exit_code == 0, result.output
    calibration = json.loads((tmp_path / "run" / RESULT_FILE).read_text())["calibration"]
    assert calibration["method"] == "none" and calibration["temperature"] == 1.0
    dev = calibration["dev"]
    assert all(dev[f"{name}_before"] == dev[f"{name}_after"] for name in ("ece", "brier", "nll"))
    assert "calibration: none; dev (24 rows) ECE" in result.output
    checkpoint = tmp_path / "run" / "checkpoint"
    assert TEMPERATURE_KEY not in json.loads((checkpoint / "config.json").read_text())
    texts, labels = dev_rows(checkpoint)
    logits = transformers_logits(checkpoint, texts)
    probabilities = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
    nll = -np.log(probabilities[np.arange(len(labels)), labels]).mean()
    assert dev["nll_before"] == pytest.approx(nll, rel=1e-4)  # of the saved (last) weights
    assert (tmp_path / "run" / PLOTS_DIR / f"{RELIABILITY_PLOT}.png").is_file()


@pytest.mark.parametrize(
    ("task", "kind"), [({"labels": None, "metrics": None}, "regression"), ({"kind": "tokens"}, "tokens")]
)
def test_a_kind_without_one_softmax_refuses_temperature_in_one_line(tmp_path, task_dir, task, kind):
    data = calibrated_recipe(tmp_path / "lm", task_dir, tmp_path / "run")
    if kind == "tokens":
        data["task"] = {"kind": "tokens", "name": "ner", "data_dir": str(task_dir), "format": "conll"}
    else:
        data["task"].update(task)
    line = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert f"calibration: temperature is not for task kind {kind} (it calibrates kind classification)" in line
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_ends_with_the_same_calibration(tmp_path, pretrained, task_dir, monkeypatch):
    """Stopped after the step-8 checkpoint (evaluations at 3 and 6 before it): keep_best's dev logits travel with
    the best weights, so the resumed run fits the same temperature as one that never stopped."""
    for name in ("full", "resumed"):
        write_yaml(
            tmp_path / f"{name}.yaml",
            resumable_recipe(pretrained, task_dir, tmp_path / name, calibration="temperature"),
        )
    run_finetune(load_recipe(tmp_path / "full.yaml"))
    stop_after_checkpoint(monkeypatch, 8)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(tmp_path / "resumed.yaml"))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")  # result.json's calibration included
    configs = [json.loads((tmp_path / name / "checkpoint" / "config.json").read_text()) for name in ("full", "resumed")]
    assert configs[0][TEMPERATURE_KEY] == configs[1][TEMPERATURE_KEY]
