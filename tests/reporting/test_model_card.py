"""Every saved checkpoint carries a Hugging Face model card (README.md) written from the run's own records."""

from __future__ import annotations

import json
import random

import pytest
from huggingface_hub import ModelCard

from finetune.recipes import load_recipe
from finetune.reporting.model_card import hub_base_model
from finetune.run_dir import read_metrics
from finetune.stages.finetune import run_finetune
from finetune.stages.pretrain import run_pretrain
from tests.conftest import finetune_recipe, make_sentence, pretrain_recipe, save_tiny_masked_lm, write_task, write_yaml


def card_of(checkpoint):
    card = ModelCard.load(checkpoint / "README.md")  # the hub's own reader parses and validates it
    return card, {(result.metric_name, result.metric_value) for result in card.data.eval_results or []}


def test_classifier_card_holds_the_saved_weights_scores_and_the_curve(tmp_path):
    data = finetune_recipe(save_tiny_masked_lm(tmp_path / "lm"), write_task(tmp_path / "task"), tmp_path / "run")
    checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / "r.yaml", data), expected_stage="finetune"))
    card, metrics = card_of(checkpoint)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert metrics == {
        ("accuracy", round(result["best"]["dev_accuracy"], 4)),
        ("f1", round(result["best"]["dev_f1"], 4)),
    }
    assert card.data.pipeline_tag == "text-classification" and card.data.library_name == "transformers"
    assert card.data.base_model is None  # a local folder is no hub model to link
    assert card.data.eval_results[0].dataset_split == "validation"
    evaluations = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "eval"]
    for record in evaluations:  # the curve's numbers, one row per evaluation
        assert f"| {record['step']} | {record['epoch'] + 1} | {record['dev_accuracy']:.4f} |" in card.text
    assert f"step {result['best_step']}" in card.text and "optimistic" in card.text  # keep_best said honestly
    assert "gradual, from 1 group(s), one more every epoch" in card.text and "tiny-sentiment" in card.text


def test_regression_card_and_last_weights(tmp_path):
    rng = random.Random(0)
    (tmp_path / "task").mkdir()
    for split, count in (("train", 16), ("dev", 8)):
        rows = ["sentence\tscore"] + [f"{make_sentence(rng, i % 2 == 0)}\t{i % 5}.0" for i in range(count)]
        (tmp_path / "task" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    data = finetune_recipe(save_tiny_masked_lm(tmp_path / "lm"), tmp_path / "task", tmp_path / "run")
    data["task"] = {
        "name": "scores",
        "data_dir": str(tmp_path / "task"),
        "text_columns": ["sentence"],
        "label_column": "score",
        "labels": None,
        "max_length": 16,
    }
    data.update(keep_best=False)
    checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / "r.yaml", data), expected_stage="finetune"))
    card, metrics = card_of(checkpoint)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert metrics == {(name, round(result["last"][f"dev_{name}"], 4)) for name in ("pearson", "spearman")}
    assert "sentence -> a score" in card.text and "the weights after the last step" in card.text


def test_language_model_card_holds_the_validation_curve(tmp_path, corpus_file):
    data = pretrain_recipe(corpus_file, tmp_path / "lm")
    checkpoint = run_pretrain(load_recipe(write_yaml(tmp_path / "r.yaml", data), expected_stage="pretrain"))
    card, metrics = card_of(checkpoint)
    last = [record for record in read_metrics(tmp_path / "lm" / "metrics.jsonl") if record["phase"] == "eval"][-1]
    assert ("validation_loss", round(last["validation_loss"], 4)) in metrics
    assert card.data.pipeline_tag == "fill-mask" and "trained from scratch" in card.text
    assert f"{last['validation_loss']:.4f}" in card.text and "train.txt" in card.text


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bert-base-uncased", "bert-base-uncased"),
        ("google/electra-small", "google/electra-small"),
        ("runs/x/checkpoint", None),
        ("/abs/path", None),
        (None, None),
    ],
)
def test_only_hub_names_become_base_model(name, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_base_model(name) == expected
    (tmp_path / "google" / "electra-small").mkdir(parents=True)
    assert hub_base_model("google/electra-small") is None  # an existing local folder is not a hub name


def test_the_card_states_the_length_a_transformer_read_when_the_recipe_left_it_out():
    from finetune.models.families import WHOLE_DOCUMENT_TYPES
    from finetune.reporting.model_card import read_length

    assert read_length(None, "bert") == 128  # what fitted_max_length gives a transformer: not "whole"
    assert read_length(None, WHOLE_DOCUMENT_TYPES[0]) is None  # a recurrent classifier reads every token
    assert read_length(64, "bert") == 64
