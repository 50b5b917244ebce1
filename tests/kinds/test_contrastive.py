"""method contrastive (SetFit's) end to end on a tiny sentence-embedding checkpoint: the encoder trains on pairs,
the head starts from a logistic regression, the checkpoint loads in transformers and sentence-transformers; method
auto picks it for few rows per class; the refusals are one line each."""

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


def test_contrastive_refuses_a_class_with_one_row(sentence_model, tmp_path):
    task = write_task(tmp_path / "task")
    rows = (task / "train.tsv").read_text().splitlines()
    one_positive = [rows[0]] + [row for row in rows[1:] if row.endswith("\t0")] + [rows[1]]
    (task / "train.tsv").write_text("\n".join(one_positive) + "\n")
    data = contrastive_recipe(sentence_model, task, tmp_path / "run", method="contrastive")
    result = finetune(data, tmp_path)
    assert result.exit_code != 0
    assert "class '1' has 1 training row(s); similar pairs need 2 rows of every class" in one_error_line(result)
    assert not (tmp_path / "run").exists()
    shutil.rmtree(task)
