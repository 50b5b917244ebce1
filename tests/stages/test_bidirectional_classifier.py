"""ELMo's biLM on the AWD-LSTM: a forward and a backward language model read side by side in one classifier.

`model.backward_checkpoint` puts the backward LM's encoder beside the forward one; the head pools [forward; backward]
at every position (with `pooling: scalar_mix`, ELMo's mix of both directions' layers). Checked against the two
encoders run by hand, through loading (vocabularies mapped, refusals), the data path and a whole `finetune` run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.reverse import REVERSE_CONFIG_KEY
from finetune.data.task_files import read_task_split
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.errors import UserError
from finetune.kinds.classification import fine_tuning as finetune_stage
from finetune.kinds.classifier_keys import classifier_keys
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.awd_lstm_classifier import (
    AWDLSTMForSequenceClassification,
    concat_pool,
    layer_widths,
    reversed_rows,
)
from finetune.models.backbones import layer_groups
from finetune.models.heads import BackwardEncoderError, load_classifier
from finetune.recipes import BackboneConfig, task_config
from finetune.tasks.specs import task_spec
from tests.conftest import custom_task_section, finetune_recipe, write_corpus, write_yaml

runner = CliRunner()
SIZES = {"embedding_size": 8, "hidden_size": 12, "num_layers": 2}


def save_language_model(folder: Path, tokenizer, seed: int, backwards: bool, **sizes) -> Path:
    """A tiny random AWD-LSTM language model with `tokenizer`; `backwards` marks it as corpus.reverse's checkpoint."""
    torch.manual_seed(seed)
    config = AWDLSTMConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **(SIZES | sizes))
    if backwards:
        setattr(config, REVERSE_CONFIG_KEY, True)
    AWDLSTMForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def language_models(tmp_path_factory) -> dict[str, Path]:
    """A forward LM, a backward LM with the same tokenizer, and one whose tokenizer was trained on other text."""
    folder = tmp_path_factory.mktemp("bilm")
    tokenizer = train_byte_level_bpe(read_documents([write_corpus(folder / "corpus")]), 300, min_frequency=1)
    other = train_byte_level_bpe(read_documents([write_corpus(folder / "other", lines=60)]), 280, min_frequency=1)
    return {
        "forward": save_language_model(folder / "forward", tokenizer, 0, backwards=False),
        "backward": save_language_model(folder / "backward", tokenizer, 1, backwards=True),
        "other_vocabulary": save_language_model(folder / "other-vocabulary", other, 2, backwards=True),
        "wider": save_language_model(folder / "wider", tokenizer, 3, backwards=True, hidden_size=16),
        "forward_as_backward": save_language_model(folder / "forward-2", tokenizer, 4, backwards=False),
    }


def bidirectional_classifier(
    language_models: dict[str, Path], task: Path, backward: str = "backward", pooling: str = "model"
):
    spec = task_spec(task_config(**custom_task_section(task)))
    backbone = BackboneConfig(
        checkpoint=str(language_models["forward"]), backward_checkpoint=str(language_models[backward])
    )
    return load_classifier(backbone, spec, None, pooling)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two right-padded rows (pad 1, the byte-level BPE's) and their mask."""
    input_ids = torch.tensor([[5, 6, 7, 8, 1, 1], [9, 10, 11, 12, 13, 14]])
    return input_ids, (input_ids != 1).long()


def test_reversed_rows_turn_the_real_tokens_round_and_leave_the_padding():
    input_ids, mask = batch()
    assert reversed_rows(input_ids, mask.bool()).tolist() == [[8, 7, 6, 5, 1, 1], [14, 13, 12, 11, 10, 9]]


def test_the_head_pools_both_encoders_each_reading_its_own_direction(language_models, task_dir):
    model = bidirectional_classifier(language_models, task_dir).eval()
    assert model.config.classifier_bidirectional is True
    input_ids, mask = batch()
    backward_ids = reversed_rows(input_ids, mask.bool())
    with torch.no_grad():
        forward = model.awd_lstm(input_ids).last_hidden_state
        backward = model.awd_lstm_backward(backward_ids).last_hidden_state
        expected = model.classifier(torch.cat([forward, backward], dim=-1), mask.bool())
        logits = model(input_ids=input_ids, attention_mask=mask).logits
        given = model(input_ids=input_ids, attention_mask=mask, backward_input_ids=backward_ids).logits
        # "last" of the backward half is its state after the whole text: the first token's, read last.
        pooled = concat_pool(torch.cat([forward, backward], dim=-1), mask.bool())
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(given, logits)
    torch.testing.assert_close(pooled[0, 8:16], backward[0, 3])
    # The backward half matters: other backward ids change the logits.
    with torch.no_grad():
        other = model(input_ids=input_ids, attention_mask=mask, backward_input_ids=input_ids).logits
    assert not torch.allclose(other, logits)


def test_the_scalar_mix_mixes_both_directions_layers_each_half_projected_on_its_own(language_models, task_dir):
    model = bidirectional_classifier(language_models, task_dir, pooling="scalar_mix").eval()
    mix = model.scalar_mix
    with torch.no_grad():
        mix.mix.layer_weights.copy_(torch.tensor([0.3, -1.0, 0.5]))
        mix.mix.gamma.fill_(1.7)
    input_ids, mask = batch()
    backward_ids = reversed_rows(input_ids, mask.bool())

    def layers(encoder, ids):
        outputs = [encoder.embedding(ids)]
        for layer in encoder.layers:
            outputs.append(layer(outputs[-1])[0])
        return outputs

    with torch.no_grad():
        forward, backward = layers(model.awd_lstm, input_ids), layers(model.awd_lstm_backward, backward_ids)
        shares = torch.softmax(torch.tensor([0.3, -1.0, 0.5]), dim=0)
        halves = [
            torch.cat([project(f), project_backward(b)], dim=-1)
            for project, project_backward, f, b in zip(mix.projections, mix.backward_projections, forward, backward)
        ]
        expected = model.classifier(1.7 * sum(share * half for share, half in zip(shares, halves)), mask.bool())
        logits = model(input_ids=input_ids, attention_mask=mask).logits
    torch.testing.assert_close(logits, expected)
    # The inner layer of each direction has its own projection (12 -> 8); the others fit as they are.
    assert [type(projection).__name__ for projection in mix.backward_projections] == ["Identity", "Linear", "Identity"]
    assert mix.backward_projections[1].weight.shape == (8, 12)
    assert layer_widths(model.config) == [8, 12, 8]


def test_both_encoders_load_their_language_models_and_share_the_layer_groups(language_models, task_dir):
    model = bidirectional_classifier(language_models, task_dir)
    forward = load_file(language_models["forward"] / "model.safetensors")
    backward = load_file(language_models["backward"] / "model.safetensors")
    for name, tensor in model.awd_lstm.state_dict().items():
        torch.testing.assert_close(tensor, forward[f"awd_lstm.{name}"])
    for name, tensor in model.awd_lstm_backward.state_dict().items():
        torch.testing.assert_close(tensor, backward[f"awd_lstm.{name}"])
    assert not torch.equal(model.awd_lstm.embedding.weight, model.awd_lstm_backward.embedding.weight)
    groups = layer_groups(model)
    assert len(groups) == 4  # embedding, 2 layers, head: both directions in each encoder group
    embedding = {id(parameter) for parameter in groups[0]}
    assert {id(model.awd_lstm.embedding.weight), id(model.awd_lstm_backward.embedding.weight)} <= embedding
    top = {id(parameter) for parameter in groups[2]}
    assert all(id(parameter) in top for parameter in model.awd_lstm_backward.layers[1].parameters())
    assert all(id(parameter) in top for parameter in model.awd_lstm.layers[1].parameters())


def test_a_backward_vocabulary_is_mapped_onto_the_forward_tokenizer(language_models, task_dir):
    model = bidirectional_classifier(language_models, task_dir, backward="other_vocabulary")
    forward_vocab = AutoTokenizer.from_pretrained(language_models["forward"]).get_vocab()
    backward_vocab = AutoTokenizer.from_pretrained(language_models["other_vocabulary"]).get_vocab()
    stored = load_file(language_models["other_vocabulary"] / "model.safetensors")["awd_lstm.embedding.weight"]
    embedding = model.awd_lstm_backward.embedding.weight
    shared = forward_vocab.keys() & backward_vocab.keys()
    only_forward = forward_vocab.keys() - backward_vocab.keys()
    assert shared and only_forward and forward_vocab != backward_vocab  # both cases are exercised
    assert any(forward_vocab[token] != backward_vocab[token] for token in shared)  # ids really move
    for token in shared:
        torch.testing.assert_close(embedding[forward_vocab[token]], stored[backward_vocab[token]])
    for token in only_forward:
        torch.testing.assert_close(embedding[forward_vocab[token]], stored.mean(dim=0))
    assert embedding.shape[0] == len(forward_vocab)


@pytest.mark.parametrize(
    "backward, message", [("forward_as_backward", "corpus.reverse: true"), ("wider", "hidden_size 16")]
)
def test_a_backward_checkpoint_that_does_not_fit_is_refused(language_models, task_dir, backward, message):
    with pytest.raises(UserError, match=message) as error, classifier_keys():  # as the stages name the refusal
        bidirectional_classifier(language_models, task_dir, backward=backward)
    assert str(error.value).startswith("model.backward_checkpoint:")
    assert isinstance(error.value.__cause__, BackwardEncoderError)


def test_a_backward_model_given_as_the_forward_one_is_refused(language_models, task_dir):
    spec = task_spec(task_config(**custom_task_section(task_dir)))
    backbone = BackboneConfig(
        checkpoint=str(language_models["backward"]), backward_checkpoint=str(language_models["backward"])
    )
    with pytest.raises(UserError, match="reads text backwards; give the forward"):
        load_classifier(backbone, spec, None)


def test_a_finetune_run_feeds_both_directions_and_saves_one_loadable_classifier(
    language_models, task_dir, tmp_path, monkeypatch
):
    data = finetune_recipe(language_models["forward"], task_dir, tmp_path / "run")
    data["model"]["backward_checkpoint"] = str(language_models["backward"])
    data["unfreezing"] = {"mode": "gradual", "every_fraction": 0.25}
    fed = []
    original = finetune_stage.load_classifier

    def recording(*arguments, **keywords):
        model = original(*arguments, **keywords)
        model.register_forward_pre_hook(
            lambda module, args, kwargs: fed.append(
                (kwargs["input_ids"].clone(), kwargs["backward_input_ids"].clone(), kwargs["attention_mask"].clone())
            ),
            with_kwargs=True,
        )
        return model

    monkeypatch.setattr(finetune_stage, "load_classifier", recording)
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    assert fed
    for input_ids, backward_ids, mask in fed:  # single texts: each row's real tokens turned round, padding kept
        assert torch.equal(backward_ids, reversed_rows(input_ids, mask.bool()))
        assert not torch.equal(backward_ids, input_ids)
    checkpoint = tmp_path / "run" / "checkpoint"
    assert json.loads((checkpoint / "config.json").read_text())["classifier_bidirectional"] is True
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
    assert isinstance(model, AWDLSTMForSequenceClassification) and model.awd_lstm_backward is not None
    stored = load_file(checkpoint / "model.safetensors")
    torch.testing.assert_close(model.awd_lstm_backward.embedding.weight, stored["awd_lstm_backward.embedding.weight"])
    # The backward encoder trained (its layer groups thawed): its bottom layer left the backward language model's.
    started = load_file(language_models["backward"] / "model.safetensors")["awd_lstm.layers.0.lstm.weight_ih_l0"]
    assert not torch.allclose(stored["awd_lstm_backward.layers.0.lstm.weight_ih_l0"], started)

    # `finetune predict` and `finetune eval` read it both ways, as the model does by itself (single texts): one text
    # at a time, no padding.
    spec = task_spec(task_config(**custom_task_section(task_dir)))
    examples = read_task_split(spec, task_dir, "dev")
    texts = [text for text, *_ in examples.texts]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        by_hand = torch.cat(
            [
                torch.softmax(
                    model.eval()(
                        input_ids=torch.tensor([tokenizer(text, truncation=True, max_length=16)["input_ids"]])
                    ).logits,
                    dim=-1,
                )
                for text in texts
            ]
        )
    predicted = finetune.predict(str(checkpoint), texts)
    torch.testing.assert_close(
        torch.tensor([[row["probabilities"][label] for label in spec.labels] for row in predicted]),
        by_hand,
        atol=1e-5,
        rtol=1e-4,
    )
    evaluation = {
        "stage": "eval",
        "run_dir": str(tmp_path / "eval"),
        "task": custom_task_section(task_dir),
        "split": "dev",
        "models": {"bilm": str(checkpoint)},
        "batch_size": 16,
        "device": "cpu",
    }
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", evaluation))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    accuracy = (by_hand.argmax(dim=1).numpy() == examples.labels).mean()
    assert report["results"]["bilm"]["accuracy"] == pytest.approx(accuracy)


def test_the_cli_refuses_a_backward_checkpoint_on_a_transformer(tmp_path, task_dir, language_models):
    from tests.conftest import save_tiny_masked_lm

    bert = save_tiny_masked_lm(tmp_path / "bert")
    data = finetune_recipe(bert, task_dir, tmp_path / "run")
    data["model"]["backward_checkpoint"] = str(language_models["backward"])
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    output = result.output.strip()
    assert result.exit_code == 2 and output.startswith("error: model.backward_checkpoint:") and "\n" not in output
    assert "only AWD-LSTM classifiers" in output and not (tmp_path / "run").exists()


def test_the_profile_counts_the_backward_encoder(language_models, task_dir):
    from transformers import AutoConfig

    from finetune.models.heads import classifier_skeleton

    spec = task_spec(task_config(**custom_task_section(task_dir)))
    backbone = BackboneConfig(
        checkpoint=str(language_models["forward"]), backward_checkpoint=str(language_models["backward"])
    )
    stored = AutoConfig.from_pretrained(language_models["forward"])
    for pooling in ("model", "scalar_mix"):
        skeleton = classifier_skeleton(backbone, stored, spec, pooling)
        loaded = bidirectional_classifier(language_models, task_dir, pooling=pooling)
        assert skeleton.awd_lstm_backward is not None
        assert sum(p.numel() for p in skeleton.parameters()) == sum(p.numel() for p in loaded.parameters())


def test_the_load_report_does_not_call_the_backward_weights_missing(language_models, task_dir, caplog):
    """transformers reports the weights a checkpoint lacks as newly initialised; the backward encoder's are copied in
    right after, so the report must not list them (it did: every awd_lstm_backward.* as MISSING)."""
    import logging

    with caplog.at_level(logging.INFO, logger="transformers.modeling_utils"):
        model = bidirectional_classifier(language_models, task_dir)
    reported = "\n".join(record.getMessage() for record in caplog.records)
    assert "awd_lstm_backward" not in reported
    backward = load_file(language_models["backward"] / "model.safetensors")
    torch.testing.assert_close(model.awd_lstm_backward.embedding.weight, backward["awd_lstm.embedding.weight"])
    from finetune.models.awd_lstm_classifier import AWDLSTMForSequenceClassification

    assert "awd_lstm_backward" not in str(AWDLSTMForSequenceClassification._keys_to_ignore_on_load_missing)
