"""method contrastive (SetFit's) end to end on a tiny sentence-embedding checkpoint, for kinds classification and
multilabel: the encoder trains on pairs, the head starts from a logistic regression (multi-label: one per label), the
checkpoint loads in transformers and sentence-transformers; method auto picks it for few rows per class (per label);
the refusals are one line each."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.run_dir import read_metrics
from tests.conftest import one_error_line, save_tiny_masked_lm, write_task, write_yaml
from tests.recipes.test_backbone_defaults import minimal_recipe, with_sentence_transformers_pooling

runner = CliRunner()


@pytest.fixture(scope="module")
def sentence_model(tmp_path_factory) -> Path:
    """A tiny BERT with the files of a sentence-transformers model that mean-pools (as all-MiniLM-L6-v2)."""
    return with_sentence_transformers_pooling(save_tiny_masked_lm(tmp_path_factory.mktemp("sentence"), dropout=0.0))


def contrastive_recipe(checkpoint: Path, task: Path, run_dir: Path, **extra) -> dict:
    """A newcomer's recipe (20 rows per class) with 2 pairs of each kind per row (160 pairs: 10 steps of 16), then 4
    steps of the head."""
    data = minimal_recipe(checkpoint, task, run_dir, contrastive={"iterations": 2}, **extra)
    data["training"] = {"max_steps": 4, "batch_size": 8, "device": "cpu"}
    return data


def finetune(data: dict, tmp_path: Path, name: str = "recipe"):
    return runner.invoke(app, ["finetune", str(write_yaml(tmp_path / f"{name}.yaml", data))])


def test_auto_trains_the_encoder_on_pairs_then_the_head(sentence_model, task_dir, tmp_path):
    result = finetune(contrastive_recipe(sentence_model, task_dir, tmp_path / "run"), tmp_path)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "method: contrastive (auto: a sentence-embedding checkpoint and 20 labelled rows per class" in output
    assert "160 pairs of the 40 training rows (80 similar), 10 steps of 16" in output
    assert "head: logistic regression on the embeddings" in output
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    pair_losses = [record for record in records if record.get("phase") == "contrastive"]
    assert [record["step"] for record in pair_losses] == [10]
    trained = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    pretrained = load_file(sentence_model / "model.safetensors")
    encoder = {name.removeprefix("encoder."): weight for name, weight in trained.items() if name.startswith("encoder.")}
    # The pairs trained the encoder; the head's steps after them did not (unfreezing schedule [1]).
    name = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(encoder[name], pretrained[f"bert.{name}"])
    assert "unfreezing: gradual (groups per epoch [1]) method contrastive" in output


def test_the_checkpoint_loads_in_transformers_and_sentence_transformers(sentence_model, task_dir, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert finetune(contrastive_recipe(sentence_model, task_dir, tmp_path / "run"), tmp_path).exit_code == 0
    folder = tmp_path / "run" / "checkpoint"
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(["a good film", "a bad film"], return_tensors="pt", padding=True)
    with torch.no_grad():
        states = model.encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (states * mask).sum(1) / mask.sum(1)
    embedded = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu").encode(
        ["a good film", "a bad film"], convert_to_tensor=True
    )
    assert torch.allclose(embedded, mean, atol=1e-5)
    # Its saved recipe (method plain from then on, every contrastive key spelled out) loads for predict.
    predicted = runner.invoke(app, ["predict", str(folder)], input="a good film\na bad film\n\n")
    assert predicted.exit_code == 0, predicted.output
    assert "| method | contrastive |" in (folder / "README.md").read_text()  # the model card


def test_a_normalising_sentence_model_gives_its_head_normalised_embeddings(sentence_model, task_dir, tmp_path):
    import json

    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    normalising = tmp_path / "normalising"
    shutil.copytree(sentence_model, normalising)
    modules = json.loads((normalising / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (normalising / "modules.json").write_text(json.dumps(modules))
    result = finetune(contrastive_recipe(normalising, task_dir, tmp_path / "run"), tmp_path)
    assert result.exit_code == 0, result.output
    assert "the head reads the mean divided by its length" in " ".join(result.output.split())
    folder = tmp_path / "run" / "checkpoint"
    assert json.loads((folder / "config.json").read_text())["normalize"] is True
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    batch = AutoTokenizer.from_pretrained(folder)(["a good film", "a bad film ok"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits, states = model(**batch).logits, model.encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        normalised = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
        assert torch.allclose(logits, model.classifier(normalised), atol=1e-5)
    embedded = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu").encode(
        ["a good film", "a bad film ok"], convert_to_tensor=True
    )
    assert torch.allclose(embedded, normalised, atol=1e-5)


def test_auto_trains_plainly_where_pairs_do_not_fit(sentence_model, pretrained, task_dir, tmp_path):
    plain_model = finetune(contrastive_recipe(pretrained, task_dir, tmp_path / "bert"), tmp_path, "bert")
    assert plain_model.exit_code == 0, plain_model.output
    assert "method: plain (auto: the checkpoint is not a sentence-embedding model" in " ".join(
        plain_model.output.split()
    )
    pooled = finetune(contrastive_recipe(sentence_model, task_dir, tmp_path / "cls", pooling="model"), tmp_path, "c")
    assert pooled.exit_code == 0, pooled.output
    reason = "auto: not contrastive, since it trains the mean-pooled sentence embeddings, and pooling is model"
    assert f"method: plain ({reason})" in " ".join(pooled.output.split())


def test_method_contrastive_on_a_plain_checkpoint_pools_by_mean(pretrained, task_dir, tmp_path):
    result = finetune(contrastive_recipe(pretrained, task_dir, tmp_path / "run", method="contrastive"), tmp_path)
    assert result.exit_code == 0, result.output
    assert "pooling: mean method contrastive" in " ".join(result.output.split())


def test_a_stopped_contrastive_run_resumes_without_training_the_pairs_again(sentence_model, task_dir, tmp_path):
    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune
    from tests.conftest import interrupted_at_step

    data = contrastive_recipe(sentence_model, task_dir, tmp_path / "run", checkpoint_every=2)
    data["training"].update(max_steps=4, log_every=1)
    full = finetune(dict(data, run_dir=str(tmp_path / "full")), tmp_path, "full")
    assert full.exit_code == 0, full.output
    with interrupted_at_step(2):
        run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    resumed = runner.invoke(app, ["finetune", str(tmp_path / "recipe.yaml"), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "pairs of the 40 training rows" not in resumed.output  # the checkpoint holds the encoder they trained
    full_weights = load_file(tmp_path / "full" / "checkpoint" / "model.safetensors")
    resumed_weights = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    for name, weight in full_weights.items():
        assert torch.equal(weight, resumed_weights[name]), name


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"method": "contrastive", "pooling": "model"},
            "method: contrastive trains mean-pooled sentence embeddings: pooling mean or scalar_mix",
        ),
        ({"method": "plain"}, "contrastive.iterations is read with method contrastive (or auto), not plain"),
        ({"method": "pairs"}, "method"),
    ],
)
def test_recipe_mistakes_are_one_line(sentence_model, task_dir, tmp_path, change, said):
    result = finetune(contrastive_recipe(sentence_model, task_dir, tmp_path / "run", **change), tmp_path)
    assert result.exit_code != 0 and said in one_error_line(result)
    assert not (tmp_path / "run").exists()


def test_contrastive_refuses_a_kind_without_classes(sentence_model, tmp_path):
    data = contrastive_recipe(sentence_model, tmp_path, tmp_path / "run", method="contrastive")
    data["task"] = {"kind": "regression", "name": "scores", "data_dir": str(write_task(tmp_path / "task"))}
    data["task"].update(text_columns=["sentence"], label_column="label")
    result = finetune(data, tmp_path)
    assert result.exit_code != 0 and "method: contrastive is for task kind classification" in one_error_line(result)


def test_a_class_of_one_row_trains_contrastively_paired_with_itself(sentence_model, tmp_path):
    """ATIS has intents of one training row; SetFit pairs such a row with itself, and so does method contrastive now
    (it refused them before); auto still trains such a task plainly (tests/kinds/test_method.py)."""
    task = write_task(tmp_path / "task")
    rows = (task / "train.tsv").read_text().splitlines()
    one_positive = [rows[0]] + [row for row in rows[1:] if row.endswith("\t0")] + [rows[1]]
    (task / "train.tsv").write_text("\n".join(one_positive) + "\n")
    assert sum(row.endswith("\t1") for row in one_positive) == 1
    data = contrastive_recipe(sentence_model, task, tmp_path / "run", method="contrastive")
    result = finetune(data, tmp_path)
    assert result.exit_code == 0, result.output
    assert "method: contrastive (set in the recipe)" in " ".join(result.output.split())
    assert "pairs of the 21 training rows" in " ".join(result.output.split())
    shutil.rmtree(task)


# ---------------------------------------------------------------------------------------------
# Multi-label: rows pair by a shared label, the head starts from one regression per label
# ---------------------------------------------------------------------------------------------

MARKER_ROWS = (("train", 32), ("dev", 16), ("test", 8))


@pytest.fixture(scope="module")
def marker_task(tmp_path_factory) -> Path:
    from tests.kinds.test_multilabel import write_marker_task

    return write_marker_task(tmp_path_factory.mktemp("multilabel-pairs") / "task", MARKER_ROWS)


def multilabel_recipe(checkpoint: Path, task: Path, run_dir: Path, **extra) -> dict:
    """The marker words' labels (32 training rows, about 16 per label) with a threshold chosen on dev; 2 pairs of each
    kind per row, then 4 steps of the head."""
    from tests.kinds.test_multilabel import task_section

    data = minimal_recipe(checkpoint, task, run_dir, contrastive={"iterations": 2}, **extra)
    data["task"] = task_section(task, threshold="dev")
    data["training"] = {"max_steps": 4, "batch_size": 8, "device": "cpu"}
    return data


def training_labels(task: Path):
    from finetune.data.task_files import read_task_split
    from finetune.recipes import task_config
    from finetune.tasks.specs import task_spec
    from tests.kinds.test_multilabel import task_section

    return read_task_split(task_spec(task_config(**task_section(task))), task, "train").labels


@pytest.fixture(scope="module")
def multilabel_run(sentence_model, marker_task, tmp_path_factory):
    folder = tmp_path_factory.mktemp("multilabel-contrastive")
    result = finetune(multilabel_recipe(sentence_model, marker_task, folder / "run"), folder)
    assert result.exit_code == 0, result.output
    return folder / "run", " ".join(result.output.split())


def test_auto_trains_a_multilabel_encoder_on_pairs_then_a_regression_per_label(multilabel_run, marker_task):
    import numpy as np

    from finetune.data.pairs import contrastive_pairs

    run, output = multilabel_run
    labels = training_labels(marker_task)
    median = int(np.median(labels.sum(axis=0)))
    assert f"method: contrastive (auto: a sentence-embedding checkpoint and {median} positive rows per label" in output
    pairs = contrastive_pairs(labels, 2, seed=0)  # the recipe's seed
    steps = -(-len(pairs.similar) // 16)
    said = f"{len(pairs.similar)} pairs of the 32 training rows ({int(pairs.similar.sum())} similar), {steps} steps"
    assert said in output
    assert "head: a logistic regression per label on the embeddings (one-vs-rest), training subset accuracy" in output
    records = read_metrics(run / "metrics.jsonl")
    assert [record["step"] for record in records if record.get("phase") == "contrastive"] == [
        *range(10, steps, 10),
        steps,
    ]
    assert "unfreezing: gradual (groups per epoch [1]) method contrastive" in output


def test_a_multilabel_contrastive_checkpoint_loads_predicts_and_evaluates(multilabel_run, marker_task, tmp_path):
    import json

    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.commands.predict import predict
    from tests.kinds.test_multilabel import LABELS, eval_yaml

    run, _ = multilabel_run
    folder, saved = run / "checkpoint", json.loads((run / "result.json").read_text())["best"]["dev_threshold"]
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert model.config.problem_type == "multi_label_classification" and model.config.multilabel_threshold == saved
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = ["really great music so", "very quite truly awful"]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits, states = model(**batch).logits, model.encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (states * mask).sum(1) / mask.sum(1)
    embedded = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu").encode(
        texts, convert_to_tensor=True
    )
    assert torch.allclose(embedded, mean, atol=1e-5)
    for row, label_logits in zip(predict(str(folder), texts), logits):  # the labels above the saved threshold
        assert list(row["probabilities"]) == LABELS
        assert row["labels"] == [label for label, logit in zip(LABELS, label_logits) if torch.sigmoid(logit) > saved]
    card = (folder / "README.md").read_text()
    assert "| method | contrastive |" in card and f"| decision threshold | {saved:g}" in card
    result = runner.invoke(app, ["eval", str(eval_yaml(tmp_path, marker_task, {"ml": str(folder)}))])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval" / "report.json").read_text())["results"]["ml"]["threshold"] == saved


@pytest.mark.slow
def test_a_multilabel_contrastive_checkpoint_loads_without_finetune_and_exports(multilabel_run, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.models.test_mean_pooling_export import LOAD_WITHOUT_FINETUNE, TEXTS

    folder = multilabel_run[0] / "checkpoint"
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    batch = AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    environment = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    finished = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_FINETUNE, json.dumps([str(folder)]), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,  # not the checkout: transformers alone, with the folder's own mean_pooling.py
        env=environment,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    printed = json.loads(finished.stdout.strip().splitlines()[-1])
    loaded = printed["loaded"][str(folder)]
    assert printed["imported"] == [] and loaded["embeddings"] is not None
    torch.testing.assert_close(torch.tensor(loaded["logits"]), logits, rtol=1e-5, atol=1e-5)
    pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
    import onnxruntime

    exported = runner.invoke(app, ["export", str(multilabel_run[0]), "--onnx", "--out", str(tmp_path / "onnx")])
    assert exported.exit_code == 0, exported.output
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {item.name: batch[item.name].numpy() for item in session.get_inputs()}
    (onnx_logits,) = session.run(["logits"], inputs)
    torch.testing.assert_close(torch.from_numpy(onnx_logits), logits, rtol=0, atol=1e-4)


def test_a_stopped_multilabel_contrastive_run_resumes_bit_for_bit(sentence_model, marker_task, tmp_path):
    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune
    from tests.conftest import interrupted_at_step

    data = multilabel_recipe(sentence_model, marker_task, tmp_path / "run", method="contrastive", checkpoint_every=2)
    data["training"].update(log_every=1)
    full = finetune(dict(data, run_dir=str(tmp_path / "full")), tmp_path, "full")
    assert full.exit_code == 0, full.output
    with interrupted_at_step(2):
        run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    resumed = runner.invoke(app, ["finetune", str(tmp_path / "recipe.yaml"), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "pairs of the 32 training rows" not in resumed.output  # the checkpoint holds the encoder they trained
    full_weights = load_file(tmp_path / "full" / "checkpoint" / "model.safetensors")
    resumed_weights = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    for name, weight in full_weights.items():
        assert torch.equal(weight, resumed_weights[name]), name


@pytest.mark.parametrize("kind", ["classification", "multilabel"])
def test_a_lora_adapter_learns_the_pairs_and_its_heads_copy_the_regression(
    sentence_model, task_dir, marker_task, tmp_path, kind
):
    from finetune.commands.predict import predict

    if kind == "classification":
        data = contrastive_recipe(sentence_model, task_dir, tmp_path / "run", method="contrastive")
    else:
        data = multilabel_recipe(sentence_model, marker_task, tmp_path / "run", method="contrastive")
    data["model"]["adapter"] = {"rank": 4, "target_modules": ["query", "value"]}
    result = finetune(data, tmp_path)
    assert result.exit_code == 0, result.output
    assert "head: " in result.output and (tmp_path / "run" / "checkpoint" / "adapter_config.json").is_file()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [record for record in records if record.get("phase") == "contrastive"]
    assert predict(str(tmp_path / "run" / "checkpoint"), ["great music"])[0]["probabilities"]


def write_labelled_rows(task: Path, rows: list[list[str]]) -> Path:
    """The marker task with its training rows' labels replaced by `rows`, one after another."""
    import json

    lines = (task / "train.jsonl").read_text().splitlines()
    relabelled = [json.dumps(dict(json.loads(line), labels=labels)) for line, labels in zip(lines, rows)]
    (task / "train.jsonl").write_text("\n".join(relabelled) + "\n")
    return task


NO_SIMILAR = [["GREAT"], ["AWFUL"], ["MUSIC"]] + [[]] * 29  # no label on two rows; a row of none is similar to none


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ([["GREAT", "AWFUL"]] * 32, "every two of the 32 training rows share a label: no dissimilar pair"),
        (NO_SIMILAR, "no two of the 32 training rows share a label: no similar pair"),
    ],
)
def test_multilabel_rows_without_pairs_of_both_kinds_are_refused_in_one_line_or_trained_plainly(
    sentence_model, marker_task, tmp_path, rows, said
):
    task = write_labelled_rows(shutil.copytree(marker_task, tmp_path / "task"), rows)
    data = multilabel_recipe(sentence_model, task, tmp_path / "run", method="contrastive")
    result = finetune(data, tmp_path)
    assert result.exit_code != 0 and f"method: contrastive: {said} (or method: plain)" in one_error_line(result)
    assert not (tmp_path / "run").exists()
    auto = finetune(dict(data, method="auto"), tmp_path)
    assert auto.exit_code == 0, auto.output
    assert f"method: plain (auto: not contrastive, since {said})" in " ".join(auto.output.split())


def test_multilabel_contrastive_refuses_pooling_model(sentence_model, marker_task, tmp_path):
    data = multilabel_recipe(sentence_model, marker_task, tmp_path / "run", method="contrastive", pooling="model")
    result = finetune(data, tmp_path)
    said = "method: contrastive trains mean-pooled sentence embeddings: pooling mean or scalar_mix"
    assert result.exit_code != 0 and said in one_error_line(result)
    assert not (tmp_path / "run").exists()


def test_the_run_names_a_label_whose_head_row_is_its_rate_alone():
    import numpy as np

    from finetune.kinds.contrastive import start_head

    generator = np.random.default_rng(0)
    embeddings = generator.normal(size=(12, 4)).astype(np.float32)
    labels = np.zeros((12, 3), dtype=np.float32)
    labels[::2, 0], labels[1::3, 2] = 1.0, 1.0  # GREAT on half the rows, MUSIC on a third, AWFUL on none
    said = start_head(torch.nn.Linear(4, 3), embeddings, labels, ("GREAT", "AWFUL", "MUSIC"), seed=0)
    assert said.startswith("head: a logistic regression per label on the embeddings (one-vs-rest)")
    assert said.endswith("; label 'AWFUL' is on no training row: its bias alone")


@pytest.mark.parametrize("kind", ["classification", "multilabel"])
def test_rows_read_in_chunks_are_refused_in_one_line_or_trained_plainly(
    sentence_model, task_dir, marker_task, tmp_path, kind
):
    if kind == "classification":
        data = contrastive_recipe(sentence_model, task_dir, tmp_path / "run", method="contrastive")
    else:
        data = multilabel_recipe(sentence_model, marker_task, tmp_path / "run", method="contrastive")
    data["task"].update(max_length=8, long_documents="chunks")
    said = "task.long_documents reads a row in chunks, and the pairs read one sequence per row (head_tail does)"
    result = finetune(data, tmp_path)
    assert result.exit_code != 0 and f"method: contrastive: {said} (or method: plain)" in one_error_line(result)
    assert not (tmp_path / "run").exists()
    auto = finetune(dict(data, method="auto"), tmp_path)
    assert auto.exit_code == 0, auto.output
    assert f"method: plain (auto: not contrastive, since {said})" in " ".join(auto.output.split())
