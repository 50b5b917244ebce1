"""The AWD-LSTM's recurrent cells (model.cell: lstm, qrnn, rnn): the QRNN's fo-pooling against a plain loop, each
layer's DropConnect, the carried state, checkpoints, recipes, and tiny pretraining / fine-tuning runs per cell."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
from typer.testing import CliRunner

import finetune.models.awd_lstm_classifier  # noqa: F401  (registers the classifier with the Auto classes)
from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.models.awd_lstm import (
    AWDLSTMConfig,
    AWDLSTMForCausalLM,
    detach_hidden_state,
    hidden_state_from_names,
    named_hidden_state,
)
from finetune.models.backbones import layer_groups
from finetune.models.causal_lm import RecurrentNextTokenLM
from finetune.models.language_models import train_tokenizer
from finetune.models.recurrent_cells import QRNNLayer, WeightDropout, forget_mult
from finetune.recipes import TokenizerConfig, load_recipe
from finetune.run_dir import read_metrics
from tests.conftest import finetune_recipe, pretrain_recipe, write_yaml

CELLS = ("lstm", "qrnn", "rnn")
runner = CliRunner()


def tiny_config(cell: str, **overrides) -> AWDLSTMConfig:
    settings = dict(vocab_size=50, embedding_size=6, hidden_size=10, num_layers=3, cell=cell)
    settings.update(overrides)
    return AWDLSTMConfig(**settings)


def naive_forget_mult(forget: torch.Tensor, candidate: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """fo-pooling step by step, as the papers write it: c_t = f_t * c_{t-1} + g_t."""
    cells, previous = [], initial
    for step in range(forget.shape[0]):
        previous = forget[step] * previous + candidate[step]
        cells.append(previous)
    return torch.stack(cells)


# ---------------------------------------------------------------------------------------------
# The QRNN's recurrence and layer
# ---------------------------------------------------------------------------------------------


def test_forget_mult_matches_the_loop_and_its_gradient_is_exact():
    torch.manual_seed(0)
    shape = (5, 2, 3)  # time, batch, size
    forget = torch.rand(shape, dtype=torch.float64, requires_grad=True)
    candidate = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    initial = torch.randn(shape[1:], dtype=torch.float64, requires_grad=True)
    cells = forget_mult(forget, candidate, initial)
    assert torch.allclose(cells, naive_forget_mult(forget, candidate, initial), atol=1e-12)
    assert torch.autograd.gradcheck(forget_mult, (forget, candidate, initial))
    # The same gradients as autograd through the loop, for a loss that weighs every step differently.
    weights = torch.randn(shape, dtype=torch.float64)
    ours = torch.autograd.grad((forget_mult(forget, candidate, initial) * weights).sum(), (forget, candidate, initial))
    loop = torch.autograd.grad(
        (naive_forget_mult(forget, candidate, initial) * weights).sum(), (forget, candidate, initial)
    )
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(ours, loop))


def test_qrnn_layer_is_the_papers_recurrence_with_a_window_of_two():
    """Outputs against the equations written step by step: gates z, f, o from [x_t, x_{t-1}], fo-pooling."""
    torch.manual_seed(0)
    layer = QRNNLayer(4, 5, p=0.5, window=2).eval()
    inputs = torch.randn(2, 6, 4)
    outputs, (cell, previous_input) = layer(inputs)
    weight, bias = layer.weight_ih_raw, layer.bias_ih
    c = torch.zeros(2, 5)
    expected = []
    for step in range(6):
        before = inputs[:, step - 1] if step else torch.zeros(2, 4)
        z, f, o = F.linear(torch.cat([inputs[:, step], before], dim=1), weight, bias).chunk(3, dim=1)
        c = torch.sigmoid(f) * c + (1 - torch.sigmoid(f)) * torch.tanh(z)
        expected.append(torch.sigmoid(o) * c)
    assert torch.allclose(outputs, torch.stack(expected, dim=1), atol=1e-6)
    assert torch.allclose(cell[0], c, atol=1e-6) and torch.equal(previous_input[0], inputs[:, -1])
    assert cell.shape == (1, 2, 5) and previous_input.shape == (1, 2, 4)
    assert layer.state_names == ("cell", "previous_input") and QRNNLayer(4, 5, 0.0).state_names == ("cell",)


def test_qrnn_dropconnect_masks_the_gate_weights_in_training_only():
    torch.manual_seed(0)
    layer = QRNNLayer(4, 5, p=0.5, window=2)
    assert {name for name, _ in layer.named_parameters()} == {"weight_ih_raw", "bias_ih"}
    assert layer.weight_ih_raw.shape == (15, 8)
    inputs = torch.randn(2, 6, 4)
    plain = layer.eval()(inputs)[0]
    assert torch.equal(plain, layer(inputs)[0])
    layer.train()
    first, second = layer(inputs)[0], layer(inputs)[0]
    assert not torch.allclose(first, second) and not torch.allclose(first, plain)  # a fresh mask per call
    layer.p = 0.0  # the mask is the only randomness
    assert torch.allclose(layer(inputs)[0], plain, atol=1e-6)
    layer.p = 0.5
    layer(inputs)[0].sum().backward()
    assert layer.weight_ih_raw.grad.abs().sum() > 0 and layer.bias_ih.grad.abs().sum() > 0
    copy.deepcopy(layer)
    with pytest.raises(ValueError, match="window is 1 or 2"):
        QRNNLayer(4, 5, 0.0, window=3)


def test_rnn_layer_is_a_tanh_rnn_with_dropconnect_on_its_hidden_weights():
    torch.manual_seed(0)
    layer = WeightDropout(4, 5, p=0.5, cell="rnn")
    names = {name for name, _ in layer.named_parameters()}
    assert names == {"weight_hh_l0_raw", "rnn.weight_ih_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0"}
    reference = nn.RNN(4, 5, batch_first=True)  # tanh
    with torch.no_grad():
        reference.weight_hh_l0.copy_(layer.weight_hh_l0_raw)
        for name in ("weight_ih_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(reference, name).copy_(getattr(layer.rnn, name))
    inputs = torch.randn(2, 6, 4)
    outputs, (hidden,) = layer.eval()(inputs)
    expected, expected_hidden = reference(inputs)
    assert torch.allclose(outputs, expected, atol=1e-6) and torch.allclose(hidden, expected_hidden, atol=1e-6)
    layer.train()
    assert not torch.allclose(layer(inputs)[0], layer(inputs)[0])
    layer(inputs)[0].sum().backward()
    assert layer.weight_hh_l0_raw.grad.abs().sum() > 0
    assert layer.state_names == ("hidden",)


# ---------------------------------------------------------------------------------------------
# The language model with each cell
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", CELLS)
def test_reading_in_pieces_with_the_state_carried_is_reading_whole(cell):
    """Truncated BPTT and the classifier's chunked reading lose nothing, for every cell's state."""
    torch.manual_seed(0)
    model = AWDLSTMForCausalLM(tiny_config(cell)).eval()
    tokens = torch.randint(2, 50, (3, 9))
    whole = model(tokens)
    first = model(tokens[:, :4])
    second = model(tokens[:, 4:], hidden_state=detach_hidden_state(first.hidden_state))
    assert torch.allclose(torch.cat([first.logits, second.logits], dim=1), whole.logits, atol=1e-5)
    assert not torch.allclose(model(tokens[:, 4:]).logits, second.logits)  # the state mattered
    for layer, layer_state in zip(model.awd_lstm.layers, whole.hidden_state):
        assert len(layer_state) == len(layer.state_names)
        assert all(tensor.shape[:2] == (1, 3) for tensor in layer_state)


@pytest.mark.parametrize("cell", CELLS)
def test_detach_and_a_batch_of_another_size(cell):
    torch.manual_seed(0)
    model = AWDLSTMForCausalLM(tiny_config(cell)).train()
    tokens = torch.randint(2, 50, (3, 5))
    state = model(tokens).hidden_state
    assert all(tensor.grad_fn is not None for layer_state in state for tensor in layer_state)
    assert all(tensor.grad_fn is None for layer_state in detach_hidden_state(state) for tensor in layer_state)
    model.eval()
    assert torch.equal(model(tokens[:2], hidden_state=state).logits, model(tokens[:2]).logits)  # zeros instead


@pytest.mark.parametrize("cell", CELLS)
def test_save_and_load_each_cell_with_the_auto_class(cell, tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(cell))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["cell"] == cell
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as stored:
        names = {name for name in stored.keys() if name.startswith("awd_lstm.layers.0.")}  # noqa: SIM118 (safe_open is not iterable)
    expected = {
        "lstm": {"weight_hh_l0_raw", "lstm.weight_ih_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0"},
        "rnn": {"weight_hh_l0_raw", "rnn.weight_ih_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0"},
        "qrnn": {"weight_ih_raw", "bias_ih"},
    }[cell]
    assert names == {f"awd_lstm.layers.0.{name}" for name in expected}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.cell == cell
    tokens = torch.randint(2, 50, (2, 7))
    assert torch.equal(loaded(tokens).logits, model.eval()(tokens).logits)
    # One group per layer, whatever the cell, and every parameter in exactly one.
    groups = layer_groups(loaded)
    assert [set(map(id, group)) for group in groups[1:-1]] == [
        set(map(id, layer.parameters())) for layer in loaded.awd_lstm.layers
    ]
    assert sum(map(len, groups)) == len(list(loaded.parameters()))


def test_a_checkpoint_from_before_cells_loads_as_an_lstm(tmp_path):
    torch.manual_seed(0)
    model = AWDLSTMForCausalLM(tiny_config("lstm")).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["cell"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.cell == "lstm"
    tokens = torch.randint(2, 50, (2, 7))
    assert torch.equal(loaded(tokens).logits, model(tokens).logits)


def test_qrnn_initialisation_is_nn_linears():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qrnn"))
    bottom, above = model.awd_lstm.layers[0], model.awd_lstm.layers[1]
    assert (bottom.window, above.window) == (2, 1)  # fastai's AWD-QRNN
    for layer, fan_in in ((bottom, 2 * 6), (above, 10)):
        bound = 1 / math.sqrt(fan_in)
        assert 0.8 * bound < layer.weight_ih_raw.abs().max() <= bound


@pytest.mark.parametrize(
    "cell, names",
    [
        ("lstm", ["cell_0", "cell_1", "hidden_0", "hidden_1"]),  # the names checkpoints had before cells
        ("qrnn", ["cell_0", "cell_1", "previous_input_0"]),
        ("rnn", ["hidden_0", "hidden_1"]),
    ],
)
def test_carried_state_is_saved_by_name_and_restored(cell, names):
    torch.manual_seed(0)
    model = RecurrentNextTokenLM(AWDLSTMForCausalLM(tiny_config(cell, num_layers=2))).train()
    stream = torch.randint(2, 50, (2, 9))
    model(stream[:, :8], stream[:, 1:])
    saved = model.carried_state()
    assert sorted(saved) == names
    assert all(not tensor.requires_grad for tensor in saved.values())
    before = model.state
    model.state = None
    model.restore_carried_state({**saved, "running_sums": torch.zeros(3)})
    assert all(torch.equal(a, b) for old, new in zip(before, model.state) for a, b in zip(old, new))
    assert hidden_state_from_names(model.lstm_lm, {}) is None and named_hidden_state(model.lstm_lm, None) == {}


# ---------------------------------------------------------------------------------------------
# Recipes and runs
# ---------------------------------------------------------------------------------------------


def awd_lstm_recipe(corpus: Path, run_dir: Path, cell: str) -> dict:
    data = pretrain_recipe(corpus, run_dir)
    data["model"] = {"family": "awd_lstm", "embedding_size": 16, "hidden": 24, "layers": 2, "cell": cell}
    data["training"].update({"max_steps": 6, "log_every": 1})
    return data


def test_an_unknown_cell_is_one_line_naming_model_cell(tmp_path, corpus_file):
    path = write_yaml(tmp_path / "recipe.yaml", awd_lstm_recipe(corpus_file, tmp_path / "run", "gru"))
    result = runner.invoke(app, ["pretrain", str(path)])
    output = result.output.strip()
    assert result.exit_code == 2 and "Traceback" not in output, output
    assert output.startswith("error: ") and "\n" not in output and "model.cell" in output, output
    assert not (tmp_path / "run").exists()
    continued = awd_lstm_recipe(corpus_file, tmp_path / "run", "qrnn")
    continued["model"] = {"family": "awd_lstm", "checkpoint": str(tmp_path), "cell": "qrnn"}
    with pytest.raises(Exception, match=r"architecture comes from model.checkpoint; remove cell"):
        load_recipe(write_yaml(tmp_path / "continued.yaml", continued))


@pytest.mark.parametrize("cell", CELLS)
def test_tiny_pretraining_with_each_cell(cell, tmp_path, corpus_file):
    path = write_yaml(tmp_path / "recipe.yaml", awd_lstm_recipe(corpus_file, tmp_path / "run", cell))
    result = runner.invoke(app, ["pretrain", str(path)])
    assert result.exit_code == 0, result.output
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [record["loss"] for record in records if record["phase"] == "train"]
    assert len(train) == 6 and all(math.isfinite(loss) for loss in train)
    evaluation = [record for record in records if record["phase"] == "eval"][-1]
    assert math.isfinite(evaluation["validation_loss"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint")
    assert model.config.cell == cell and type(model.awd_lstm.layers[0]).__name__ == (
        "QRNNLayer" if cell == "qrnn" else "WeightDropout"
    )


def test_a_classifier_fine_tuned_from_a_qrnn_language_model(tmp_path, corpus_file, task_dir):
    lm = awd_lstm_recipe(corpus_file, tmp_path / "lm", "qrnn")
    assert runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "lm.yaml", lm))]).exit_code == 0
    classifier = finetune_recipe(tmp_path / "lm" / "checkpoint", task_dir, tmp_path / "classifier")
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "classifier.yaml", classifier))])
    assert result.exit_code == 0, result.output
    records = read_metrics(tmp_path / "classifier" / "metrics.jsonl")
    assert [r["trainable_groups"] for r in records if r["phase"] == "unfreeze"] == [1, 2]  # embedding, 2 layers, head
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "classifier" / "checkpoint").eval()
    assert model.config.cell == "qrnn"
    # BPT3C: reading a document in chunks of 3 tokens gives the logits of reading it whole.
    tokens = torch.randint(3, model.config.vocab_size, (2, 11))
    whole = model(tokens).logits
    model.config.classifier_bptt, model.config.classifier_max_len = 3, 3
    assert torch.allclose(model(tokens).logits, whole, atol=1e-5)


def test_an_interrupted_qrnn_run_resumes_exactly(tmp_path, corpus_file, monkeypatch):
    """The QRNN's carried state (cells, and the bottom layer's last input) survives a periodic checkpoint: the
    family test of `--resume` (bit-identical weights and metrics), run with cell qrnn."""
    from tests.stages import test_pretrain_families as families

    monkeypatch.setitem(families.MODELS, "awd_lstm", {**families.MODELS["awd_lstm"], "cell": "qrnn"})
    documents = read_documents([corpus_file])
    tokenizer = train_tokenizer(
        "awd_lstm", documents, TokenizerConfig(vocab_size=200, min_frequency=1, lowercase=False)
    )
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    families.test_resume_continues_exactly_where_the_interrupted_run_stopped(
        "awd_lstm", tmp_path, corpus_file, {"awd_lstm": tmp_path / "tokenizer"}, monkeypatch
    )
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "resumed" / "checkpoint").config.cell == "qrnn"
