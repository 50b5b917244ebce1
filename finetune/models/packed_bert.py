"""Prediction without padding for BERT-family classifiers: the real tokens of a batch only, packed into one matrix.

Even length-sorted batches pad: a batch of 64 pairs pads each to its longest (RTE dev: 20,235 token rows for
17,894 real tokens). The projections, feed-forward products, GELU and LayerNorms (~85% of a MiniLM forward,
profiled on a 2-core CPU) work on each token alone, so `packed_logits` runs them on the (real tokens, width)
matrix and scatters into the padded (batch, length) layout only for attention, which SDPA reads with the padding
mask. Q, K and V come from one product, and the rest of each layer is the masked LM's training route
(models/masked_lm.py). The arithmetic is Hugging Face's, in other product shapes: logits agree to float rounding
(tests/models/test_packed_bert.py).

Covered: `BertForSequenceClassification` (the [CLS] pooler) and the mean-pooling classifier on a BERT encoder
(models/mean_pooling.py, without a scalar mix), in evaluation, fp32, without autocast, on right-padded batches, and
without a LoRA adapter in it (a run's dev evaluation with one; an adapter checkpoint loads merged, and is covered).
Anything else returns None and takes the model's own forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import BertForSequenceClassification, BertModel

from finetune.models.adapters import carries_adapter
from finetune.models.masked_lm import after_attention, stacked_qkv
from finetune.models.mean_pooling import MeanPoolingForSequenceClassification


def packed_logits(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None, **others
) -> Tensor | None:
    """The classifier's logits (batch, labels) computed on the real tokens only, or None when not covered."""
    if others or attention_mask is None or not _covered(model, input_ids):
        return None
    real = attention_mask.bool()
    if not bool(real[:, 0].all()):  # left padding (or an empty row): positions and [CLS] would not line up
        return None
    lengths = real.sum(dim=1)  # real tokens per row; the packed rows follow each other in this order
    if isinstance(model, BertForSequenceClassification):
        hidden = packed_encoder(model.bert, input_ids, real, token_type_ids)
        starts = F.pad(lengths.cumsum(dim=0)[:-1], (1, 0))  # each row's first token: its [CLS]
        pooler = model.bert.pooler
        assert pooler is not None  # BertForSequenceClassification builds its BERT with the pooler
        return model.classifier(pooler.activation(pooler.dense(hidden[starts])))
    hidden = packed_encoder(model.encoder, input_ids, real, token_type_ids)
    rows = torch.arange(len(input_ids), device=input_ids.device).repeat_interleave(lengths)
    sums = hidden.new_zeros(len(input_ids), hidden.shape[-1]).index_add_(0, rows, hidden)
    return model.classifier(sums / lengths.unsqueeze(-1).to(hidden.dtype))


def _covered(model, input_ids: Tensor) -> bool:
    """A BERT classifier this module computes exactly: evaluation, fp32, no autocast, BERT's absolute positions."""
    if isinstance(model, BertForSequenceClassification):
        encoder = model.bert
        if encoder.pooler is None:
            return False
    elif isinstance(model, MeanPoolingForSequenceClassification) and model.scalar_mix is None:
        encoder = model.encoder
    else:
        return False
    config = encoder.config
    return (
        isinstance(encoder, BertModel)
        and not carries_adapter(model)  # LoRA adds to the projections this route reads as plain weights
        and not model.training
        and model.dtype == torch.float32
        and not torch.is_autocast_enabled(input_ids.device.type)
        and not config.is_decoder
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
    )


def packed_encoder(bert: BertModel, input_ids: Tensor, real: Tensor, token_type_ids: Tensor | None) -> Tensor:
    """`BertModel`'s last hidden state at the real tokens, row after row: (real tokens, width)."""
    embeddings = bert.embeddings
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)[real]
    types = torch.zeros_like(positions) if token_type_ids is None else token_type_ids[real]
    hidden = embeddings.LayerNorm(
        embeddings.word_embeddings(input_ids[real])
        + embeddings.token_type_embeddings(types)
        + embeddings.position_embeddings(positions)
    )
    keys = real[:, None, None, :]  # (batch, 1, 1, length): every query may attend to the real keys of its row
    for layer in bert.encoder.layer:
        hidden = _packed_layer(layer, hidden, real, keys)
    return hidden


def _packed_layer(layer, hidden: Tensor, real: Tensor, keys: Tensor) -> Tensor:
    """One `BertLayer` on packed tokens: attention in the padded layout, everything else packed."""
    attention = layer.attention.self
    batch, length = real.shape
    width = hidden.shape[-1]
    padded = hidden.new_empty(batch, length, 3 * width)
    padded[real] = F.linear(hidden, *stacked_qkv(attention))
    padded[~real] = 0.0  # masked keys get no weight, yet a NaN in their values would still reach the mixing
    query, key, value = padded.view(batch, length, 3, attention.num_attention_heads, -1).permute(2, 0, 3, 1, 4)
    context = F.scaled_dot_product_attention(query, key, value, attn_mask=keys, scale=attention.scaling)
    context = context.transpose(1, 2)[real].reshape(-1, width)  # (real tokens, width)
    return after_attention(layer, context, hidden, hidden_dropout=0.0)  # evaluation: no dropout
