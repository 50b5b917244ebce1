"""The causal transformer's attention (models/causal_transformer.py has the whole model and its formulas):
Transformer-XL's relative positions over [memory ; segment] (sinusoids of the distance, the relative shift, the global
biases u and v) and the Sparse Transformer's strided and fixed patterns, as boolean masks on the written-out scores."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from finetune.models.causal_transformer_config import CausalTransformerConfig
from finetune.models.cpu_dropout import dropout


def attention_pattern(
    pattern: str,
    stride: int | None,
    summary_columns: int,
    query_length: int,
    memory_length: int,
    device: torch.device | None = None,
    first_position: int = 0,
) -> Tensor:
    """Which keys each query may attend to: (query_length, memory_length + query_length), true where allowed.

    Queries are the segment's positions 0..L-1; keys are the memory's positions -M..-1, then the segment's own;
    all shifted by `first_position`, the segment's place in the stream (generation's one-token segments: the fixed
    pattern's blocks lie where they lay in the whole text). Every pattern is causal (j <= i) and reaches into the
    whole memory, as Transformer-XL's attention does.
    """
    query = torch.arange(first_position, first_position + query_length, device=device)[:, None]
    key = torch.arange(first_position - memory_length, first_position + query_length, device=device)[None, :]
    distance = query - key
    allowed = distance >= 0
    if pattern == "strided":
        assert stride is not None  # a strided or fixed pattern has its stride (CausalTransformerConfig's check)
        allowed &= (distance < stride) | (distance % stride == 0)
    elif pattern == "fixed":  # tensor % and floor division round towards -inf, like Python's: memory blocks line up
        assert stride is not None
        same_block = torch.div(key, stride, rounding_mode="floor") == torch.div(query, stride, rounding_mode="floor")
        allowed &= same_block | (key % stride >= stride - summary_columns)
    return allowed


def sinusoid_encodings(distances: Tensor, width: int) -> Tensor:
    """The Transformer's sinusoids of `distances` (n,): (n, width), sines then cosines at 1 / 10000^(2k / width)."""
    frequencies = 1.0 / 10000 ** (torch.arange(0, width, 2, device=distances.device, dtype=torch.float32) / width)
    angles = distances.float()[:, None] * frequencies[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_shift(scores: Tensor) -> Tensor:
    """Position scores against keys ordered by distance, (..., L, K) whose column k is distance K - 1 - k,
    moved so that column j is key j: distance (K - L) + i - j for query i (Transformer-XL's padding trick).

    Padding one zero column in front and reading the same memory as (K + 1, L) rows offsets row i by i places;
    entries right of the causal diagonal (negative distances) hold other rows' values, which the mask removes.
    """
    *leading, queries, keys = scores.shape
    padded = F.pad(scores, (1, 0)).view(*leading, keys + 1, queries)
    return padded[..., 1:, :].reshape(*leading, queries, keys)


class ResidualOutput(nn.Linear):
    """A projection whose output joins the residual stream: GPT-2 starts it smaller, by 1 / sqrt(2 x layers)."""


class RelativePositionBiases(nn.Module):
    """Transformer-XL's global biases, per head and shared by every layer: u (content) and v (position)."""

    def __init__(self, config: CausalTransformerConfig):
        super().__init__()
        heads = config.num_attention_heads
        shape = (heads, config.hidden_size // heads)
        self.content_bias = nn.Parameter(torch.zeros(shape))
        self.position_bias = nn.Parameter(torch.zeros(shape))


class CausalSelfAttention(nn.Module):
    """Multi-head attention over [memory ; own input] within the pattern, absolute or relative positions."""

    def __init__(self, config: CausalTransformerConfig):
        super().__init__()
        self.heads, self.head_size = config.num_attention_heads, config.hidden_size // config.num_attention_heads
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.position_projection = (
            nn.Linear(config.hidden_size, config.hidden_size, bias=False) if config.relative_positions else None
        )
        self.output = ResidualOutput(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_dropout

    def _split_heads(self, states: Tensor) -> Tensor:
        """(batch, length, hidden) -> (batch, heads, length, head size)."""
        batch, length, _ = states.shape
        return states.view(batch, length, self.heads, self.head_size).transpose(1, 2)

    def forward(
        self,
        hidden: Tensor,
        context: Tensor,
        allowed: Tensor,
        encodings: Tensor | None,
        biases: RelativePositionBiases | None,
    ) -> Tensor:
        """Attention of the (normalised) segment `hidden` over `context` = [memory ; hidden], normalised too.

        `encodings`: the sinusoids R of distances K-1 .. 0 (K keys), for relative positions; None for absolute ones.
        """
        width = hidden.shape[-1]
        weight, bias = self.query_key_value.weight, self.query_key_value.bias
        # Queries only for the segment; keys and values for the memory too.
        query = self._split_heads(F.linear(hidden, weight[:width], bias[:width]))
        key, value = F.linear(context, weight[width:], bias[width:]).split(width, dim=-1)
        key, value = self._split_heads(key), self._split_heads(value)
        if biases is None:
            scores = query @ key.transpose(-1, -2)
        else:
            # relative positions: the biases come with the position projection and the encodings R
            assert self.position_projection is not None and encodings is not None
            content = (query + biases.content_bias[:, None]) @ key.transpose(-1, -2)  # terms (a) and (c)
            positions = self.position_projection(encodings).view(-1, self.heads, self.head_size).permute(1, 2, 0)
            scores = content + relative_shift((query + biases.position_bias[:, None]) @ positions)  # (b) and (d)
        scores = scores.mul_(1 / math.sqrt(self.head_size)).masked_fill_(~allowed, float("-inf"))
        probabilities = scores.softmax(dim=-1)
        if self.training:
            probabilities = dropout(probabilities, self.attention_dropout)
        mixed = (probabilities @ value).transpose(1, 2).reshape(hidden.shape)
        return self.output(mixed)
