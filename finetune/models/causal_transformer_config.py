"""The causal transformer's config (config.json, model_type "finetune_causal_transformer"; the format is in
models/causal_transformer.py's docstring) and the memory it carries: what the attention and the model both read."""

from __future__ import annotations

from typing import Literal

from huggingface_hub.dataclasses import strict
from torch import Tensor
from transformers import PretrainedConfig

CAUSAL_TRANSFORMER_TYPE = "finetune_causal_transformer"

# One (batch, remembered positions, hidden) tensor per layer: the states that entered it in earlier segments.
Memory = tuple[Tensor, ...]


@strict
class CausalTransformerConfig(PretrainedConfig):
    """Sizes, dropouts, the position scheme, the memory and the attention pattern (defaults: GPT-2-mini's sizes)."""

    model_type = CAUSAL_TRANSFORMER_TYPE

    vocab_size: int = 16000
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int | None = None  # None: 4 x hidden, as GPT-2
    dropout: float = 0.1  # on the embeddings and on each residual branch's output
    attention_dropout: float = 0.1  # on the attention probabilities (and on the relative encodings R)
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02  # GPT-2's
    relative_positions: bool = True  # Transformer-XL's; false: a learned table of absolute positions (GPT-2's)
    max_position_embeddings: int = 1024  # the absolute table's size (unused with relative positions)
    memory_length: int = 0  # remembered positions per layer (Transformer-XL); needs relative positions
    attention_pattern: Literal["dense", "strided", "fixed"] = "dense"
    attention_stride: int | None = None  # S of a strided or fixed pattern
    summary_columns: int = 1  # c of the fixed pattern: the last c positions of every block are read by all later
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def validate_attention(self) -> None:
        """Options that do not go together fail when the config is made, not in the middle of a forward."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.relative_positions and self.hidden_size % 2:
            raise ValueError("relative positions need an even hidden_size (sine and cosine halves)")
        if self.memory_length and not self.relative_positions:
            raise ValueError("memory_length needs relative positions: remembered states have no absolute position")
        if (self.attention_pattern != "dense") != (self.attention_stride is not None):
            raise ValueError("attention_stride goes with a strided or fixed attention_pattern, and only with one")
        if self.attention_stride is not None and not 0 < self.summary_columns <= self.attention_stride:
            raise ValueError(f"summary_columns ({self.summary_columns}) must be in 1..attention_stride")
