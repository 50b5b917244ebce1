"""`finetune export CHECKPOINT --onnx`: ONNX Runtime gives our logits (a calibrated classifier's temperature beside
them); bad input is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.commands import export as export_module
from finetune.errors import UserError
from finetune.models.heads import TEMPERATURE_KEY
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from tests.conftest import finetune_recipe, save_tiny_masked_lm, write_task, write_yaml

onnxruntime = pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
onnx = pytest.importorskip("onnx", reason="the export extra (onnx) is not installed")
pytest.importorskip("onnxscript", reason="the export extra (onnxscript) is not installed")

# Another batch size and length than the exporter's sample, with padding in every row but the longest.
TEXTS = ["good", "a bad film", "the best film of the year by far", "not good at all"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A run folder per pooling (model: BERT's own [CLS] head; mean, calibrated), fine-tuned one epoch on the tiny
    task."""
    root = tmp_path_factory.mktemp("export")
    pretrained, task = save_tiny_masked_lm(root / "lm"), write_task(root / "task")
    folders, calibrations = {}, {"model": "none", "mean": "temperature"}
    for pooling in ("model", "mean"):
        data = finetune_recipe(pretrained, task, root / pooling)
        data.update({"pooling": pooling, "unfreezing": {"mode": "none"}, "calibration": calibrations[pooling]})
        data["training"]["epochs"] = 1
        run_finetune(load_recipe(write_yaml(root / f"{pooling}.yaml", data)))
        folders[pooling] = root / pooling
    return folders


@pytest.mark.parametrize("pooling", ["model", "mean"])
def test_onnx_runtime_gives_our_logits_on_a_padded_batch(runs, pooling, tmp_path):
    out = tmp_path / "onnx"
    result = CliRunner().invoke(app, ["export", str(runs[pooling]), "--onnx", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'model.onnx'}" in result.output
    assert {"model.onnx", "tokenizer.json", "config.json", "finetune_recipe.yaml"} <= {p.name for p in out.iterdir()}
    graph = onnx.load(str(out / "model.onnx"))
    for graph_input in graph.graph.input:  # batch and sequence axes are named, not fixed sizes
        assert [dim.dim_param != "" for dim in graph_input.type.tensor_type.shape.dim] == [True, True]
    tokenizer = AutoTokenizer.from_pretrained(out)  # the folder's own tokenizer: it stands alone
    batch = tokenizer(TEXTS, padding=True, return_tensors="np")
    assert (batch["attention_mask"] == 0).any()
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [graph_input.name for graph_input in session.get_inputs()]
    (logits,) = session.run(["logits"], {name: batch[name] for name in names})
    model = AutoModelForSequenceClassification.from_pretrained(runs[pooling] / "checkpoint").eval()
    with torch.no_grad():
        expected = model(**{name: torch.from_numpy(batch[name]) for name in names}).logits
    assert logits.shape == (len(TEXTS), 2)
    torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=0, atol=1e-4)
    # A calibrated classifier's graph gives the same logits; config.json beside it keeps the temperature that
    # predict divides them by, and the command says so.
    temperature = json.loads((out / "config.json").read_text()).get(TEMPERATURE_KEY, 1.0)
    assert (temperature != 1.0) == (pooling == "mean")
    assert (f"softmax(logits / {temperature:.4f})" in result.output) == (pooling == "mean")
    predicted = finetune.predict(str(runs[pooling] / "checkpoint"), TEXTS)  # reads 16 tokens, task.max_length
    read = tokenizer(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="np")
    (logits,) = session.run(["logits"], {name: read[name] for name in names})
    probabilities = torch.softmax(torch.from_numpy(logits).double() / temperature, dim=-1).numpy()
    np.testing.assert_allclose([list(row["probabilities"].values()) for row in predicted], probabilities, atol=1e-4)


def test_a_folder_that_is_not_a_fine_tuned_checkpoint_is_one_line(runs, tmp_path):
    language_model = runs["mean"].parent / "lm" / "checkpoint"  # config.json, no finetune_recipe.yaml
    cases = [
        (["export", str(language_model), "--onnx"], "is not a fine-tuned checkpoint"),
        (["export", str(tmp_path / "nothing"), "--onnx"], "CHECKPOINT: no such folder"),
        (["export", str(runs["mean"])], "--onnx: say which format"),
        (["export", str(runs["mean"]), "--onnx", "--opset", "17"], "--opset: 17 is older than 18"),
        (["export", str(runs["mean"]), "--onnx", "--out", str(runs["mean"])], "exists and is not an empty folder"),
    ]
    for arguments, message in cases:
        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 2, (arguments, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "onnx").exists()


def test_missing_packages_say_how_to_install_them(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # `import onnxscript` raises ImportError, as when absent
    with pytest.raises(UserError, match=r"needs onnxscript: pip install 'finetune\[export\]'"):
        export_module.run_export(tmp_path)


def test_an_exporter_failure_is_one_line_and_leaves_no_folder(runs, tmp_path, monkeypatch):
    def exporter_that_fails(*arguments, **keywords):
        raise RuntimeError("Failed to export the model with torch.export.\n(pages)") from ValueError("the cause\nmore")

    monkeypatch.setattr(export_module, "export_graph", exporter_that_fails)
    out = tmp_path / "onnx"
    result = CliRunner().invoke(app, ["export", str(runs["model"]), "--onnx", "--out", str(out)])
    assert result.exit_code == 1, result.output
    model = f"{runs['model'] / 'checkpoint'}'s BertForSequenceClassification"
    assert result.output.strip().splitlines() == [f"error: torch.onnx.export could not export {model}: the cause"]
    assert not out.exists() and not (tmp_path / "onnx.partial").exists()


def test_quantize_writes_an_int8_graph_and_scores_both_on_the_dev_rows(runs, tmp_path):
    out = tmp_path / "onnx"
    result = CliRunner().invoke(app, ["export", str(runs["model"]), "--onnx", "--quantize", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'model_int8.onnx'} (int8 weights" in result.output
    graph = onnx.load(str(out / "model_int8.onnx"))
    operators = {node.op_type for node in graph.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= operators  # the linear layers run on int8 weights
    assert (out / "model_int8.onnx").stat().st_size < (out / "model.onnx").stat().st_size
    report = json.loads((out / "quantization.json").read_text())
    assert report["files"] == {"fp32": "model.onnx", "int8": "model_int8.onnx"} and report["dev_not_measured"] is None
    dev = report["dev"]
    assert dev["rows"] == 24 and set(dev["metrics"]) == {"fp32", "int8"} and 0.0 <= dev["agreement"] <= 1.0
    # fp32's score is the checkpoint's own on the same rows: the graph reads them as predict does.
    dev_file = runs["model"].parent / "task" / "dev.tsv"
    rows = [line.split("\t") for line in dev_file.read_text().splitlines()[1:]]
    predicted = finetune.predict(str(runs["model"] / "checkpoint"), [text for text, _ in rows])
    accuracy = np.mean([row["label"] == label.strip() for row, (_, label) in zip(predicted, rows)])
    assert dev["metrics"]["fp32"]["accuracy"] == pytest.approx(accuracy)
    assert f"dev (24 rows): accuracy {accuracy:.4f} fp32" in result.output
    # ONNX Runtime alone runs it, on a padded batch of another size.
    session = onnxruntime.InferenceSession(str(out / "model_int8.onnx"), providers=["CPUExecutionProvider"])
    batch = AutoTokenizer.from_pretrained(out)(TEXTS, padding=True, return_tensors="np")
    (logits,) = session.run(["logits"], {i.name: batch[i.name] for i in session.get_inputs()})
    assert logits.shape == (len(TEXTS), 2) and np.isfinite(logits).all()


def test_quantize_without_the_tasks_data_says_the_dev_score_is_not_measured(runs, tmp_path):
    import shutil

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(runs["mean"] / "checkpoint", checkpoint)
    recipe = checkpoint / "finetune_recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(runs["mean"].parent / "task"), str(tmp_path / "moved")))
    out = tmp_path / "onnx"
    result = CliRunner().invoke(app, ["export", str(checkpoint), "--onnx", "--quantize", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "dev score not measured:" in result.output and str(tmp_path / "moved") in result.output
    report = json.loads((out / "quantization.json").read_text())
    assert report["dev"] is None and str(tmp_path / "moved") in report["dev_not_measured"]
    assert (out / "model_int8.onnx").is_file()


def test_bench_times_the_pipeline_our_predictor_and_both_graphs(runs, tmp_path):
    out = tmp_path / "onnx"
    assert (
        CliRunner().invoke(app, ["export", str(runs["model"]), "--onnx", "--quantize", "--out", str(out)]).exit_code
        == 0
    )
    record_file = tmp_path / "bench.json"
    arguments = ["bench", str(runs["model"]), "--onnx", str(out), "--latency-inputs", "4", "--throughput-inputs", "8"]
    result = CliRunner().invoke(app, [*arguments, "--batch-size", "4", "--json", str(record_file)])
    assert result.exit_code == 0, result.output
    record = json.loads(record_file.read_text())
    engines = [
        "transformers pipeline",
        "finetune, torch fp32",
        "finetune, ONNX Runtime fp32",
        "finetune, ONNX Runtime int8",
    ]
    assert [engine["engine"] for engine in record["engines"]] == engines
    for engine in record["engines"]:
        assert 0 < engine["median_ms"] <= engine["p95_ms"] and engine["inputs_per_second"] > 0
        assert f"| {engine['engine']} | {engine['median_ms']:.1f} |" in result.output
    assert record["cpu"] and record["inputs"] == "the dev rows" and record["batch_size"] == 4
    assert "| transformers pipeline |" in result.output and "| 1.00x |" in result.output


def test_bench_reads_inputs_from_a_file_and_refuses_what_it_cannot_time_in_one_line(runs, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    small = ["--latency-inputs", "2", "--throughput-inputs", "4"]
    result = CliRunner().invoke(app, ["bench", str(runs["mean"]), "--input", str(texts), *small])
    assert result.exit_code == 0, result.output
    assert "| finetune, torch fp32 |" in result.output and "ONNX" not in result.output
    cases = [
        (["--onnx", str(tmp_path)], "holds no model.onnx"),
        (["--input", str(tmp_path / "nothing.txt")], "--input: no such file"),
    ]
    for arguments, message in cases:
        result = CliRunner().invoke(app, ["bench", str(runs["mean"]), *arguments, *small])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "nothing"), *small])
    assert result.exit_code == 2 and "CHECKPOINT: no such folder" in result.output
