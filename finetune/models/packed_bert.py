"""Training and prediction without padding for BERT-family classifiers and taggers: the real tokens of a batch only,
packed into one matrix.

A batch pads each example to its longest: shuffled batches of 32 SST-2 sentences compute ~3x the positions they
hold, CoNLL-2003 sentences ~2.6x; even length-sorted ones pad (RTE dev: 20,235 token rows for 17,894 real tokens).
The projections, feed-forward products, GELU, LayerNorms and dropout (~85% of a MiniLM forward, profiled on a
2-core CPU) work on each token alone, so this route runs them on the (real tokens, width) matrix and scatters into
the padded (batch, length) layout only for attention, which reads the padding mask. Q, K and V come from one
product, and the rest of each layer is the masked LM's training route (models/masked_lm.py), with its dropout.
The arithmetic is Hugging Face's, in other product shapes: logits and gradients agree to float rounding with
dropout off, and dropout keeps each unit with the same probability (tests/models/test_packed_bert.py).

Covered: `BertForSequenceClassification` (the [CLS] pooler), `BertForTokenClassification`, and the mean-pooling
classifier on a BERT encoder (models/mean_pooling.py, without a scalar mix), training or evaluating, in fp32,
without autocast, on right-padded batches, without a LoRA adapter in it and without gradient checkpointing.
Anything else takes the model's own forward. Prediction calls `packed_logits`; fine-tuning gives the model the
forward of `train_without_padding`, so that DDP, which syncs gradients around the module's forward, still sees it.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import BertForSequenceClassification, BertForTokenClassification, BertModel
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput

from finetune.models.adapters import carries_adapter
from finetune.models.cpu_dropout import dropout
from finetune.models.masked_lm import after_attention, mixed_values, stacked_qkv
from finetune.models.mean_pooling import MeanPoolingForSequenceClassification


def packed_logits(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None, **others
) -> Tensor | None:
    """The model's logits computed on the real tokens only, or None when not covered: (batch, labels) for a
    sequence classifier, (batch, length, labels) for a tagger (zeros at the padded positions)."""
    if others or attention_mask is None or not _covered(model, input_ids):
        return None
    real = attention_mask.bool()
    if not bool(real[:, 0].all()):  # left padding (or an empty row): positions and [CLS] would not line up
        return None
    head_dropout = model.dropout.p if model.training else 0.0
    if isinstance(model, MeanPoolingForSequenceClassification):
        hidden = packed_encoder(model.encoder, input_ids, real, token_type_ids)
        lengths = real.sum(dim=1)  # real tokens per row; the packed rows follow each other in this order
        rows = torch.arange(len(input_ids), device=input_ids.device).repeat_interleave(lengths)
        sums = hidden.new_zeros(len(input_ids), hidden.shape[-1]).index_add(0, rows, hidden)
        return model.classifier(dropout(model.normalized(sums / lengths.unsqueeze(-1).to(hidden.dtype)), head_dropout))
    hidden = packed_encoder(model.bert, input_ids, real, token_type_ids)
    if isinstance(model, BertForTokenClassification):
        logits = model.classifier(dropout(hidden, head_dropout))
        return _padded(logits, real_places(real), real.numel()).view(*real.shape, -1)
    starts = F.pad(real.sum(dim=1).cumsum(dim=0)[:-1], (1, 0))  # each row's first token: its [CLS]
    pooler = model.bert.pooler
    assert pooler is not None  # _covered checked it
    return model.classifier(dropout(pooler.activation(pooler.dense(hidden[starts])), head_dropout))


def _covered(model, input_ids: Tensor) -> bool:
    """A model `covers` names, in a state this module computes exactly: fp32, no autocast, no adapter."""
    return (
        covers(model)
        and not carries_adapter(model)  # LoRA adds to the projections this route reads as plain weights
        and not (model.training and model.base_model.is_activation_checkpointing)  # its memory saving is the point
        and model.dtype == torch.float32
        and not torch.is_autocast_enabled(input_ids.device.type)
    )


def covers(model) -> bool:
    """Whether this module computes the model: a BERT classifier ([CLS] pooler, or mean pooling without a scalar mix)
    or tagger, with BERT's absolute positions."""
    if isinstance(model, (BertForSequenceClassification, BertForTokenClassification)):
        encoder = model.bert
        if isinstance(model, BertForSequenceClassification) and encoder.pooler is None:
            return False
    elif isinstance(model, MeanPoolingForSequenceClassification) and model.scalar_mix is None:
        encoder = model.encoder
    else:
        return False
    config = encoder.config
    return (
        isinstance(encoder, BertModel)
        and not config.is_decoder
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
        # the weights read as tensors: not a model whose linear layers torch quantized (weight() is a method there)
        and all(isinstance(layer.attention.self.query, torch.nn.Linear) for layer in encoder.encoder.layer)  # type: ignore[union-attr]
    )


def packed_encoder(bert: BertModel, input_ids: Tensor, real: Tensor, token_type_ids: Tensor | None) -> Tensor:
    """`BertModel`'s last hidden state at the real tokens, row after row: (real tokens, width). In training mode with
    the model's dropout (embeddings, attention probabilities, each sub-layer's output)."""
    config = bert.config
    hidden_dropout = config.hidden_dropout_prob if bert.training else 0.0
    attention_dropout = config.attention_probs_dropout_prob if bert.training else 0.0
    embeddings = bert.embeddings
    places = real_places(real)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).repeat(len(input_ids))[places]
    types = torch.zeros_like(positions) if token_type_ids is None else token_type_ids.flatten()[places]
    hidden = embeddings.LayerNorm(
        embeddings.word_embeddings(input_ids.flatten()[places])
        + embeddings.token_type_embeddings(types)
        + embeddings.position_embeddings(positions)
    )
    hidden = dropout(hidden, hidden_dropout)
    keys = real[:, None, None, :]  # (batch, 1, 1, length): every query may attend to the real keys of its row
    for layer in bert.encoder.layer:
        context = _attention(layer.attention.self, hidden, places, keys, attention_dropout)  # type: ignore[union-attr]
        hidden = after_attention(layer, context, hidden, hidden_dropout)
    return hidden


def _attention(attention, hidden: Tensor, places: Tensor, keys: Tensor, attention_dropout: float) -> Tensor:
    """A `BertSelfAttention` on packed tokens, in the padded layout (`keys`: (batch, 1, 1, length), the real ones):
    the mixed values, packed again (real tokens, width)."""
    batch, length = keys.shape[0], keys.shape[-1]
    width = hidden.shape[-1]
    # Zeros at the padded rows: masked keys get no weight, yet a NaN in their values would still reach the mixing.
    padded = _padded(F.linear(hidden, *stacked_qkv(attention)), places, batch * length)
    query, key, value = padded.view(batch, length, 3, attention.num_attention_heads, -1).permute(2, 0, 3, 1, 4)
    if attention_dropout:
        context = mixed_values(query, key, value, attention.scaling, attention_dropout, keys)
    else:
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=keys, scale=attention.scaling)
    return context.transpose(1, 2).reshape(-1, width).index_select(0, places)


def real_places(real: Tensor) -> Tensor:
    """Each real token's place in the flattened (batch x length) layout, in row order."""
    return real.flatten().nonzero().squeeze(1)


def _padded(packed: Tensor, places: Tensor, size: int) -> Tensor:
    """(real tokens, width) -> (size = batch x length, width), zeros at the padded places."""
    return packed.new_zeros(size, packed.shape[-1]).index_copy(0, places, packed)


def train_without_padding(model) -> bool:
    """Give a classifier or tagger this module `covers` a forward that computes its real tokens only whenever it can
    (fp32, no autocast, no adapter, right padding), and its own forward otherwise; returns whether it got one.

    Set on the instance, not by a subclass: a checkpoint keeps naming Hugging Face's class, and DDP (which wraps the
    module and syncs gradients around its forward) calls this one. Bound as a method, so a copy of the model
    computes with its own weights."""
    if not covers(model):
        return False
    model.forward = types.MethodType(_forward_without_padding, model)
    return True


def _forward_without_padding(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **others):
    logits = None if input_ids is None else packed_logits(self, input_ids, attention_mask, token_type_ids, **others)
    if logits is None:
        given = {"attention_mask": attention_mask, "token_type_ids": token_type_ids, "labels": labels}
        inputs = {name: value for name, value in given.items() if value is not None}
        return type(self).forward(self, input_ids=input_ids, **inputs, **others)
    # With labels, the loss the model's own forward computes (transformers' loss functions).
    if isinstance(self, BertForTokenClassification):
        loss = None if labels is None else self.loss_function(logits, labels, self.config)
        return TokenClassifierOutput(loss=loss, logits=logits)
    loss = None if labels is None else self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
    return SequenceClassifierOutput(loss=loss, logits=logits)
