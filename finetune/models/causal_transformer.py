"""A GPT-2-style causal transformer with Transformer-XL's segment memory and the Sparse Transformer's attention
patterns: the model `model.family: gpt2` builds when a recipe sets `model.memory_length` or `model.attention`.

Blocks are GPT-2's (pre-LayerNorm, tanh-GELU feed-forward, a final LayerNorm, the decoder tied to the token
embedding); attention is where the two options differ from GPT2LMHeadModel, which plain recipes keep:

- Transformer-XL (Dai et al. 2019), `memory_length` M > 0. Each layer reads its keys and values from
  [SG(memory) ; its own input], the memory being the last M states that entered the same layer in earlier segments
  of the stream, cut from the graph (gradients stop at the segment edge, as in truncated BPTT). Positions are
  relative, with no absolute table: score(i, j) = (q_i + u).k_j + (q_i + v).W_R R_{i-j}, the paper's four terms
  (content, content-position, global content bias u, global position bias v) in two products; R is the sinusoid
  of the distance i - j, W_R one projection per layer, u and v learned per head and shared by all layers. A model
  trained with M and segments of L tokens can be read with other M and L
  (`inference.language_model_validation.segment_validation`).
- Sparse Transformer (Child et al. 2019), `attention_pattern` strided or fixed with stride S. Query i attends to
  key j <= i where
    strided: (i - j) < S or (i - j) % S == 0             (the last S positions, then every S-th before),
    fixed:   j // S == i // S or j % S >= S - c           (its own block of S, and the last c "summary" positions
                                                           of every block; c = `summary_columns`, 1 by default).
  Every head attends to the union of the two sub-patterns: the paper's "merged head" (its second way of
  integrating factorised attention; the first alternates patterns between layers, the third splits heads). Two
  layers then connect every position to every earlier one (a hop along the strides or summaries, then one inside
  a window or block), and the heads stay interchangeable, so nothing depends on the head count. With a memory the
  pattern is read on positions in the stream (memory positions are negative), so the recipe's stride must divide
  the segment length.

The patterns are boolean masks on the written-out (query x key) scores: at these sizes that is simple and exact,
but it computes every score and then discards most of them, so it saves no time or memory (bench/README.md has a
timing). A production version would compute only the allowed blocks with block-sparse kernels (the paper's,
DeepSpeed's sparse attention, or PyTorch's FlexAttention with a BlockMask), which is where the paper's
O(n sqrt(n)) cost comes from.

Importing this module registers model type "finetune_causal_transformer" with AutoConfig, AutoModel and
AutoModelForCausalLM, so a folder written by `save_pretrained` loads with `AutoModelForCausalLM.from_pretrained`
and never as a dense GPT2LMHeadModel. Checkpoint format:

- config.json: "model_type": "finetune_causal_transformer", vocab_size, hidden_size, num_hidden_layers,
  num_attention_heads, intermediate_size, dropout, attention_dropout, layer_norm_epsilon, initializer_range,
  relative_positions, max_position_embeddings, memory_length, attention_pattern, attention_stride,
  summary_columns, tie_word_embeddings, bos/eos/pad_token_id.
- model.safetensors (CausalTransformerForCausalLM; the bare model writes the same names without "transformer."):
  transformer.token_embedding.weight                       (vocab_size, hidden)
  transformer.position_embedding.weight                    (max_position_embeddings, hidden), learned positions only
  transformer.relative_position_biases.content_bias, .position_bias   (heads, head size): u and v, relative only
  transformer.layers.{i}.attention_norm.weight, .bias      (hidden,)
  transformer.layers.{i}.attention.query_key_value.weight  (3 x hidden, hidden), rows: queries, keys, values
  transformer.layers.{i}.attention.query_key_value.bias    (3 x hidden,)
  transformer.layers.{i}.attention.position_projection.weight   (hidden, hidden): W_R, relative only
  transformer.layers.{i}.attention.output.weight, .bias    (hidden, hidden), (hidden,)
  transformer.layers.{i}.feed_forward_norm.weight, .bias   (hidden,)
  transformer.layers.{i}.feed_forward_in.weight, .bias     (intermediate, hidden), (intermediate,)
  transformer.layers.{i}.feed_forward_out.weight, .bias    (hidden, intermediate), (hidden,)
  transformer.final_norm.weight, .bias                     (hidden,)
  lm_head.weight only when tie_word_embeddings is false (tied, it is the token embedding, stored once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from finetune.models.causal_attention import (
    CausalSelfAttention,
    RelativePositionBiases,
    ResidualOutput,
    attention_pattern,
    sinusoid_encodings,
)
from finetune.models.causal_transformer_config import CAUSAL_TRANSFORMER_TYPE, CausalTransformerConfig, Memory
from finetune.models.cpu_dropout import dropout
from finetune.models.generation import StatefulGenerationMixin, refuse_padding


@dataclass
class CausalTransformerOutput(ModelOutput):
    """The final LayerNorm's output and the memory to pass with the next segment of the same streams."""

    last_hidden_state: Tensor | None = None
    memory: Memory | None = None


@dataclass
class CausalTransformerLMOutput(ModelOutput):
    """Language-model output: loss (when labels are given), logits, and the memory for the next segment."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    memory: Memory | None = None


class CausalTransformerBlock(nn.Module):
    """GPT-2's pre-LayerNorm block: x + attention(LN(x)), then x + feed-forward(LN(x)), dropout on each branch."""

    def __init__(self, config: CausalTransformerConfig):
        super().__init__()
        inner = config.intermediate_size or 4 * config.hidden_size
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.attention = CausalSelfAttention(config)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.feed_forward_in = nn.Linear(config.hidden_size, inner)
        self.feed_forward_out = ResidualOutput(inner, config.hidden_size)
        self.dropout = config.dropout

    def _dropped(self, branch: Tensor) -> Tensor:
        return dropout(branch, self.dropout) if self.training else branch

    def forward(
        self,
        hidden: Tensor,
        memory: Tensor | None,
        allowed: Tensor,
        encodings: Tensor | None,
        biases: RelativePositionBiases | None,
    ) -> Tensor:
        normalised = self.attention_norm(hidden)
        # The memory is normalised by this layer's own norm, as the segment is: one LayerNorm of [memory ; hidden].
        context = normalised if memory is None else torch.cat([self.attention_norm(memory.detach()), normalised], 1)
        hidden = hidden + self._dropped(self.attention(normalised, context, allowed, encodings, biases))
        inner = F.gelu(self.feed_forward_in(self.feed_forward_norm(hidden)), approximate="tanh")
        return hidden + self._dropped(self.feed_forward_out(inner))


class CausalTransformerPreTrainedModel(PreTrainedModel):
    """Shared transformers plumbing: config class, weight prefix and GPT-2's initialisation."""

    config_class = CausalTransformerConfig
    config: CausalTransformerConfig
    base_model_prefix = "transformer"
    _input_embed_layer = "token_embedding"  # where transformers' get/set_input_embeddings look
    main_input_name = "input_ids"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2's: normal(0, 0.02) weights, zero biases, unit LayerNorms; residual outputs scaled by 1/sqrt(2N)."""
        std = self.config.initializer_range
        if isinstance(module, ResidualOutput):  # two residual branches per block
            std = std / math.sqrt(2 * self.config.num_hidden_layers)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:  # an embedding has no bias
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, RelativePositionBiases):
            init.zeros_(module.content_bias)
            init.zeros_(module.position_bias)


class CausalTransformerModel(CausalTransformerPreTrainedModel):
    """The decoder stack: token embedding (plus a position table without relative positions), blocks, final norm."""

    def __init__(self, config: CausalTransformerConfig):
        super().__init__(config)
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = (
            None if config.relative_positions else nn.Embedding(config.max_position_embeddings, config.hidden_size)
        )
        self.relative_position_biases = RelativePositionBiases(config) if config.relative_positions else None
        self.layers = nn.ModuleList(CausalTransformerBlock(config) for _ in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        memory: Memory | None = None,
        memory_length: int | None = None,
        attention_mask: Tensor | None = None,
        first_position: int = 0,
        **kwargs,
    ) -> CausalTransformerOutput:
        """Encode (batch, length) token ids that continue the streams `memory` was taken from (None: their start).

        `memory_length`: positions to remember for the next segment (default: the config's; a longer one reads
        with a longer context than training had). A memory of another batch size is dropped, as the AWD-LSTM's
        state is, so a short last batch works. `attention_mask` is accepted for tokenizer outputs and ignored:
        reading left to right, right padding changes no real position. `first_position`: where the segment starts
        in the stream (generation, whose memory holds the whole text before it; 0 in training, whose segments
        start at multiples of the stride).
        """
        config = self.config
        memory_length = config.memory_length if memory_length is None else memory_length
        if memory is not None and (memory_length == 0 or memory[0].shape[0] != input_ids.shape[0]):
            memory = None
        length = input_ids.shape[1]
        remembered = 0 if memory is None else memory[0].shape[1]
        hidden = self.token_embedding(input_ids)
        encodings = None
        if self.position_embedding is not None:
            if first_position + length > config.max_position_embeddings:
                raise ValueError(
                    f"{first_position + length} tokens exceed the {config.max_position_embeddings} learned positions"
                )
            hidden = hidden + self.position_embedding.weight[first_position : first_position + length]
        else:  # the distances of the keys, farthest first (the order relative_shift expects)
            distances = torch.arange(remembered + length - 1, -1, -1, device=input_ids.device)
            encodings = sinusoid_encodings(distances, config.hidden_size).to(hidden.dtype)
            if self.training:
                encodings = dropout(encodings, config.attention_dropout)
        if self.training:
            hidden = dropout(hidden, config.dropout)
        allowed = attention_pattern(
            config.attention_pattern,
            config.attention_stride,
            config.summary_columns,
            length,
            remembered,
            input_ids.device,
            first_position,
        )
        next_memory = []
        for index, layer in enumerate(self.layers):
            past = None if memory is None else memory[index]
            if memory_length:  # what entered this layer, for the next segment: cut from the graph (stop-gradient)
                states = hidden if past is None else torch.cat([past, hidden], dim=1)
                next_memory.append(states[:, -memory_length:].detach())
            hidden = layer(hidden, past, allowed, encodings, self.relative_position_biases)
        return CausalTransformerOutput(last_hidden_state=self.final_norm(hidden), memory=tuple(next_memory) or None)


class CausalTransformerForCausalLM(CausalTransformerPreTrainedModel, StatefulGenerationMixin):
    """The decoder stack with a language-model head tied to the token embedding.

    `generate` carries the memory from step to step, grown to every position read so far: each new token is one
    segment whose queries see the whole text before it, as a forward over all of it would (keys and values are
    computed again from the memory at every step, as Transformer-XL reads segments: a cost growing with the text,
    where a key/value cache would keep them).
    """

    # No ClassVar: PreTrainedModel declares it an instance attribute.
    _tied_weights_keys = {"lm_head.weight": "transformer.token_embedding.weight"}  # noqa: RUF012
    state_keyword = "memory"

    def __init__(self, config: CausalTransformerConfig):
        super().__init__(config)
        self.transformer = CausalTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()  # ties lm_head.weight to the embedding when config.tie_word_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        memory: Memory | None = None,
        memory_length: int | None = None,
        attention_mask: Tensor | None = None,
        first_position: int = 0,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalTransformerLMOutput:
        """Logits for every position (the last `logits_to_keep` only, when given) and the next memory; with `labels`
        (usually the input ids) the next-token loss, shifted inside as everywhere in transformers."""
        encoded = self.transformer(input_ids, memory=memory, memory_length=memory_length, first_position=first_position)
        hidden = encoded.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalTransformerLMOutput(loss=loss, logits=logits, memory=encoded.memory)

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        memory: Memory | None = None,
        use_cache: bool = True,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> dict:
        """The tokens the memory does not hold yet, placed after it; the next memory keeps every position."""
        refuse_padding(attention_mask, type(self).__name__)
        read = memory[0].shape[1] if memory is not None and use_cache else 0
        return {
            "input_ids": input_ids[:, read:].to(self.device),
            "memory": memory if read else None,
            "first_position": read,
            "memory_length": input_ids.shape[1] if use_cache else 0,
            "logits_to_keep": logits_to_keep,
        }


def build_causal_transformer(
    model_config, vocab_size: int, max_positions: int, tokenizer
) -> CausalTransformerForCausalLM:
    """A randomly initialised model of a gpt2 recipe with `memory_length` or a sparse `attention` (sizes as GPT-2's)."""
    config = CausalTransformerConfig(
        vocab_size=vocab_size,
        hidden_size=model_config.hidden,
        num_hidden_layers=model_config.layers,
        num_attention_heads=model_config.heads,
        intermediate_size=model_config.intermediate,
        dropout=model_config.dropout,
        attention_dropout=model_config.dropout,
        relative_positions=model_config.memory_length > 0,  # a sparse GPT-2 without memory keeps GPT-2's table
        max_position_embeddings=max_positions,
        memory_length=model_config.memory_length,
        attention_pattern=model_config.attention,
        attention_stride=model_config.attention_stride,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return CausalTransformerForCausalLM._from_config(config)


AutoConfig.register(CAUSAL_TRANSFORMER_TYPE, CausalTransformerConfig, exist_ok=True)
AutoModel.register(CausalTransformerConfig, CausalTransformerModel, exist_ok=True)
AutoModelForCausalLM.register(CausalTransformerConfig, CausalTransformerForCausalLM, exist_ok=True)
