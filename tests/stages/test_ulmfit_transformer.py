"""`finetune ulmfit` on a transformer: stage 1 is the given checkpoint, stage 2 continues it with the objective its
config names (masked for an encoder, next token for a decoder), stage 3 fine-tunes with the backbone's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import UlmfitRecipe, load_recipe
from finetune.recipes.ulmfit import checkpoint_objective
from tests.conftest import custom_task_section, write_task, write_yaml
from tests.tiny_families import save_tiny_checkpoint

runner = CliRunner()


@pytest.mark.parametrize(
    ("model_type", "head", "objective"),
    [
        ("bert", "base", "bert"),  # a sentence-embedding checkpoint: a bare encoder, continued as a masked LM
        ("roberta", "masked_lm", "bert"),
        ("distilbert", "base", "bert"),
        ("llama", "causal_lm", "gpt2"),
        ("llama", "base", "gpt2"),  # a bare decoder names no head: its model type decides
        ("gpt2", "causal_lm", "gpt2"),
    ],
)
def test_the_objective_of_a_checkpoint_is_read_from_its_config(tmp_path, model_type, head, objective):
    folder = save_tiny_checkpoint(tmp_path / model_type, model_type, head=head)
    assert checkpoint_objective(folder) == objective


def test_a_checkpoint_that_is_not_local_leaves_the_family_to_the_recipe(tmp_path):
    assert checkpoint_objective("some-org/some-model") is None
    assert checkpoint_objective(tmp_path) is None  # a folder without config.json: the stage refuses it in one line


def flow_recipe(checkpoint: Path, task: Path, run_dir: Path) -> dict:
    """A ulmfit flow from a given transformer, a few steps per stage, the classifier section left to defaults."""
    return {
        "stage": "ulmfit",
        "run_dir": str(run_dir),
        "task": custom_task_section(task),
        "general_lm": {"checkpoint": str(checkpoint)},
        "target_lm": {
            "corpus": {"task_splits": ["train", "test"], "validation_fraction": 0.2, "block_size": 16},
            "training": {"max_steps": 3, "batch_size": 4, "lr": 1e-4, "device": "cpu", "log_every": 1},
        },
        "classifier": {"training": {"epochs": 1, "max_steps": 3, "batch_size": 4, "device": "cpu"}},
    }


def test_a_given_masked_checkpoint_is_not_trained_again_and_stage_2_continues_it(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "encoder", "bert", head="base")  # no masked-LM head
    task = write_task(tmp_path / "task")
    recipe_path = write_yaml(tmp_path / "flow.yaml", flow_recipe(checkpoint, task, tmp_path / "run"))

    recipe = load_recipe(recipe_path)
    assert isinstance(recipe, UlmfitRecipe)
    assert recipe.target_lm.model.family == "bert" and recipe.target_lm.model.checkpoint == str(checkpoint)

    result = runner.invoke(app, ["ulmfit", str(recipe_path)])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert f"ulmfit stage 1 of 3: general-domain language model: {checkpoint} as given (not trained again)" in output
    assert "model.family bert: masked language modelling" in output
    assert f"{checkpoint} holds no language-model head (a BertModel): the head starts fresh" in output
    assert not (tmp_path / "run" / "1-general-lm").exists()
    # stage 3 took the backbone's defaults (the section gives no lr, schedule or unfreezing)
    assert "default for a bert transformer" in output

    language_model = AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "2-target-lm" / "checkpoint")
    given = AutoModelForMaskedLM.from_pretrained(checkpoint)
    moved = [
        name
        for name, parameter in given.bert.named_parameters()
        if not torch.equal(parameter, language_model.bert.get_parameter(name))
    ]
    assert moved, "stage 2 trained the given encoder"

    classifier = tmp_path / "run" / "3-classifier" / "checkpoint"
    model = AutoModelForSequenceClassification.from_pretrained(classifier)
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    assert model.config.model_type == "bert" and tokenizer.vocab == AutoTokenizer.from_pretrained(checkpoint).vocab
    summary = json.loads((tmp_path / "run" / "result.json").read_text(encoding="utf-8"))
    assert Path(summary["classifier"]["checkpoint"]) == classifier


def test_a_family_given_in_the_section_wins_over_the_checkpoints_config(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "encoder", "bert", head="base")
    task = write_task(tmp_path / "task")
    data = flow_recipe(checkpoint, task, tmp_path / "run")
    data["target_lm"]["model"] = {"family": "gpt2"}
    recipe = load_recipe(write_yaml(tmp_path / "flow.yaml", data))
    assert isinstance(recipe, UlmfitRecipe) and recipe.target_lm.model.family == "gpt2"


def test_a_given_decoder_is_continued_as_a_causal_language_model_then_fine_tuned(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "decoder", "llama")  # its tokenizer has no padding token
    task = write_task(tmp_path / "task")
    recipe_path = write_yaml(tmp_path / "flow.yaml", flow_recipe(checkpoint, task, tmp_path / "run"))

    result = runner.invoke(app, ["ulmfit", str(recipe_path)])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "model.family gpt2: next-token language modelling" in output
    assert "peak lr 2e-05" in output  # stage 3 on the decoder's own default
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "3-classifier" / "checkpoint")
    assert classifier.config.model_type == "llama" and classifier.config.pad_token_id is not None


def test_a_missing_head_is_said_in_one_line_not_called_corrupted(tmp_path, caplog):
    from transformers import BertForMaskedLM

    from finetune.models.loading import load_for_continued_pretraining

    checkpoint = save_tiny_checkpoint(tmp_path / "encoder", "bert", head="base")
    with caplog.at_level("WARNING"):
        model = load_for_continued_pretraining(
            BertForMaskedLM, str(checkpoint), None, lambda config: (), lambda c: None
        )
    assert isinstance(model, BertForMaskedLM)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # tied, fresh head
    assert not [record for record in caplog.records if "corrupted" in record.getMessage()]
