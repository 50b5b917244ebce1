"""A BERT-style masked language model, with the vocabulary projection computed only where it is needed."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, BertConfig, BertForMaskedLM

from finetune.errors import UserError
from finetune.models.hub import load_pretrained, resolve_checkpoint

IGNORE_INDEX = -100  # label of positions that carry no loss (the convention of torch and transformers)

# (mean loss, masked tokens, correct predictions or None while training)
MaskedLMOutput = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


def build_masked_lm(model_config, vocab_size: int, max_positions: int, pad_token_id: int) -> BertForMaskedLM:
    """A randomly initialised BertForMaskedLM of the recipe's size, using PyTorch's fused attention."""
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=model_config.hidden,
        num_hidden_layers=model_config.layers,
        num_attention_heads=model_config.heads,
        intermediate_size=model_config.intermediate or 4 * model_config.hidden,
        hidden_dropout_prob=model_config.dropout,
        attention_probs_dropout_prob=model_config.dropout,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
    )
    return BertForMaskedLM._from_config(config, attn_implementation="sdpa")


def load_masked_lm(name: str, dropout: float | None = None) -> BertForMaskedLM:
    """A pretrained BERT-family checkpoint as a masked LM to continue training (a missing MLM head starts fresh)."""
    source = resolve_checkpoint(name)
    config = load_pretrained(AutoConfig.from_pretrained, source, "model.checkpoint")
    if config.model_type != "bert":
        raise UserError(f"model.checkpoint: {name} is a '{config.model_type}' model; "
                        "continued masked-LM pretraining supports the bert family")
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    return load_pretrained(BertForMaskedLM.from_pretrained, source, "model.checkpoint", config=config,
                           attn_implementation="sdpa")


def masked_lm_loss(model: BertForMaskedLM, input_ids: torch.Tensor, labels: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> MaskedLMOutput:
    """Cross-entropy at the masked positions only (Cramming's sparse prediction).

    `BertForMaskedLM.forward` projects every position onto the vocabulary; only ~15% carry a
    label, so we run the encoder, pick the labelled positions and decode just those.
    Returns (mean loss, number of masked tokens, number of correct predictions); the last is
    counted only in eval mode (None while training: the argmax over the vocabulary is not free).
    """
    hidden = model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    selected = labels != IGNORE_INDEX
    logits = model.cls(hidden[selected])
    targets = labels[selected]
    if targets.numel() == 0:  # a batch where nothing was chosen: a zero loss that still has a graph
        return hidden.sum() * 0.0, selected.sum(), None if model.training else selected.sum()
    loss = F.cross_entropy(logits.float(), targets)
    correct = None if model.training else (logits.argmax(dim=-1) == targets).sum()
    return loss, selected.sum(), correct


class SparseMaskedLM(nn.Module):
    """A BertForMaskedLM whose forward returns the sparse loss, so that DDP sees (and syncs) the real forward."""

    def __init__(self, masked_lm: BertForMaskedLM):
        super().__init__()
        self.masked_lm = masked_lm

    @property
    def language_model(self) -> BertForMaskedLM:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.masked_lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> MaskedLMOutput:
        return masked_lm_loss(self.masked_lm, input_ids, labels, attention_mask)
