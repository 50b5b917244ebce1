"""`pooling: mean`: a linear head on the average of the encoder's last layer over the real tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, GPT2Config, GPT2Model
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.evaluate import run_eval
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.backbones import layer_groups
from finetune.models.heads import load_classifier
from finetune.models.mean_pooling import MeanPoolingForSequenceClassification, mean_over_real_tokens
from finetune.recipes import BackboneConfig, load_recipe, task_config
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.tasks.specs import task_spec
from tests.conftest import custom_task_section, eval_recipe, finetune_recipe, save_tiny_masked_lm, write_yaml


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny random BERT masked LM (2 layers, hidden 32) with its WordPiece tokenizer."""
    return save_tiny_masked_lm(tmp_path_factory.mktemp("pretrained"))


def classifier(checkpoint: Path, task: Path, pooling: str = "mean", init: str = "pretrained"):
    spec = task_spec(task_config(**custom_task_section(task)))
    return load_classifier(BackboneConfig(checkpoint=str(checkpoint), init=init), spec, None, pooling)


def test_mean_covers_only_the_masked_positions():
    hidden = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    pooled = mean_over_real_tokens(hidden, mask)
    assert torch.equal(pooled[0], hidden[0, :2].mean(dim=0))
    assert torch.equal(pooled[1], hidden[1].mean(dim=0))
    assert torch.equal(mean_over_real_tokens(hidden, None), hidden.mean(dim=1))


def test_head_sits_on_the_pretrained_encoder_without_its_pooler(pretrained, task_dir):
    model = classifier(pretrained, task_dir)
    assert isinstance(model, MeanPoolingForSequenceClassification)
    encoder = AutoModel.from_pretrained(pretrained)
    for name, tensor in model.encoder.state_dict().items():
        assert torch.equal(tensor, encoder.state_dict()[name]), name
    assert model.encoder.pooler is None and not any("pooler" in name for name, _ in model.named_parameters())
    assert model.classifier.out_features == 2 and model.config.id2label == {0: "0", 1: "1"}
    assert model.dropout.p == encoder.config.hidden_dropout_prob  # classifier_dropout null: the encoder's
    # Random init builds the same architecture with other weights.
    random = classifier(pretrained, task_dir, init="random")
    embeddings = "embeddings.word_embeddings.weight"
    assert not torch.equal(random.encoder.state_dict()[embeddings], encoder.state_dict()[embeddings])


def test_padding_does_not_change_the_logits(pretrained, task_dir):
    model = classifier(pretrained, task_dir).eval()
    short, long = [2, 5, 6, 3], [2, 5, 7, 8, 9, 6, 3]
    alone = model(input_ids=torch.tensor([short])).logits
    batch = torch.tensor([short + [0] * 3, long])
    together = model(input_ids=batch, attention_mask=(batch != 0).long()).logits
    torch.testing.assert_close(together[0], alone[0], rtol=1e-5, atol=1e-6)


def test_layer_groups_are_the_encoders_then_the_linear_head(pretrained, task_dir):
    model = classifier(pretrained, task_dir)
    groups = layer_groups(model)
    assert len(groups) == 4  # embeddings, 2 blocks, head
    assert [tuple(parameter.shape) for parameter in groups[-1]] == [(2, 32), (2,)]
    assert groups[0][0] is model.encoder.embeddings.word_embeddings.weight


def test_decoder_backbones_get_the_head_too(tmp_path, task_dir):
    GPT2Model(GPT2Config(vocab_size=60, n_positions=16, n_embd=16, n_layer=2, n_head=2)).save_pretrained(tmp_path)
    model = classifier(tmp_path, task_dir)
    assert len(layer_groups(model)) == 4  # token + position embeddings, 2 blocks, head (final norm and linear)
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])
    logits = model.eval()(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])).logits
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()


def test_fine_tuned_checkpoint_reloads_through_the_auto_class(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data.update({"pooling": "mean", "unfreezing": {"mode": "none"}})
    data["training"].update({"epochs": 2, "lr": 5e-3})
    checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "mean_pooling_classifier" and config["encoder"]["model_type"] == "bert"
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
    assert isinstance(model, MeanPoolingForSequenceClassification)
    # The reloaded model scores the dev set exactly as the run did at its best evaluation.
    report = run_eval(
        load_recipe(
            write_yaml(tmp_path / "eval.yaml", eval_recipe(task_dir, tmp_path / "eval", {"mean": str(checkpoint)}))
        )
    )
    result = json.loads((tmp_path / "run" / RESULT_FILE).read_text())
    assert report["results"]["mean"]["accuracy"] == pytest.approx(result["best"]["dev_accuracy"])
    # Warm start with the default pooling keeps the checkpoint's kind of head, and its weights for the same labels.
    again = classifier(checkpoint, task_dir, pooling="model")
    assert isinstance(again, MeanPoolingForSequenceClassification)
    assert torch.equal(again.classifier.weight, model.classifier.weight)
    assert AutoConfig.from_pretrained(checkpoint).encoder.hidden_size == 32


def test_awd_lstm_checkpoints_refuse_mean_pooling_in_one_line(tmp_path, task_dir):
    folder = tmp_path / "awd"
    AWDLSTMForCausalLM(AWDLSTMConfig(vocab_size=200, embedding_size=8, hidden_size=12, num_layers=2)).save_pretrained(
        folder
    )
    (folder / "tokenizer.json").write_text(
        (save_tiny_masked_lm(tmp_path / "bert", layers=1, hidden=16) / "tokenizer.json").read_text()
    )
    data = finetune_recipe(folder, task_dir, tmp_path / "run")
    data["pooling"] = "mean"
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2
    assert "pooling: mean is for transformer encoders" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
