"""AWD-LSTM: dropout modules, the Hugging Face model classes, layer groups and vocabulary remapping."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM

from finetune.models.awd_lstm import (
    AWDLSTMConfig,
    AWDLSTMForCausalLM,
    AWDLSTMModel,
    EmbeddingDropout,
    RNNDropout,
    WeightDropout,
    detach_hidden_state,
    remap_vocabulary_rows,
    with_new_vocabulary,
)
from finetune.models.backbones import layer_groups


def tiny_config(**overrides) -> AWDLSTMConfig:
    settings = dict(vocab_size=50, embedding_size=16, hidden_size=24, num_layers=3)
    settings.update(overrides)
    return AWDLSTMConfig(**settings)


@pytest.fixture
def language_model() -> AWDLSTMForCausalLM:
    torch.manual_seed(0)
    return AWDLSTMForCausalLM(tiny_config())


@pytest.fixture
def tokens() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(2, 50, (3, 8))


# ---------------------------------------------------------------------------------------------
# Dropout modules
# ---------------------------------------------------------------------------------------------


def test_rnn_dropout_shares_one_mask_over_time():
    torch.manual_seed(0)
    dropout = RNNDropout(0.5)
    inputs = torch.ones(4, 10, 32)
    dropped = dropout(inputs)
    assert set(dropped.unique().tolist()) == {0.0, 2.0}  # dropped, or kept and scaled by 1/(1-p)
    assert torch.equal(dropped, dropped[:, :1].expand_as(dropped))  # every step repeats step 0's mask
    assert not torch.equal(dropped[0], dropped[1])  # but each sequence has its own
    dropout.eval()
    assert dropout(inputs) is inputs
    assert RNNDropout(0.0)(inputs) is inputs


def test_embedding_dropout_zeroes_whole_words_and_scales_the_rest():
    torch.manual_seed(0)
    weight = torch.randn(50, 8)
    dropout = EmbeddingDropout(0.5)
    dropped = dropout(weight)
    zero_rows = (dropped == 0).all(dim=1)
    assert 0 < zero_rows.sum() < 50
    assert torch.allclose(dropped[~zero_rows], weight[~zero_rows] * 2)
    token_ids = torch.arange(50).repeat(3, 2)  # every word occurs several times in the batch
    vectors = F.embedding(token_ids, dropped)
    assert torch.equal((vectors == 0).all(dim=-1), zero_rows[token_ids])
    dropout.eval()
    assert dropout(weight) is weight


def test_weight_dropout_masks_the_raw_hidden_weight_in_training_only():
    torch.manual_seed(0)
    layer = WeightDropout(16, 24, p=0.5)
    names = {name for name, _ in layer.named_parameters()}
    assert names == {"weight_hh_l0_raw", "lstm.weight_ih_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0"}
    reference = nn.LSTM(16, 24, batch_first=True)
    with torch.no_grad():
        reference.weight_hh_l0.copy_(layer.weight_hh_l0_raw)
        for name in ("weight_ih_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(reference, name).copy_(getattr(layer.lstm, name))
    inputs = torch.randn(2, 5, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning on any call
        layer.eval()
        assert torch.allclose(layer(inputs)[0], reference(inputs)[0], atol=1e-6)
        layer.train()
        first, second = layer(inputs)[0], layer(inputs)[0]
        assert not torch.allclose(first, second)  # a fresh DropConnect mask per call
        layer.p = 0.0  # the mask is the only randomness: without it, training output is the plain LSTM's
        assert torch.allclose(layer(inputs)[0], reference(inputs)[0], atol=1e-6)
    layer.p = 0.5
    layer(inputs)[0].sum().backward()
    assert layer.weight_hh_l0_raw.grad is not None and layer.weight_hh_l0_raw.grad.abs().sum() > 0
    copy.deepcopy(layer)  # no masked non-leaf tensor is left behind in the module


# ---------------------------------------------------------------------------------------------
# The language model
# ---------------------------------------------------------------------------------------------


def test_eval_is_deterministic_and_training_is_not(language_model, tokens):
    language_model.eval()
    assert torch.equal(language_model(tokens).logits, language_model(tokens).logits)
    language_model.train()
    assert not torch.allclose(language_model(tokens).logits, language_model(tokens).logits)


def test_shapes_and_carried_hidden_state(language_model, tokens):
    language_model.eval()
    whole = language_model(tokens)
    assert whole.logits.shape == (3, 8, 50)
    sizes = [tuple(hidden.shape) for hidden, cell in whole.hidden_state]
    assert sizes == [(1, 3, 24), (1, 3, 24), (1, 3, 16)]
    first = language_model(tokens[:, :5])
    second = language_model(tokens[:, 5:], hidden_state=detach_hidden_state(first.hidden_state))
    assert torch.allclose(torch.cat([first.logits, second.logits], dim=1), whole.logits, atol=1e-5)
    assert not torch.allclose(language_model(tokens[:, 5:]).logits, second.logits)  # the state mattered


def test_detach_and_batch_size_change(language_model, tokens):
    language_model.train()
    state = language_model(tokens).hidden_state
    assert state[0][0].grad_fn is not None
    assert all(hidden.grad_fn is None and cell.grad_fn is None for hidden, cell in detach_hidden_state(state))
    language_model.eval()
    smaller = tokens[:2]
    assert torch.equal(language_model(smaller, hidden_state=state).logits, language_model(smaller).logits)


def test_several_chunks_then_one_backward(language_model, tokens):
    """ULMFiT's classifier: the encoder reads a document in chunks, carrying the state, before one backward."""
    language_model.train()
    first = language_model(tokens[:, :4])
    second = language_model(tokens[:, 4:], hidden_state=first.hidden_state)
    (first.logits.sum() + second.logits.sum()).backward()
    assert language_model.awd_lstm.layers[0].weight_hh_l0_raw.grad.abs().sum() > 0


def test_loss_is_the_shifted_cross_entropy(language_model, tokens):
    language_model.eval()
    labels = tokens.clone()
    labels[0, 3] = -100
    output = language_model(tokens, labels=labels)
    expected = F.cross_entropy(output.logits[:, :-1].reshape(-1, 50), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(output.loss, expected, atol=1e-6)
    aligned = F.pad(labels[:, 1:], (0, 1), value=-100)  # truncated BPTT passes next-token targets as they are
    assert torch.allclose(language_model(tokens, shift_labels=aligned).loss, expected, atol=1e-6)


def test_save_and_load_with_the_auto_classes(language_model, tokens, tmp_path):
    assert language_model.decoder.weight is language_model.awd_lstm.embedding.weight
    language_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "awd_lstm" and config["weight_dropout"] == 0.2
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as stored:
        names = set(stored.keys())
    assert "awd_lstm.layers.0.weight_hh_l0_raw" in names and "decoder.bias" in names
    assert "decoder.weight" not in names  # tied: stored once, as the embedding

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, AWDLSTMForCausalLM)
    assert loaded.decoder.weight is loaded.awd_lstm.embedding.weight
    language_model.eval()
    loaded.eval()
    assert torch.equal(loaded(tokens).logits, language_model(tokens).logits)

    encoder = AutoModel.from_pretrained(tmp_path)
    assert isinstance(encoder, AWDLSTMModel)
    encoder.eval()
    expected = language_model.awd_lstm(tokens).last_hidden_state
    assert torch.equal(encoder(tokens).last_hidden_state, expected)


def test_untied_decoder_is_saved_and_loaded(tokens, tmp_path):
    torch.manual_seed(0)
    model = AWDLSTMForCausalLM(tiny_config(tie_word_embeddings=False))
    assert model.decoder.weight is not model.awd_lstm.embedding.weight
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.decoder.weight, model.decoder.weight)
    assert torch.equal(loaded(tokens).logits, model.eval()(tokens).logits)


def test_from_config_initialises_like_awd_lstm():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config())
    embedding = model.awd_lstm.embedding.weight
    assert embedding.abs().max() <= 0.1 and embedding.abs().max() > 0.09  # uniform in [-0.1, 0.1]
    assert torch.equal(embedding[1], torch.zeros(16))  # the padding row
    assert torch.equal(model.decoder.bias, torch.zeros(50))
    top = model.awd_lstm.layers[2]
    bound = 1 / 16**0.5
    assert 0.9 * bound < top.weight_hh_l0_raw.abs().max() <= bound


# ---------------------------------------------------------------------------------------------
# Layer groups and vocabulary remapping
# ---------------------------------------------------------------------------------------------


def test_layer_groups_embedding_each_layer_then_head(language_model):
    groups = layer_groups(language_model)
    assert len(groups) == 3 + 2
    assert groups[0] == [language_model.awd_lstm.embedding.weight]
    assert groups[3][0] is language_model.awd_lstm.layers[2].weight_hh_l0_raw
    assert groups[-1] == [language_model.decoder.bias]
    flat = [id(parameter) for group in groups for parameter in group]
    assert len(flat) == len(set(flat)) == len(list(language_model.parameters()))
    encoder_groups = layer_groups(AWDLSTMModel(tiny_config()))
    assert len(encoder_groups) == 3 + 2 and encoder_groups[-1] == []


def test_language_model_groups_put_the_tied_embedding_on_top(language_model):
    """Language-model training (ULMFiT stage 2) steps its discriminative LRs down from the embedding+decoder, as
    fastai's awd_lstm_lm_split: the new vocabulary's rows must learn at the full LR, not at the bottom group's."""
    from finetune.models.language_models import language_model_layer_groups
    from finetune.training.optim import discriminative_lrs

    groups = language_model_layer_groups("awd_lstm", language_model)
    layers = language_model.awd_lstm.layers
    assert [set(map(id, group)) for group in groups[:-1]] == [set(map(id, layer.parameters())) for layer in layers]
    top = set(map(id, groups[-1]))
    assert top == {id(language_model.awd_lstm.embedding.weight), id(language_model.decoder.bias)}
    assert language_model.decoder.weight is language_model.awd_lstm.embedding.weight  # tied: in the top group too
    assert sum(len(group) for group in groups) == len(list(language_model.parameters()))
    lrs = discriminative_lrs(len(groups), 4e-3, 2.6)
    assert lrs[-1] == 4e-3 and lrs[0] < lrs[-1]  # the embedding gets the top LR, the first LSTM layer the lowest
    # The classifier keeps the embedding at the bottom (fastai's awd_lstm_clas_split): tested above via layer_groups.
    assert layer_groups(language_model)[0] == [language_model.awd_lstm.embedding.weight]


def test_remap_vocabulary_rows_keeps_known_rows_and_averages_new_ones():
    weight = torch.arange(12.0).reshape(4, 3)
    old_vocab = {"a": 0, "b": 1, "c": 2, "d": 3}
    new_vocab = {"c": 0, "new": 1, "a": 2}
    remapped = remap_vocabulary_rows(weight, old_vocab, new_vocab)
    assert torch.equal(remapped, torch.stack([weight[2], weight.mean(dim=0), weight[0]]))
    bias = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert torch.equal(remap_vocabulary_rows(bias, old_vocab, new_vocab), torch.tensor([3.0, 3.0, 1.0]))


def test_with_new_vocabulary_keeps_rows_and_the_tie(language_model):
    old_vocab = {f"w{index}": index for index in range(50)}
    new_vocab = {"w1": 0, "w7": 1, "fresh": 2, "w0": 3, "other": 4}
    old_embedding = language_model.awd_lstm.embedding.weight.detach().clone()
    old_bias = language_model.decoder.bias.detach().clone()
    with_new_vocabulary(language_model, old_vocab, new_vocab)
    embedding = language_model.awd_lstm.embedding.weight
    assert embedding.shape == (5, 16) and language_model.config.vocab_size == 5
    assert torch.equal(embedding[1], old_embedding[7]) and torch.equal(embedding[3], old_embedding[0])
    assert torch.allclose(embedding[2], old_embedding.mean(dim=0))
    assert torch.equal(language_model.decoder.bias[1], old_bias[7])
    assert language_model.decoder.weight is embedding
    assert language_model.config.pad_token_id == 0  # the pad token "w1" moved to index 0
    assert language_model.eval()(torch.tensor([[0, 2, 4]])).logits.shape == (1, 3, 5)
