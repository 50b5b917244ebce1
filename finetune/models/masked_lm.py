"""A BERT-style masked language model, with the vocabulary projection computed only where it is needed.

Training takes a faster route through the same `BertForMaskedLM` parameters (checkpoints are
unchanged); what it computes is the same model, dropout and loss. Measured on a 2-core CPU (BERT-mini,
batch 32 x 128, bench/mlm_pretrain.py), the Hugging Face forward spent its time beyond matrix products on:
- the decoder: ~75 MB of logits per batch, allocated fresh (page faults), then log-softmax, its
  gradient and a zero-filled copy: `linear_cross_entropy` (models/linear_cross_entropy.py, shared with the
  causal families) goes through the masked rows a chunk at a time and turns each chunk's softmax into its
  gradient in place;
- dropout: `bernoulli_` draws one random float per element; `cpu_dropout` compares 32-bit random
  integers with a threshold instead (the same keep probability to 2^-32, about twice as fast);
- attention dropout forces SDPA's unfused CPU path anyway, so `encode` writes attention out
  (with the cheaper dropout) and projects Q, K and V in one product.
Evaluation keeps Hugging Face's forward, which is also the reference the tests compare with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM, BertModel

from finetune.models.adapters import carries_adapter
from finetune.models.cpu_dropout import dropout
from finetune.models.hub import refuse_other_model_type
from finetune.models.linear_cross_entropy import linear_cross_entropy
from finetune.models.loading import load_for_continued_pretraining
from finetune.models.objectives import LanguageModelLoss
from finetune.tasks.specs import IGNORE_INDEX

# (mean loss, masked tokens, correct predictions or None while training)
MaskedLMOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def build_masked_lm(model_config, vocab_size: int, max_positions: int, pad_token_id: int) -> BertForMaskedLM:
    """A randomly initialised BertForMaskedLM of the recipe's size, using PyTorch's fused attention."""
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=model_config.hidden,
        num_hidden_layers=model_config.layers,
        num_attention_heads=model_config.heads,
        intermediate_size=model_config.intermediate,  # the recipe fills in its default (4 x hidden)
        hidden_dropout_prob=model_config.dropout,
        attention_probs_dropout_prob=model_config.dropout,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
    )
    return BertForMaskedLM._from_config(config, attn_implementation="sdpa")


def load_masked_lm(name: str, dropout: float | None = None) -> BertForMaskedLM:
    """A pretrained BERT-family checkpoint as a masked LM to continue training (a missing MLM head starts fresh)."""
    return load_for_continued_pretraining(
        BertForMaskedLM,
        name,
        dropout,
        lambda config: ("hidden_dropout_prob", "attention_probs_dropout_prob"),
        lambda config: refuse_other_model_type(config, "bert", name, "model.family bert continues masked LMs"),
        attn_implementation="sdpa",
    )


def encode(bert: BertModel, input_ids: torch.Tensor, hidden_dropout: float, attention_dropout: float) -> torch.Tensor:
    """`BertModel`'s forward for blocks without padding (no attention mask), written out for training.

    The same parameters and arithmetic as Hugging Face's (tests/models/test_masked_lm.py compares them with
    dropout off); token type 0 and positions 0..n-1 are the same for every block, so they are added once.
    """
    embeddings = bert.embeddings
    seq_len = input_ids.shape[1]
    position_and_type = embeddings.position_embeddings.weight[:seq_len] + embeddings.token_type_embeddings.weight[0]
    hidden = dropout(embeddings.LayerNorm(embeddings.word_embeddings(input_ids) + position_and_type), hidden_dropout)
    for layer in bert.encoder.layer:
        hidden = encoder_layer(layer, hidden, hidden_dropout, attention_dropout)
    return hidden


def encoder_layer(layer, hidden: torch.Tensor, hidden_dropout: float, attention_dropout: float) -> torch.Tensor:
    """One `BertLayer`: self-attention and feed-forward, each followed by dropout, residual and LayerNorm."""
    attention = layer.attention.self
    batch, seq_len, width = hidden.shape
    qkv = F.linear(hidden, *stacked_qkv(attention)).view(batch, seq_len, 3, attention.num_attention_heads, -1)
    query, key, value = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq_len, head size)
    context = mixed_values(query, key, value, attention.scaling, attention_dropout)
    return after_attention(layer, context.transpose(1, 2).reshape(batch, seq_len, width), hidden, hidden_dropout)


def mixed_values(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    attention_dropout: float,
    keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention's mix of the values, written out with the cheaper CPU dropout on its probabilities (under dropout
    SDPA takes its unfused path anyway); `keys` (broadcast over the scores): the keys each query may attend to."""
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)
    if keys is not None:
        scores = scores.masked_fill_(~keys, torch.finfo(scores.dtype).min)
    return torch.matmul(dropout(scores.softmax(dim=-1), attention_dropout), value)


def stacked_qkv(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """A `BertSelfAttention`'s Q, K and V weights and biases stacked: one (width x 3 width) product, one pass over
    the hidden states instead of three."""
    return (
        torch.cat([attention.query.weight, attention.key.weight, attention.value.weight]),
        torch.cat([attention.query.bias, attention.key.bias, attention.value.bias]),
    )


def after_attention(layer, context: torch.Tensor, hidden: torch.Tensor, hidden_dropout: float) -> torch.Tensor:
    """The rest of a `BertLayer` once its attention has mixed the values (`context`, before the output projection):
    projection, dropout, residual and LayerNorm, then the feed-forward block the same way. Any leading shape."""
    output = layer.attention.output
    hidden = output.LayerNorm(dropout(output.dense(context), hidden_dropout) + hidden)
    output = layer.output
    return output.LayerNorm(dropout(output.dense(layer.intermediate(hidden)), hidden_dropout) + hidden)


def masked_lm_loss(
    model: BertForMaskedLM, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> MaskedLMOutput:
    """Cross-entropy at the masked positions only (Cramming's sparse prediction).

    `BertForMaskedLM.forward` projects every position onto the vocabulary; only ~15% carry a
    label, so we run the encoder, pick the labelled positions and decode just those.
    Returns (mean loss, number of masked tokens, number of correct predictions); the last is
    counted only in eval mode (None while training: the argmax over the vocabulary is not free).
    """
    config = model.config
    # The fast route covers fp32 training on packed blocks; autocast, bf16, padding and a LoRA adapter (whose
    # layers the route's direct weight reads would skip) take Hugging Face's.
    fast = (
        model.training
        and attention_mask is None
        and model.dtype == torch.float32
        and not torch.is_autocast_enabled(input_ids.device.type)
        and not carries_adapter(model)
    )
    if fast:
        hidden = encode(model.bert, input_ids, config.hidden_dropout_prob, config.attention_probs_dropout_prob)
    else:
        hidden = model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    selected = labels != IGNORE_INDEX
    targets = labels[selected]
    if targets.numel() == 0:  # a batch where nothing was chosen: a zero loss that still has a graph
        return hidden.sum() * 0.0, selected.sum(), None if model.training else selected.sum()
    head = model.cls.predictions
    transformed = head.transform(hidden[selected])
    return linear_cross_entropy(
        transformed, head.decoder.weight, head.decoder.bias, targets, count_correct=not model.training
    )


class SparseMaskedLM(LanguageModelLoss):
    """A BertForMaskedLM whose forward returns the sparse loss, so that DDP sees (and syncs) the real forward."""

    def __init__(self, masked_lm: BertForMaskedLM):
        super().__init__()
        self.masked_lm = masked_lm

    @property
    def language_model(self) -> BertForMaskedLM:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.masked_lm

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> MaskedLMOutput:
        return masked_lm_loss(self.masked_lm, input_ids, labels, attention_mask)
