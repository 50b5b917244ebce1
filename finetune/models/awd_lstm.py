"""ULMFiT's AWD-LSTM language model (Merity et al. 2017; Howard & Ruder 2018) as a Hugging Face model.

Its recurrent cell is config.cell (models/recurrent_cells.py): "lstm" (ULMFiT), "qrnn" (MultiFiT's quasi-recurrent
layers: window 2 for the first layer, 1 above, as fastai's AWD-QRNN) or "rnn" (a plain tanh RNN, for reference). The
dropouts, the carried state, AR/TAR and the layer groups are the same for all three.

Importing this module registers model type "awd_lstm" with AutoConfig, AutoModel and AutoModelForCausalLM, so a
folder written by `save_pretrained` loads with `AutoModelForCausalLM.from_pretrained(folder)`.

Checkpoint format:

- config.json: "model_type": "awd_lstm", "architectures", vocab_size, embedding_size, hidden_size, num_layers,
  cell (absent from checkpoints older than it: "lstm"), output_dropout, hidden_dropout, input_dropout,
  embedding_dropout, weight_dropout, tie_word_embeddings, pad_token_id, embedding_init_range, classifier_dropout
  (plus the keys every transformers config writes; a classifier adds the other classifier_* keys of
  awd_lstm_classifier.py).
- model.safetensors, for AWDLSTMForCausalLM (AWDLSTMModel writes the same names without "awd_lstm."):
  awd_lstm.embedding.weight                        (vocab_size, embedding_size)
  cell "lstm":
  awd_lstm.layers.{i}.weight_hh_l0_raw             (4 * out_i, out_i)  hidden-to-hidden, before DropConnect
  awd_lstm.layers.{i}.lstm.weight_ih_l0            (4 * out_i, in_i)
  awd_lstm.layers.{i}.lstm.bias_ih_l0, bias_hh_l0  (4 * out_i,)
  cell "rnn" (tanh):
  awd_lstm.layers.{i}.weight_hh_l0_raw             (out_i, out_i)      hidden-to-hidden, before DropConnect
  awd_lstm.layers.{i}.rnn.weight_ih_l0             (out_i, in_i)
  awd_lstm.layers.{i}.rnn.bias_ih_l0, bias_hh_l0   (out_i,)
  cell "qrnn" (no hidden-to-hidden matrix: DropConnect masks the gates' weights):
  awd_lstm.layers.{i}.weight_ih_raw                (3 * out_i, window_i * in_i)  before DropConnect
  awd_lstm.layers.{i}.bias_ih                      (3 * out_i,)
  decoder.bias                                     (vocab_size,)
  decoder.weight only when tie_word_embeddings is false: tied, it is the embedding and is stored once.
  Here in_i is embedding_size for layer 0 and hidden_size above; out_i is hidden_size, except for the last
  layer, whose output is embedding_size so the decoder can share the embedding. LSTM gate rows are in PyTorch's
  order (input, forget, cell, output); QRNN rows are (candidate z, forget f, output o) and its columns x_t, then
  x_{t-1} where window_i is 2 (layer 0; 1 above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from finetune.models.generation import StatefulGenerationMixin
from finetune.models.recurrent_cells import LayerState, QRNNLayer, WeightDropout, recurrent_layer

# One LayerState (recurrent_cells.py: LSTM (hidden, cell), RNN (hidden,), QRNN (cell[, previous_input])) per
# layer: the layers differ in size, so no single tensor. None starts every layer from zeros.
HiddenState = tuple[LayerState, ...]


class RNNDropout(nn.Module):
    """Variational dropout: one mask per sequence, shared by all its time steps, on (batch, time, features)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, inputs: Tensor) -> Tensor:
        """`inputs` with the same features of each sequence zeroed at every step, the rest scaled by 1/(1-p)."""
        if not self.training or self.p == 0:
            return inputs
        keep = inputs.new_empty(inputs.shape[0], 1, inputs.shape[2]).bernoulli_(1 - self.p)
        return inputs * keep / (1 - self.p)


class EmbeddingDropout(nn.Module):
    """Word dropout on an embedding matrix: whole rows (every occurrence of a word) zeroed, the rest scaled."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, weight: Tensor) -> Tensor:
        """The (vocab, dim) matrix with rows dropped; look tokens up in it with `F.embedding`."""
        if not self.training or self.p == 0:
            return weight
        keep = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - self.p)
        return weight * keep / (1 - self.p)


def detach_hidden_state(hidden_state: HiddenState) -> HiddenState:
    """The same state cut from the graph: truncated backpropagation through time between batches."""
    return tuple(tuple(tensor.detach() for tensor in layer_state) for layer_state in hidden_state)


def named_hidden_state(model: AWDLSTMPreTrainedModel, hidden_state: HiddenState | None) -> dict[str, Tensor]:
    """The state as named tensors for a checkpoint: "{name}_{layer}" (an LSTM's hidden_0, cell_0, hidden_1, ...)."""
    if hidden_state is None:
        return {}
    layers = _recurrent_layers(model)
    return {
        f"{name}_{index}": tensor
        for index, (layer, layer_state) in enumerate(zip(layers, hidden_state))
        for name, tensor in zip(layer.state_names, layer_state)
    }


def hidden_state_from_names(model: AWDLSTMPreTrainedModel, tensors: dict[str, Tensor]) -> HiddenState | None:
    """The state `named_hidden_state` saved (other tensors beside it are ignored); None when it is not all there."""
    names = [[f"{name}_{index}" for name in layer.state_names] for index, layer in enumerate(_recurrent_layers(model))]
    if not all(name in tensors for layer_names in names for name in layer_names):
        return None
    return tuple(tuple(tensors[name] for name in layer_names) for layer_names in names)


def _recurrent_layers(model: AWDLSTMPreTrainedModel) -> list[WeightDropout | QRNNLayer]:
    """The recurrent layers of an AWD-LSTM model's encoder (its base_model: the model itself when bare), bottom up."""
    encoder = model.base_model
    assert isinstance(encoder, AWDLSTMModel)  # base_model_prefix names the encoder of every AWD-LSTM model
    # recurrent_layer() built each one; a ModuleList's items are typed nn.Module
    return cast("list[WeightDropout | QRNNLayer]", list(encoder.layers))


AWD_LSTM_TYPE = "awd_lstm"  # config.json's model_type (and the recipe's model.family)


@strict
class AWDLSTMConfig(PretrainedConfig):
    """Sizes and dropouts of an AWD-LSTM; defaults are fastai's ULMFiT language model (`awd_lstm_lm_config`)."""

    model_type = AWD_LSTM_TYPE

    vocab_size: int = 60000  # fastai's WikiText-103 vocabulary cap
    embedding_size: int = 400  # also the top layer's output size
    hidden_size: int = 1152  # every layer but the last, whose output is embedding_size (for the tied decoder)
    num_layers: int = 3  # recurrent layers, each its own module (and its own layer group)
    cell: Literal["lstm", "qrnn", "rnn"] = "lstm"  # ULMFiT's LSTM, MultiFiT's QRNN, or a tanh RNN (a baseline)
    output_dropout: float = 0.1  # RNNDropout before the decoder
    hidden_dropout: float = 0.15  # RNNDropout between recurrent layers
    input_dropout: float = 0.25  # RNNDropout on the embedded tokens
    embedding_dropout: float = 0.02  # EmbeddingDropout: whole words
    weight_dropout: float = 0.2  # DropConnect on each layer's hidden-to-hidden weights (QRNN: its gates' weights)
    tie_word_embeddings: bool = True  # decoder weight is the embedding (the name transformers' tying reads)
    pad_token_id: int | None = 1  # fastai's xxpad
    embedding_init_range: float = 0.1  # embedding and decoder uniform in [-range, range], as in AWD-LSTM
    # Declared so `AutoConfig.from_pretrained(..., classifier_dropout=p)` keeps them (it drops unknown keys); None:
    # the classifier's own default (awd_lstm_classifier.CLASSIFIER_DEFAULTS).
    classifier_dropout: float | None = None
    classifier_activation_regularization: float | None = None
    classifier_temporal_activation_regularization: float | None = None


@dataclass
class AWDLSTMOutput(ModelOutput):
    """Encoder output: the top layer's outputs and the recurrent state to pass to the next batch."""

    last_hidden_state: Tensor | None = None
    hidden_state: HiddenState | None = None


@dataclass
class AWDLSTMCausalLMOutput(ModelOutput):
    """Language-model output: loss (when labels are given), logits, the recurrent state, and the top layer's outputs
    before and after output dropout (what activation regularisation reads: TAR the first, AR the second)."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_state: HiddenState | None = None
    last_hidden_state: Tensor | None = None
    dropped_hidden_state: Tensor | None = None


class AWDLSTMPreTrainedModel(PreTrainedModel):
    """Shared transformers plumbing: config class, weight prefix and initialisation."""

    config_class = AWDLSTMConfig
    config: AWDLSTMConfig
    base_model_prefix = "awd_lstm"
    _input_embed_layer = "embedding"  # where transformers' get/set_input_embeddings look
    main_input_name = "input_ids"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Uniform embedding and decoder (AWD-LSTM's scheme), PyTorch's LSTM/RNN init (QRNN: nn.Linear's, as
        fastai), zero decoder bias."""
        bound = self.config.embedding_init_range
        if isinstance(module, nn.Embedding):
            init.uniform_(module.weight, -bound, bound)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.Linear):
            init.uniform_(module.weight, -bound, bound)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (WeightDropout, QRNNLayer)):
            # Whole layers: an LSTM's or RNN's raw weight sits outside the PyTorch module inside.
            fan_in = module.hidden_size if isinstance(module, WeightDropout) else module.weight_ih_raw.shape[1]
            for parameter in module.parameters():
                init.uniform_(parameter, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))


class AWDLSTMModel(AWDLSTMPreTrainedModel):
    """The encoder: embedding with word dropout, then a stack of weight-dropped recurrent layers (config.cell)."""

    def __init__(self, config: AWDLSTMConfig):
        super().__init__(config)
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.embedding_dropout = EmbeddingDropout(config.embedding_dropout)
        self.input_dropout = RNNDropout(config.input_dropout)
        self.hidden_dropout = RNNDropout(config.hidden_dropout)
        sizes = [config.embedding_size] + [config.hidden_size] * (config.num_layers - 1) + [config.embedding_size]
        self.layers = nn.ModuleList(
            recurrent_layer(config.cell, sizes[index], sizes[index + 1], config.weight_dropout, index)
            for index in range(config.num_layers)
        )
        self.post_init()

    def forward(
        self, input_ids: Tensor, hidden_state: HiddenState | None = None, attention_mask: Tensor | None = None
    ) -> AWDLSTMOutput:
        """Encode (batch, time) token ids, starting from `hidden_state` (zeros when None).

        A state from a batch of another size is dropped (zeros), as fastai does, so a short last batch works.
        `attention_mask` is accepted for tokenizer outputs and ignored: reading left to right (every cell), the
        encoder is unaffected by right padding. The caller keeps the returned state, detaching it between batches.
        """
        if hidden_state is not None and hidden_state[0][0].shape[1] != input_ids.shape[0]:
            hidden_state = None
        weight = self.embedding_dropout(self.embedding.weight)
        outputs = self.input_dropout(F.embedding(input_ids, weight, self.embedding.padding_idx))
        new_state = []
        for index, layer in enumerate(self.layers):
            outputs, state = layer(outputs, None if hidden_state is None else hidden_state[index])
            new_state.append(state)
            if index < len(self.layers) - 1:
                outputs = self.hidden_dropout(outputs)
        return AWDLSTMOutput(last_hidden_state=outputs, hidden_state=tuple(new_state))


class AWDLSTMForCausalLM(AWDLSTMPreTrainedModel, StatefulGenerationMixin):
    """The encoder with output dropout and a linear decoder over the vocabulary, tied to the embedding.

    `generate` carries the recurrent state: the prompt is read once, then each new token is one step.
    """

    # No ClassVar: PreTrainedModel declares it an instance attribute.
    _tied_weights_keys = {"decoder.weight": "awd_lstm.embedding.weight"}  # noqa: RUF012
    state_keyword = "hidden_state"

    def __init__(self, config: AWDLSTMConfig):
        super().__init__(config)
        self.awd_lstm = AWDLSTMModel(config)
        self.output_dropout = RNNDropout(config.output_dropout)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.post_init()  # ties decoder.weight to the embedding when config.tie_word_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.decoder = value

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        hidden_state: HiddenState | None = None,
        attention_mask: Tensor | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> AWDLSTMCausalLMOutput:
        """Logits for every position (the last `logits_to_keep` only, when given: generation's prompt); with
        `labels` (usually the input ids) the next-token loss.

        As everywhere in transformers, labels are shifted inside (position t predicts label t+1; -100 is ignored).
        Truncated BPTT over a token stream can pass `shift_labels` (targets already aligned) instead, so the last
        token of each chunk is trained too.
        """
        encoded = self.awd_lstm(input_ids, hidden_state=hidden_state)
        dropped = self.output_dropout(encoded.last_hidden_state)
        logits = self.decoder(dropped[:, -logits_to_keep:] if logits_to_keep else dropped)
        loss = None
        if labels is not None or kwargs.get("shift_labels") is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return AWDLSTMCausalLMOutput(
            loss=loss,
            logits=logits,
            hidden_state=encoded.hidden_state,
            last_hidden_state=encoded.last_hidden_state,
            dropped_hidden_state=dropped,
        )


def activation_penalty(
    raw: Tensor, dropped: Tensor, activation: float, temporal: float, mask: Tensor | None = None
) -> Tensor:
    """fastai's RNNRegularizer on (batch, time, features) outputs of the top LSTM layer: AR + TAR.

    AR (Merity et al. 2017) keeps activations small: `activation` x mean square of the output after dropout (what
    the decoder reads). TAR keeps them smooth in time: `temporal` x mean square of the difference between
    consecutive steps of the output before dropout (dropout would make every step look like a jump).
    With `mask` (batch, time; true at real tokens), the means run over real positions only (and TAR over pairs
    of real neighbours): a classifier's padding is not text to regularise.
    """
    penalty = raw.new_zeros((), dtype=torch.float32)
    weights = None if mask is None else mask.unsqueeze(-1).expand_as(raw).float()
    if activation:
        penalty = penalty + activation * _mean(dropped.float().pow(2), weights)
    if temporal and raw.shape[1] > 1:  # one time step has no difference (fastai's check, meant for time)
        pairs = None if weights is None else weights[:, 1:] * weights[:, :-1]
        penalty = penalty + temporal * _mean((raw[:, 1:] - raw[:, :-1]).float().pow(2), pairs)
    return penalty


def _mean(values: Tensor, weights: Tensor | None) -> Tensor:
    """The mean of `values`, or over the entries where `weights` is 1 (0 when there are none)."""
    if weights is None:
        return values.mean()
    return (values * weights).sum() / weights.sum().clamp(min=1)


def with_gradient_of(loss: Tensor, penalty: Tensor) -> Tensor:
    """`loss` with its value unchanged (bit for bit, while `penalty` is finite) and the gradient of loss + penalty.

    fastai adds AR/TAR to the loss it back-propagates only (`loss_grad`) and logs the plain cross-entropy, which
    stays comparable with the validation loss. Here one tensor does both: the training loop logs its value and
    back-propagates it, and every family keeps the same (loss, count, correct) contract. A non-finite penalty
    makes the value nan, so the loop's divergence check still sees it.
    """
    return loss + (penalty - penalty.detach())


def awd_lstm_layer_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """ULMFiT's groups: [embedding], [layer 0], ..., [top layer] (any cell); `layer_groups` adds the head.

    A bidirectional classifier's backward encoder (awd_lstm_classifier.py) shares each group with the forward one's
    part at the same depth: both thaw together and learn at the same rate."""
    encoders = [model.base_model] + [
        backward for backward in [getattr(model, "awd_lstm_backward", None)] if backward is not None
    ]
    return [
        [parameter for part in parts for parameter in part.parameters()]
        for parts in zip(*[[encoder.embedding, *encoder.layers] for encoder in encoders])
    ]


def remap_vocabulary_rows(weight: Tensor, old_vocab: dict[str, int], new_vocab: dict[str, int]) -> Tensor:
    """Rows (or entries of a bias) for `new_vocab`: known tokens keep theirs, new tokens get the old rows' mean."""
    weight = weight.detach()
    remapped = weight.mean(dim=0).expand(len(new_vocab), *weight.shape[1:]).clone()
    kept = [(new_index, old_vocab[token]) for token, new_index in new_vocab.items() if token in old_vocab]
    if kept:
        new_rows, old_rows = torch.tensor(kept, device=weight.device).T
        remapped[new_rows] = weight[old_rows]
    return remapped


def with_new_vocabulary(model: AWDLSTMPreTrainedModel, old_vocab: dict[str, int], new_vocab: dict[str, int]):
    """`model`, changed in place and returned, reading and predicting `new_vocab` (ULMFiT's target-domain stage)."""
    config = model.config
    old_pad_token = next((token for token, index in old_vocab.items() if index == config.pad_token_id), None)
    config.pad_token_id = new_vocab.get(old_pad_token) if old_pad_token is not None else None
    input_embedding = model.get_input_embeddings()
    assert isinstance(input_embedding, nn.Embedding)  # the encoder's embedding (AWDLSTMModel)
    embedding = remap_vocabulary_rows(input_embedding.weight, old_vocab, new_vocab)
    model.set_input_embeddings(nn.Embedding.from_pretrained(embedding, freeze=False, padding_idx=config.pad_token_id))
    decoder = model.get_output_embeddings()
    if decoder is not None:
        decoder.bias = nn.Parameter(remap_vocabulary_rows(decoder.bias, old_vocab, new_vocab))
        decoder.out_features = len(new_vocab)
        if not config.tie_word_embeddings:
            decoder.weight = nn.Parameter(remap_vocabulary_rows(decoder.weight, old_vocab, new_vocab))
    config.vocab_size = len(new_vocab)
    model.tie_weights()  # with a tied config, the decoder's weight becomes the new embedding
    return model


AutoConfig.register(AWDLSTMConfig.model_type, AWDLSTMConfig, exist_ok=True)
AutoModel.register(AWDLSTMConfig, AWDLSTMModel, exist_ok=True)
AutoModelForCausalLM.register(AWDLSTMConfig, AWDLSTMForCausalLM, exist_ok=True)
