"""ULMFiT's text classifier: the AWD-LSTM encoder read in chunks (BPT3C) under a concat-pooling head.

Importing this module registers `AWDLSTMForSequenceClassification` with AutoModelForSequenceClassification, so
`AutoModelForSequenceClassification.from_pretrained(language_model_folder, num_labels=...)` loads a pretrained
AWD-LSTM's encoder (the decoder is left behind) under a freshly initialised head; and `AWDLSTMForTokenClassification`
(a tagger) with AutoModelForTokenClassification the same way.

Config keys read here (missing ones get the defaults below, written back so a saved classifier records them):
classifier_hidden, classifier_dropout, classifier_hidden_dropout, classifier_bptt, classifier_max_len,
classifier_activation_regularization, classifier_temporal_activation_regularization, classifier_scalar_mix.

With classifier_scalar_mix (`pooling: scalar_mix`) the head pools ELMo's learned mix of the embedded tokens and every
LSTM layer's output instead of the top layer's; the checkpoint then also holds scalar_mix.mix.layer_weights
(num_layers + 1,), scalar_mix.mix.gamma () and scalar_mix.projections.{j}.weight (embedding_size, hidden_size) for
each inner layer j (1 to num_layers - 1).

With classifier_bidirectional (`model.backward_checkpoint`: ELMo's biLM, ULMFiT's forward and backward language
models in one classifier) a second encoder, awd_lstm_backward.* (the same sizes and names as awd_lstm.*), reads each
text backwards (`backward_input_ids`, finetune/data/reverse.py) and the head pools [forward; backward] at every
position (2 x embedding_size wide); with a scalar mix, scalar_mix.backward_projections.{j}.weight project the backward
inner layers. Position p of the backward states is the backward model's p-th token read, not the forward one's, so
each half pools as its own classifier would: "last" is each direction's state after the whole text, max and mean are
order-free. AR/TAR regularise both top layers.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput

from finetune.models.awd_lstm import (
    AWDLSTMConfig,
    AWDLSTMModel,
    AWDLSTMPreTrainedModel,
    activation_penalty,
    with_gradient_of,
)
from finetune.models.mean_pooling import mean_over_real_tokens
from finetune.models.scalar_mix import ProjectedScalarMix, ScalarMix

# fastai's ULMFiT classifier (`get_text_classifier` with `awd_lstm_clas_config`), before any drop_mult.
CLASSIFIER_DEFAULTS = {
    "classifier_hidden": 50,  # fastai's lin_ftrs: one hidden layer of 50 between pooling and the labels
    "classifier_dropout": 0.4,  # fastai's output_p: dropout on the pooled features, before the hidden layer
    "classifier_hidden_dropout": 0.1,  # fastai's ps: dropout before the output layer
    "classifier_bptt": 70,  # tokens read per chunk, the state carried from one chunk to the next
    "classifier_max_len": 1400,  # gradients reach the encoder through at most this many last tokens (fastai v1)
    # fastai's text_classifier_learner regularises the encoder's top-layer outputs as its language model does
    # (TextLearner's alpha 2, beta 1), here over real tokens only; in the back-propagated loss only.
    "classifier_activation_regularization": 2.0,
    "classifier_temporal_activation_regularization": 1.0,
    "classifier_scalar_mix": False,  # true: pool a learned mix of every layer (ELMo), not the top layer alone
    "classifier_bidirectional": False,  # true: a backward encoder beside the forward one (ELMo's biLM)
}


def layer_widths(config: AWDLSTMConfig) -> list[int]:
    """Widths of the embedded tokens and of each LSTM layer's output (awd_lstm.py's layout): the inner layers are
    hidden_size wide, the top one embedding_size (for the tied decoder)."""
    return [config.embedding_size] + [config.hidden_size] * (config.num_layers - 1) + [config.embedding_size]


@contextlib.contextmanager
def every_layer_output(encoder: AWDLSTMModel) -> Iterator[list[Tensor]]:
    """Inside, each call of `encoder` appends to the yielded list the embedded tokens (what layer 0 reads) and then
    each LSTM layer's output (before the dropout between layers), bottom to top.

    Read with forward hooks, so the encoder itself keeps returning its top layer alone.
    """
    recorded: list[Tensor] = []

    def record(layer: nn.Module, inputs: tuple, output) -> None:
        if layer is encoder.layers[0]:
            recorded.append(inputs[0])
        recorded.append(output[0] if isinstance(output, tuple) else output)  # a layer returns (outputs, state)

    handles = [layer.register_forward_hook(record) for layer in encoder.layers]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def reversed_rows(input_ids: Tensor, mask: Tensor) -> Tensor:
    """Each row's real tokens in reverse order, padding left where it is (right padding): what a backward encoder
    reads when the caller gives no backward ids. finetune's data path gives them itself (data/reverse.py), reversing
    each text of a pair where it stands; this turns a whole row round, which is the same for a single text without
    special tokens (the byte-level BPE of our language models adds none)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    lengths = mask.sum(dim=1, keepdim=True)
    return input_ids.gather(1, torch.where(positions < lengths, lengths - 1 - positions, positions))


def real_token_mask(input_ids: Tensor, attention_mask: Tensor | None, pad_token_id: int | None) -> Tensor:
    """(batch, time) booleans: the attention mask, else every non-pad id; an empty text keeps its first position."""
    if attention_mask is not None:
        mask = attention_mask.bool()
    elif pad_token_id is not None:
        mask = input_ids != pad_token_id
    else:
        mask = torch.ones_like(input_ids, dtype=torch.bool)
    # An all-padding row pools its first position rather than nothing: an empty max or mean would give inf or NaN.
    first = torch.arange(mask.shape[1], device=mask.device) == 0
    return mask | (first & ~mask.any(dim=1, keepdim=True))


def last_real_positions(mask: Tensor) -> Tensor:
    """(batch,) index of each row's last real position (right padding or not)."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    return torch.where(mask, positions, -1).amax(dim=1)


def concat_pool(outputs: Tensor, mask: Tensor) -> Tensor:
    """ULMFiT's [last, max, mean] over each row's real positions: (batch, time, size) -> (batch, 3 * size)."""
    last = outputs[torch.arange(outputs.shape[0], device=outputs.device), last_real_positions(mask)]
    real = mask.unsqueeze(-1)
    maximum = outputs.masked_fill(~real, float("-inf")).amax(dim=1)
    return torch.cat([last, maximum, mean_over_real_tokens(outputs, mask)], dim=1)


class BatchNorm1dAnySize(nn.BatchNorm1d):
    """BatchNorm1d that normalises a training batch of one with its running statistics instead of failing."""

    def forward(self, inputs: Tensor) -> Tensor:
        """Batch statistics as usual; a single example (the short last batch of a loader) has none to give."""
        if self.training and inputs.shape[0] == 1:
            return F.batch_norm(
                inputs, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        return super().forward(inputs)


def norm_dropout_linear(in_features: int, out_features: int, dropout: float) -> nn.Sequential:
    """fastai's block (`LinBnDrop` with BatchNorm first): BatchNorm1d -> Dropout -> Linear."""
    return nn.Sequential(
        OrderedDict(
            norm=BatchNorm1dAnySize(in_features),
            dropout=nn.Dropout(dropout),
            linear=nn.Linear(in_features, out_features),
        )
    )


class ConcatPoolingClassifier(nn.Module):
    """fastai's `PoolingLinearClassifier`: concat pooling, then two norm-dropout-linear blocks with a ReLU between."""

    def __init__(self, input_size: int, hidden_size: int, num_labels: int, dropout: float, hidden_dropout: float):
        super().__init__()
        self.hidden = norm_dropout_linear(3 * input_size, hidden_size, dropout)
        self.output = norm_dropout_linear(hidden_size, num_labels, hidden_dropout)

    def forward(self, outputs: Tensor, mask: Tensor) -> Tensor:
        """Logits (batch, num_labels) from the encoder's outputs (batch, time, size) at the `mask`ed positions."""
        return self.output(F.relu(self.hidden(concat_pool(outputs, mask))))


class AWDLSTMForSequenceClassification(AWDLSTMPreTrainedModel):
    """ULMFiT's classifier: the AWD-LSTM encoder read `classifier_bptt` tokens at a time, concat pooling, two blocks.

    The encoder keeps its config's dropouts; ULMFiT's recipe scales the language model's by drop_mult 0.5 for
    classification (fastai's default), which a caller sets in the config before loading.
    """

    # A language-model checkpoint also holds the decoder; a classifier has no use for it.
    # No ClassVar: transformers makes it an instance attribute (a set) in __init__.
    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]  # noqa: RUF012

    def __init__(self, config: AWDLSTMConfig):
        super().__init__(config)
        for key, default in CLASSIFIER_DEFAULTS.items():
            if getattr(config, key, None) is None:
                setattr(config, key, default)
        if config.classifier_max_len < config.classifier_bptt:
            # Otherwise the last chunk could be longer than max_len, and no gradient would reach the encoder.
            raise ValueError(
                f"classifier_max_len ({config.classifier_max_len}) must be at least "
                f"classifier_bptt ({config.classifier_bptt})"
            )
        self.awd_lstm = AWDLSTMModel(config)  # the language model's attribute name, so its weights load here
        # The backward language model's encoder, its weights copied in by the loader (models/heads.py).
        self.awd_lstm_backward = AWDLSTMModel(config) if config.classifier_bidirectional else None
        directions = 2 if config.classifier_bidirectional else 1
        num_labels, dropout = config.num_labels, config.classifier_dropout
        # transformers gives every config a label count (2 by default); CLASSIFIER_DEFAULTS filled in the dropout
        assert num_labels is not None and dropout is not None
        # The inner layers are wider than the top one, so they cannot be summed with it as they are. Each gets a
        # learned projection down to the top layer's width rather than being left out: every layer takes part (ELMo's
        # point: the inner ones carry what the top one forgets), and the pooling head below reads the width it reads
        # without a mix. The projections train with the head.
        self.scalar_mix = (
            ProjectedScalarMix(layer_widths(config), config.embedding_size, config.classifier_bidirectional)
            if config.classifier_scalar_mix
            else None
        )
        self.classifier = ConcatPoolingClassifier(
            directions * config.embedding_size,
            config.classifier_hidden,
            num_labels,
            dropout,
            config.classifier_hidden_dropout,
        )
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The encoder as AWD-LSTM does; the head as PyTorch and fastai do (default Linear, unit BatchNorm)."""
        if isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))  # nn.Linear's own reset_parameters
            if module.bias is not None:  # the scalar mix's projections have none
                init.uniform_(module.bias, -1 / math.sqrt(module.in_features), 1 / math.sqrt(module.in_features))
        elif isinstance(module, ScalarMix):
            module.reset_parameters()
        elif isinstance(module, nn.BatchNorm1d):
            PreTrainedModel._init_weights(self, module)  # ones, zeros and fresh running statistics
        else:
            super()._init_weights(module)

    def read_document(self, input_ids: Tensor, encoder: AWDLSTMModel | None = None) -> list[Tensor]:
        """Outputs (batch, time, size) of `encoder` (the forward one by default), read in chunks with the state
        carried (BPT3C): the top layer's alone, or with a scalar mix the embedded tokens' and every layer's, bottom
        to top.

        Only chunks within the last `classifier_max_len` positions keep their graph, so memory stays bounded for
        long documents; earlier chunks still feed the pooling and the carried state, without gradients.
        """
        encoder = self.awd_lstm if encoder is None else encoder
        bptt, max_len = self.config.classifier_bptt, self.config.classifier_max_len
        length = input_ids.shape[1]
        chunks, state = [], None
        for start in range(0, length, bptt):
            recording: contextlib.AbstractContextManager[list[Tensor]] = (
                contextlib.nullcontext([]) if self.scalar_mix is None else every_layer_output(encoder)
            )
            with torch.set_grad_enabled(torch.is_grad_enabled() and length - start <= max_len), recording as layers:
                encoded = encoder(input_ids[:, start : start + bptt], hidden_state=state)
            chunks.append(layers or [encoded.last_hidden_state])
            state = encoded.hidden_state
        return [torch.cat(layer, dim=1) for layer in zip(*chunks)]

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        backward_input_ids: Tensor | None = None,
    ) -> SequenceClassifierOutput:
        """Logits (batch, num_labels); with `labels`, cross-entropy, or MSE for regression (transformers' rules).

        Padding (positions outside `attention_mask`, or pad ids when there is none) is left out of the pooling.
        With right padding it never reaches a real position either: the LSTM reads left to right.
        `backward_input_ids` (bidirectional only): the same rows with each text's tokens reversed, padded alike;
        when absent, each row's real tokens turned round (`reversed_rows`).
        """
        mask = real_token_mask(input_ids, attention_mask, self.config.pad_token_id)
        # Read no further than the batch's last real token: trailing padding would only cost time.
        width = int(last_real_positions(mask).max()) + 1
        mask = mask[:, :width]
        layers = self.read_document(input_ids[:, :width])
        tops = [layers[-1]]  # the top layers: what AR and TAR regularise, with or without a mix
        if self.awd_lstm_backward is None:
            features = layers[-1] if self.scalar_mix is None else self.scalar_mix(layers)
        else:
            if backward_input_ids is None:
                backward_input_ids = reversed_rows(input_ids[:, :width], mask)
            backward = self.read_document(backward_input_ids[:, :width], self.awd_lstm_backward)
            tops.append(backward[-1])
            features = torch.cat(tops, dim=-1) if self.scalar_mix is None else self.scalar_mix(layers, backward)
        logits = self.classifier(features, mask)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
            # None (not filled in) weighs nothing, as 0 does
            alpha = self.config.classifier_activation_regularization or 0.0
            beta = self.config.classifier_temporal_activation_regularization or 0.0
            if self.training and (alpha or beta):  # the value stays the task loss; the gradient carries AR/TAR
                # fastai's classifier reads the top layer before dropout for both (its `out` is its `raw_out`).
                penalties = [activation_penalty(top, top, alpha, beta, mask) for top in tops]
                penalty = sum(penalties[1:], penalties[0])
                loss = with_gradient_of(loss, penalty)
        return SequenceClassifierOutput(loss=loss, logits=logits)


AutoModelForSequenceClassification.register(AWDLSTMConfig, AWDLSTMForSequenceClassification, exist_ok=True)


class AWDLSTMForTokenClassification(AWDLSTMPreTrainedModel):
    """A tagger on the AWD-LSTM encoder (task kind tokens): each token's top-layer state, dropout, a linear layer.

    The encoder reads left to right, so a token's tag is decided from the tokens before it and itself: fine for
    parts of speech, weaker than a bidirectional encoder for named entities (whose first word often needs the next).
    A sentence is read in one pass (sentences are short; `classifier_bptt` chunks are for documents).
    """

    # No ClassVar: transformers makes it an instance attribute (a set) in __init__.
    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]  # noqa: RUF012

    def __init__(self, config: AWDLSTMConfig):
        super().__init__(config)
        if config.classifier_dropout is None:
            config.classifier_dropout = CLASSIFIER_DEFAULTS["classifier_dropout"]
        self.awd_lstm = AWDLSTMModel(config)  # the language model's attribute name, so its weights load here
        self.dropout = nn.Dropout(config.classifier_dropout)
        num_labels = config.num_labels
        assert num_labels is not None  # transformers gives every config a label count (2 by default)
        self.classifier = nn.Linear(config.embedding_size, num_labels)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The encoder as AWD-LSTM does; the output layer as PyTorch's Linear does."""
        if isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            init.uniform_(module.bias, -1 / math.sqrt(module.in_features), 1 / math.sqrt(module.in_features))
        else:
            super()._init_weights(module)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None, **unused
    ) -> TokenClassifierOutput:
        """Logits (batch, time, num_labels); with `labels` (-100: no tag), their cross-entropy."""
        states = self.awd_lstm(input_ids).last_hidden_state
        logits = self.classifier(self.dropout(states))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)


AutoModelForTokenClassification.register(AWDLSTMConfig, AWDLSTMForTokenClassification, exist_ok=True)
