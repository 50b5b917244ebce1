"""AWD-LSTM activation regularisation (AR/TAR), as fastai's RNNRegularizer: in the gradient only, never in the logs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from finetune.cli import app
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.causal_lm import RecurrentNextTokenLM
from finetune.recipes import AWDLSTMModelConfig, load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.pretrain import run_pretrain
from tests.conftest import REPO_ROOT, write_yaml
from tests.stages.test_pretrain_families import family_recipe

runner = CliRunner()
VOCABULARY = 30
QUICKSTART_CORPUS = REPO_ROOT / "data" / "quickstart" / "corpus"


def tiny_lstm_lm() -> AWDLSTMForCausalLM:
    """Two small layers with every dropout on, so that AR (after output dropout) and TAR (before it) differ."""
    torch.manual_seed(0)
    config = AWDLSTMConfig(
        vocab_size=VOCABULARY,
        embedding_size=8,
        hidden_size=12,
        num_layers=2,
        pad_token_id=1,
        output_dropout=0.3,
        hidden_dropout=0.2,
        input_dropout=0.2,
        embedding_dropout=0.1,
        weight_dropout=0.2,
    )
    return AWDLSTMForCausalLM(config)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    stream = torch.randint(2, VOCABULARY, (3, 8), generator=torch.Generator().manual_seed(1))
    return stream[:, :7], stream[:, 1:]


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None}


def wrapper_loss_and_gradients(alpha: float, beta: float, training: bool = True):
    """The wrapper's loss for one batch (dropout masks from seed 5) and the gradients its backward gives."""
    lstm_lm = tiny_lstm_lm()
    wrapper = RecurrentNextTokenLM(lstm_lm, alpha, beta).train(training)
    input_ids, labels = batch()
    torch.manual_seed(5)
    loss, count, correct = wrapper(input_ids, labels)
    loss.backward()
    return loss.detach(), count, correct, gradients(lstm_lm)


def hand_loss_and_gradients(alpha: float, beta: float, training: bool = True):
    """Cross-entropy + alpha x AR + beta x TAR written out from the model's parts, with the same dropout masks."""
    lstm_lm = tiny_lstm_lm().train(training)
    input_ids, labels = batch()
    torch.manual_seed(5)  # the same draws, in the same order as AWDLSTMForCausalLM.forward
    raw = lstm_lm.awd_lstm(input_ids).last_hidden_state  # the top layer's output, (batch, time, features)
    dropped = lstm_lm.output_dropout(raw)  # what the decoder reads
    cross_entropy = F.cross_entropy(lstm_lm.decoder(dropped).reshape(-1, VOCABULARY), labels.reshape(-1))
    activation = dropped.pow(2).mean()
    temporal = (raw[:, 1:] - raw[:, :-1]).pow(2).mean()
    (cross_entropy + alpha * activation + beta * temporal).backward()
    return cross_entropy.detach(), activation.detach(), temporal.detach(), gradients(lstm_lm)


def assert_same_gradients(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    for name in first:
        assert torch.allclose(first[name], second[name], atol=1e-6, rtol=1e-5), name


def test_the_gradient_is_that_of_cross_entropy_plus_ar_and_tar_and_the_value_is_the_cross_entropy():
    loss, count, correct, regularised = wrapper_loss_and_gradients(alpha=2.0, beta=1.0)
    cross_entropy, activation, temporal, by_hand = hand_loss_and_gradients(alpha=2.0, beta=1.0)
    assert activation > 0 and temporal > 0
    assert_same_gradients(regularised, by_hand)
    # The penalties change the gradient (so the check above is not the cross-entropy's alone) ...
    _, _, _, plain = hand_loss_and_gradients(alpha=0.0, beta=0.0)
    assert any(not torch.allclose(regularised[name], plain[name], atol=1e-6) for name in plain)
    # ... but not the value, which the loop logs: the plain cross-entropy, as fastai's logged loss.
    assert torch.allclose(loss, cross_entropy, atol=1e-6)
    assert torch.equal(loss, wrapper_loss_and_gradients(alpha=0.0, beta=0.0)[0])
    assert count == 21 and correct is None


@pytest.mark.parametrize("alpha, beta", [(3.0, 0.0), (0.0, 0.5)])
def test_each_term_alone_is_its_hand_computation(alpha, beta):
    assert_same_gradients(wrapper_loss_and_gradients(alpha, beta)[3], hand_loss_and_gradients(alpha, beta)[3])


def test_zero_weights_train_on_the_plain_cross_entropy():
    loss, _, _, gradient = wrapper_loss_and_gradients(alpha=0.0, beta=0.0)
    cross_entropy, _, _, plain = hand_loss_and_gradients(alpha=0.0, beta=0.0)
    assert torch.allclose(loss, cross_entropy, atol=1e-6)
    assert_same_gradients(gradient, plain)


def test_no_penalty_in_evaluation():
    loss, _, correct, gradient = wrapper_loss_and_gradients(alpha=2.0, beta=1.0, training=False)
    cross_entropy, _, _, plain = hand_loss_and_gradients(alpha=0.0, beta=0.0, training=False)
    assert torch.allclose(loss, cross_entropy, atol=1e-6) and correct is not None
    assert_same_gradients(gradient, plain)


def test_a_single_time_step_has_no_temporal_term():
    """TAR needs two steps; a one-token chunk (a corpus tail) gets AR alone, not the nan of an empty mean."""
    wrapper = RecurrentNextTokenLM(tiny_lstm_lm(), 0.0, 1.0).train()
    input_ids, labels = batch()
    loss, _, _ = wrapper(input_ids[:, :1], labels[:, :1])
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(grad).all() for grad in gradients(wrapper).values())


def test_recipe_keys_default_to_fastai_and_are_allowed_with_a_checkpoint():
    config = AWDLSTMModelConfig(family="awd_lstm")
    assert (config.activation_regularization, config.temporal_activation_regularization) == (2.0, 1.0)
    continued = AWDLSTMModelConfig(
        family="awd_lstm",
        checkpoint="runs/lm/checkpoint",
        activation_regularization=0,
        temporal_activation_regularization=0.5,
    )
    assert continued.activation_regularization == 0


def test_the_logged_training_loss_is_the_cross_entropy(tmp_path, corpus_file, tokenizers):
    """Same seed, with and without a large penalty: step 1 (before any update) logs the same loss; later steps
    differ because the gradients did; validation never sees the penalty either."""
    records = {}
    for alpha in (0.0, 50.0):
        data = family_recipe(
            "awd_lstm",
            corpus_file,
            tmp_path / f"alpha-{alpha}",
            tokenizers["awd_lstm"],
            checkpoint_every=None,
            eval_every=None,
        )
        data["model"].update(activation_regularization=alpha, temporal_activation_regularization=alpha)
        data["training"].update(max_steps=3, epochs=1)
        run_pretrain(load_recipe(write_yaml(tmp_path / f"alpha-{alpha}.yaml", data)))
        records[alpha] = [
            record
            for record in read_metrics(tmp_path / f"alpha-{alpha}" / "metrics.jsonl")
            if record["phase"] == "train"
        ]
    plain, regularised = records[0.0], records[50.0]
    assert [record["step"] for record in plain] == [1, 2, 3]
    assert regularised[0]["loss"] == plain[0]["loss"]
    assert regularised[-1]["loss"] != plain[-1]["loss"]
    assert regularised[0].keys() == plain[0].keys()  # the records read as before: no penalty key


def test_pretrain_and_continue_an_awd_lstm_on_the_quickstart_corpus_with_the_keys(tmp_path):
    """ULMFiT's stages 1 and 2 through the CLI, regularised in both (stage 2 continues the stage-1 checkpoint)."""
    stage_1 = {
        "stage": "pretrain",
        "run_dir": str(tmp_path / "lm"),
        "seed": 0,
        "model": {
            "family": "awd_lstm",
            "embedding_size": 16,
            "hidden": 24,
            "layers": 2,
            "activation_regularization": 2.0,
            "temporal_activation_regularization": 1.0,
        },
        "tokenizer": {"vocab_size": 300},
        # A small validation split: evaluating all of valid.txt would take most of the test's time.
        "corpus": {
            "train_files": [str(QUICKSTART_CORPUS / "train.txt")],
            "validation_fraction": 0.01,
            "block_size": 16,
            "cache_dir": None,
        },
        "training": {"epochs": 1, "max_steps": 4, "batch_size": 8, "lr": 3e-3, "log_every": 2, "device": "cpu"},
    }
    stage_2 = {
        **stage_1,
        "run_dir": str(tmp_path / "lm-2"),
        "tokenizer": {},
        "model": {
            "family": "awd_lstm",
            "checkpoint": str(tmp_path / "lm" / "checkpoint"),
            "activation_regularization": 1.0,
            "temporal_activation_regularization": 2.0,
        },
    }
    for name, data in (("stage-1", stage_1), ("stage-2", stage_2)):
        result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / f"{name}.yaml", data))])
        assert result.exit_code == 0, result.output
        run_dir = Path(data["run_dir"])
        train = [record for record in read_metrics(run_dir / "metrics.jsonl") if record["phase"] == "train"]
        assert [record["step"] for record in train] == [2, 4] and all(record["loss"] > 0 for record in train)
        assert (run_dir / "checkpoint" / "model.safetensors").is_file()
