"""`pooling: scalar_mix`: ELMo's gamma * sum_j softmax(w)_j h_j over every layer, on transformers and the AWD-LSTM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSequenceClassification
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.awd_lstm_classifier import AWDLSTMForSequenceClassification
from finetune.models.backbones import layer_groups
from finetune.models.heads import load_classifier
from finetune.models.mean_pooling import MeanPoolingForSequenceClassification, mean_over_real_tokens
from finetune.models.scalar_mix import ProjectedScalarMix, ScalarMix
from finetune.recipes import BackboneConfig, load_recipe, task_config
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.tasks.specs import task_spec
from tests.conftest import (
    custom_task_section,
    eval_recipe,
    finetune_recipe,
    save_tiny_masked_lm,
    write_corpus,
    write_yaml,
)


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    """A tiny random BERT masked LM (2 layers, hidden 32) with its WordPiece tokenizer."""
    return save_tiny_masked_lm(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def awd_lstm(tmp_path_factory) -> Path:
    """A tiny random AWD-LSTM language model (inner layer 12 wide, top layer 8) with a byte-level BPE tokenizer (the
    kind the AWD-LSTM's pretraining trains)."""
    folder = tmp_path_factory.mktemp("awd")
    tokenizer = train_byte_level_bpe(read_documents([write_corpus(folder / "corpus")]), 300, min_frequency=1)
    torch.manual_seed(0)
    AWDLSTMForCausalLM(
        AWDLSTMConfig(
            vocab_size=len(tokenizer),
            embedding_size=8,
            hidden_size=12,
            num_layers=2,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).save_pretrained(folder / "checkpoint")
    tokenizer.save_pretrained(folder / "checkpoint")
    return folder / "checkpoint"


def classifier(checkpoint: Path, task: Path, pooling: str = "scalar_mix"):
    spec = task_spec(task_config(**custom_task_section(task)))
    return load_classifier(BackboneConfig(checkpoint=str(checkpoint)), spec, None, pooling)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two right-padded rows of token ids (pad 0) and their attention mask."""
    input_ids = torch.tensor([[2, 5, 6, 7, 3, 0, 0], [2, 8, 9, 10, 11, 12, 3]])
    return input_ids, (input_ids != 0).long()


def by_hand(layer_weights: torch.Tensor, gamma: torch.Tensor, layers: list[torch.Tensor]) -> torch.Tensor:
    """Peters et al. (2018), eq. 1, written out."""
    shares = layer_weights.exp() / layer_weights.exp().sum()
    return gamma * sum(share * layer for share, layer in zip(shares, layers))


def set_mix(mix: ScalarMix, layer_weights: list[float], gamma: float) -> None:
    with torch.no_grad():
        mix.layer_weights.copy_(torch.tensor(layer_weights))
        mix.gamma.fill_(gamma)


def awd_layers(model: AWDLSTMForSequenceClassification, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """The embedded tokens and each LSTM layer's output, computed layer by layer outside the classifier (eval)."""
    encoder = model.awd_lstm
    layers = [encoder.embedding(input_ids)]
    for layer in encoder.layers:
        layers.append(layer(layers[-1])[0])
    return layers


def test_the_transformer_mix_is_gamma_times_the_softmax_weighted_sum_of_its_hidden_states(bert, task_dir):
    model = classifier(bert, task_dir).eval()
    assert isinstance(model, MeanPoolingForSequenceClassification) and model.config.scalar_mix
    set_mix(model.scalar_mix, [0.5, -1.0, 2.0], 1.7)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        states = model.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        expected = by_hand(model.scalar_mix.layer_weights, model.scalar_mix.gamma, list(states.hidden_states))
        assert len(states.hidden_states) == 3  # the embedding output and both layers
        torch.testing.assert_close(model.scalar_mix(states.hidden_states), expected)
        # The head averages the mix over the real tokens, not the last layer.
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        torch.testing.assert_close(logits, model.classifier(mean_over_real_tokens(expected, attention_mask)))
        last_layer = model.classifier(mean_over_real_tokens(states.last_hidden_state, attention_mask))
    assert not torch.allclose(logits, last_layer, atol=1e-4)


@pytest.mark.parametrize("cell", ["lstm", "qrnn", "rnn"])
def test_the_awd_lstm_mix_covers_the_embedding_and_every_layer_projected_to_the_top_width(cell):
    torch.manual_seed(0)
    model = AWDLSTMForSequenceClassification(
        AWDLSTMConfig(
            vocab_size=30,
            embedding_size=8,
            hidden_size=12,
            num_layers=2,
            pad_token_id=0,
            num_labels=2,
            classifier_scalar_mix=True,
            cell=cell,
        )
    ).eval()
    mix = model.scalar_mix
    assert isinstance(mix, ProjectedScalarMix)
    # Only the inner layer (12 wide) needs a projection to the top layer's 8; the embedding is 8 wide already.
    assert [type(projection).__name__ for projection in mix.projections] == ["Identity", "Linear", "Identity"]
    set_mix(mix.mix, [1.0, -0.5, 0.25], 0.6)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        layers = awd_layers(model, input_ids)
        recorded = model.read_document(input_ids)
        for got, want in zip(recorded, layers, strict=True):
            torch.testing.assert_close(got, want)
        projected = [layers[0], mix.projections[1](layers[1]), layers[2]]
        expected = by_hand(mix.mix.layer_weights, mix.mix.gamma, projected)
        torch.testing.assert_close(mix(recorded), expected)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        torch.testing.assert_close(logits, model.classifier(expected, attention_mask.bool()))


def test_a_new_mix_is_the_mean_of_the_layers(bert, task_dir):
    model = classifier(bert, task_dir).eval()
    assert torch.equal(model.scalar_mix.layer_weights, torch.zeros(3)) and model.scalar_mix.gamma.item() == 1.0
    input_ids, attention_mask = batch()
    with torch.no_grad():
        states = model.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        torch.testing.assert_close(model.scalar_mix(states.hidden_states), torch.stack(states.hidden_states).mean(0))


def test_gradients_reach_the_layer_weights_and_gamma(bert, awd_lstm, task_dir):
    input_ids, attention_mask = batch()
    for model in (classifier(bert, task_dir), classifier(awd_lstm, task_dir)):
        model.train()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 1])).loss.backward()
        mix = model.scalar_mix if isinstance(model.scalar_mix, ScalarMix) else model.scalar_mix.mix
        assert mix.layer_weights.grad.abs().min() > 0, type(model).__name__
        assert mix.gamma.grad.abs() > 0, type(model).__name__


def test_the_mix_belongs_to_the_head_group(bert, awd_lstm, task_dir):
    for model in (classifier(bert, task_dir), classifier(awd_lstm, task_dir)):
        head = {id(parameter) for parameter in layer_groups(model)[-1]}
        assert all(id(parameter) in head for parameter in model.scalar_mix.parameters())
        assert all(id(parameter) in head for parameter in model.classifier.parameters())
        assert len(layer_groups(model)) == 4  # embeddings, 2 layers, head (mix and classifier)


@pytest.mark.parametrize("backbone", ["bert", "awd_lstm"])
def test_save_and_reload_give_identical_predictions(backbone, request, task_dir, tmp_path):
    model = classifier(request.getfixturevalue(backbone), task_dir).eval()
    mix = model.scalar_mix if isinstance(model.scalar_mix, ScalarMix) else model.scalar_mix.mix
    set_mix(mix, [0.3, -0.2, 0.9], 1.4)  # not the values a fresh mix would start from
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved").eval()
    assert type(reloaded) is type(model)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        assert torch.equal(
            reloaded(input_ids=input_ids, attention_mask=attention_mask).logits,
            model(input_ids=input_ids, attention_mask=attention_mask).logits,
        )


@pytest.mark.parametrize("backbone", ["bert", "awd_lstm"])
def test_frozen_backbone_trains_only_the_mix_and_head_and_the_checkpoint_evaluates(
    backbone, request, task_dir, tmp_path
):
    """ELMo's setting in a recipe: unfreezing.schedule [1] keeps every group but the head (mix included) frozen."""
    pretrained = request.getfixturevalue(backbone)
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data.update(pooling="scalar_mix", unfreezing={"mode": "gradual", "schedule": [1]}, keep_best=False)
    data["training"].update(epochs=1, lr=2e-2)
    checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))

    saved = load_file(checkpoint / "model.safetensors")
    prefix, encoder = (
        ("encoder.", AutoModel.from_pretrained(pretrained))
        if backbone == "bert"
        else ("awd_lstm.", AWDLSTMForCausalLM.from_pretrained(pretrained).awd_lstm)
    )
    for name, tensor in encoder.state_dict().items():
        if not name.startswith("pooler."):
            assert torch.equal(saved[prefix + name], tensor), name  # frozen: bit for bit the pretrained weights
    mix = "scalar_mix." if backbone == "bert" else "scalar_mix.mix."
    assert not torch.equal(saved[mix + "layer_weights"], torch.zeros(3))  # the mix trained, and was saved
    assert saved[mix + "gamma"].item() != 1.0
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["scalar_mix" if backbone == "bert" else "classifier_scalar_mix"] is True

    eval_data = eval_recipe(task_dir, tmp_path / "eval", {"mixed": str(checkpoint)})
    result = CliRunner().invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", eval_data))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    run = json.loads((tmp_path / "run" / RESULT_FILE).read_text())
    assert report["results"]["mixed"]["accuracy"] == pytest.approx(run["last"]["dev_accuracy"])


def test_a_warm_start_adds_a_fresh_mix_or_leaves_it_behind(bert, task_dir, tmp_path):
    plain = classifier(bert, task_dir, pooling="mean")
    plain.save_pretrained(tmp_path / "mean")
    mixed = classifier(tmp_path / "mean", task_dir)
    assert mixed.config.scalar_mix and torch.equal(mixed.scalar_mix.layer_weights, torch.zeros(3))
    assert torch.equal(mixed.classifier.weight, plain.classifier.weight)  # same labels: the head is kept
    mixed.save_pretrained(tmp_path / "mixed")
    assert classifier(tmp_path / "mixed", task_dir, pooling="model").scalar_mix is not None  # the checkpoint's own
    assert classifier(tmp_path / "mixed", task_dir, pooling="mean").scalar_mix is None


def test_regularising_a_transformer_with_a_mix_is_one_line_exit_2(bert, task_dir, tmp_path):
    data = finetune_recipe(bert, task_dir, tmp_path / "run")
    data.update(pooling="scalar_mix")
    data["model"]["activation_regularization"] = 1.0
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    output = result.output.strip()
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert output.startswith("error: model.activation_regularization:") and "\n" not in output, output
    assert "pooling: model or scalar_mix" in output and not (tmp_path / "run").exists()
