"""Causal language models: a GPT-2-style decoder, the next-token loss shared with the AWD-LSTM, and the AWD-LSTM's
activation regularisation (AR/TAR).

Both causal families train on (input_ids, labels) pairs whose labels are already the next tokens
(`labels[t] = stream[t + 1]`), so the loss needs no shift and no position is wasted at a block edge. Their decoder
and loss run fused (`linear_cross_entropy`): no (tokens x vocabulary) logits tensor is ever made.

GPT-2's training forward takes the route the masked LM's does (models/masked_lm.py), through the same
`GPT2LMHeadModel` parameters. Profiled on a 2-core CPU (4 layers, hidden 256, batch 32 x 128, vocabulary 16k,
one thread), Hugging Face's forward spent ~30% of the step outside matrix products on its GELU (`gelu_new`
written as seven elementwise passes over the 4 x hidden activations, each also saved for backward) and ~4% on
`bernoulli_` dropout masks. `decode` computes the same function with PyTorch's fused tanh-approximate GELU,
the integer-threshold dropout, and attention written out (SDPA takes its unfused path on CPU as soon as attention
dropout is on). Evaluation, autocast, bf16 and GPT-2 variants with other attention options keep Hugging Face's
forward, which is also the reference tests/models/test_causal_lm_route.py compares with.

The gpt2 family's own model with Transformer-XL memory or sparse attention (models/causal_transformer.py) trains
through `MemoryNextTokenLM`, which carries the memory from batch to batch as the AWD-LSTM's wrapper does its state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from finetune.models.adapters import carries_adapter
from finetune.models.awd_lstm import (
    AWDLSTMForCausalLM,
    HiddenState,
    activation_penalty,
    detach_hidden_state,
    hidden_state_from_names,
    named_hidden_state,
    with_gradient_of,
)
from finetune.models.causal_transformer import CausalTransformerForCausalLM
from finetune.models.cpu_dropout import dropout
from finetune.models.hub import refuse_other_model_type
from finetune.models.linear_cross_entropy import linear_cross_entropy
from finetune.models.loading import load_for_continued_pretraining
from finetune.models.masked_lm import MaskedLMOutput
from finetune.models.objectives import CarriedStateLoss, LanguageModelLoss


def build_causal_lm(model_config, vocab_size: int, max_positions: int, tokenizer) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 of the recipe's size (tied input/output embeddings, fused attention)."""
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_positions,
        n_embd=model_config.hidden,
        n_layer=model_config.layers,
        n_head=model_config.heads,
        n_inner=model_config.intermediate,  # the recipe fills in its default (4 x hidden, GPT-2's)
        resid_pdrop=model_config.dropout,
        embd_pdrop=model_config.dropout,
        attn_pdrop=model_config.dropout,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")


def load_causal_lm(name: str, dropout: float | None = None) -> GPT2LMHeadModel:
    """A pretrained GPT-2-family checkpoint to continue training on new text."""
    return load_for_continued_pretraining(
        GPT2LMHeadModel,
        name,
        dropout,
        lambda config: ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
        lambda config: refuse_other_model_type(config, "gpt2", name, "model.family gpt2 continues causal LMs"),
        attn_implementation="sdpa",
    )


# Activations `decode` computes with PyTorch's fused GELU (tanh approximation: GPT-2's own, "gelu_new").
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")


def has_fast_route(model: GPT2LMHeadModel) -> bool:
    """Whether `decode` computes this GPT-2's training forward: fp32, self-attention only, GPT-2's default
    attention scaling and a GELU, no LoRA adapter (its direct weight reads would skip one); other options take
    Hugging Face's forward."""
    config = model.config
    return (
        model.dtype == torch.float32
        and not carries_adapter(model)
        and not config.add_cross_attention
        and config.scale_attn_weights
        and not config.scale_attn_by_inverse_layer_idx
        and not config.reorder_and_upcast_attn
        and config.activation_function in (*_TANH_GELU, "gelu")
    )


def decode(transformer: GPT2Model, input_ids: torch.Tensor) -> torch.Tensor:
    """`GPT2Model`'s forward for training on blocks without padding (no attention mask, positions 0..n-1),
    written out: the final LayerNorm's output, (batch, length, hidden). Dropout always on (training)."""
    config = transformer.config
    length = input_ids.shape[1]
    hidden = dropout(transformer.wte(input_ids) + transformer.wpe.weight[:length], config.embd_pdrop)
    # True above the diagonal: the future positions a token may not attend to.
    future = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).triu_(1)
    approximate = "tanh" if config.activation_function in _TANH_GELU else "none"
    for block in transformer.h:
        assert isinstance(block, GPT2Block)  # GPT2Model's blocks (ModuleList items are typed nn.Module)
        hidden = hidden + _attention(block.attn, block.ln_1(hidden), future, config)
        mlp = block.mlp
        inner = F.gelu(_conv1d(mlp.c_fc, block.ln_2(hidden)), approximate=approximate)
        hidden = hidden + dropout(_conv1d(mlp.c_proj, inner), config.resid_pdrop)
    return transformer.ln_f(hidden)


def _conv1d(layer, inputs: torch.Tensor) -> torch.Tensor:
    """Hugging Face's `Conv1D` (a linear layer storing its weight as (in, out)): bias + inputs @ weight."""
    return torch.addmm(layer.bias, inputs.reshape(-1, inputs.shape[-1]), layer.weight).view(
        *inputs.shape[:-1], layer.weight.shape[1]
    )


def _attention(attention, hidden: torch.Tensor, future: torch.Tensor, config) -> torch.Tensor:
    """Causal multi-head self-attention of one block, output projection and residual dropout included."""
    batch, length, width = hidden.shape
    qkv = _conv1d(attention.c_attn, hidden).view(batch, length, 3, attention.num_heads, attention.head_dim)
    query, key, value = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, length, head size)
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(attention.scaling).masked_fill_(future, float("-inf"))
    context = torch.matmul(dropout(scores.softmax(dim=-1), config.attn_pdrop), value)
    context = context.transpose(1, 2).reshape(batch, length, width)
    return dropout(_conv1d(attention.c_proj, context), config.resid_pdrop)


class NextTokenLM(LanguageModelLoss):
    """A GPT-2 whose forward returns the next-token loss, so that DDP sees (and syncs) the real forward."""

    def __init__(self, causal_lm: GPT2LMHeadModel):
        super().__init__()
        self.causal_lm = causal_lm

    @property
    def language_model(self) -> GPT2LMHeadModel:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.causal_lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> MaskedLMOutput:
        model = self.causal_lm
        if model.training and has_fast_route(model) and not torch.is_autocast_enabled(input_ids.device.type):
            hidden = decode(model.transformer, input_ids)
        else:
            hidden = model.transformer(input_ids=input_ids).last_hidden_state
        head = model.lm_head
        return linear_cross_entropy(hidden, head.weight, head.bias, labels, count_correct=not self.training)


class RecurrentNextTokenLM(CarriedStateLoss):
    """An AWD-LSTM whose forward returns the next-token loss and carries its recurrent state to the next batch.

    Truncated BPTT: row i of each batch continues row i of the previous one, so the state flows on,
    cut from the graph so that gradients stop at the batch edge. While training, the loss's gradient also
    carries the activation penalties AR and TAR (`activation_penalty`); its value stays the cross-entropy.
    """

    def __init__(
        self,
        lstm_lm: AWDLSTMForCausalLM,
        activation_regularization: float = 0.0,
        temporal_activation_regularization: float = 0.0,
    ):
        super().__init__()
        self.lstm_lm = lstm_lm
        self.state: HiddenState | None  # one tuple per layer (models/recurrent_cells.py); None at the start
        # fastai's alpha and beta (its TextLearner's defaults are 2 and 1; 0 turns either off).
        self.activation_regularization = activation_regularization
        self.temporal_activation_regularization = temporal_activation_regularization

    @property
    def language_model(self) -> nn.Module:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.lstm_lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> MaskedLMOutput:
        # AWDLSTMForCausalLM.forward, with the decoder and the loss fused (no logits tensor).
        language_model = self.lstm_lm
        encoded = language_model.awd_lstm(input_ids, hidden_state=self.state)
        self.state = detach_hidden_state(encoded.hidden_state)
        dropped = language_model.output_dropout(encoded.last_hidden_state)
        decoder = language_model.decoder
        loss, count, correct = linear_cross_entropy(
            dropped, decoder.weight, decoder.bias, labels, count_correct=not self.training
        )
        alpha, beta = self.activation_regularization, self.temporal_activation_regularization
        if self.training and (alpha or beta):  # as fastai: never in validation
            penalty = activation_penalty(encoded.last_hidden_state, dropped, alpha, beta)
            loss = with_gradient_of(loss, penalty)
        return loss, count, correct

    def carried_state(self) -> dict[str, torch.Tensor]:
        """The state as named tensors, to save in a checkpoint."""
        return named_hidden_state(self.lstm_lm, self.state)

    def restore_carried_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Put back a state saved by `carried_state` (other tensors saved beside it, e.g. the loop's, are ignored)."""
        self.state = hidden_state_from_names(self.lstm_lm, tensors)


class MemoryNextTokenLM(CarriedStateLoss):
    """Our causal transformer (models/causal_transformer.py) whose forward returns the next-token loss and, with
    Transformer-XL's memory, carries the last `memory_length` states of every layer to the next batch.

    The memory is cut from the graph (gradients stop at the batch edge), and dropped when a batch has another size.
    `memory_length` defaults to the config's; validation may read with a longer one (`segment_validation`).
    Without memory (a sparse-attention GPT-2) the state stays None and batches are independent blocks.
    """

    def __init__(self, causal_transformer: CausalTransformerForCausalLM, memory_length: int | None = None):
        super().__init__()
        self.causal_transformer = causal_transformer
        self.memory_length = causal_transformer.config.memory_length if memory_length is None else memory_length
        self.state: tuple[torch.Tensor, ...] | None  # one (batch, remembered, hidden) tensor per layer

    @property
    def language_model(self) -> nn.Module:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.causal_transformer

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> MaskedLMOutput:
        model = self.causal_transformer
        encoded = model.transformer(input_ids, memory=self.state, memory_length=self.memory_length)
        self.state = encoded.memory
        head = model.lm_head
        return linear_cross_entropy(
            encoded.last_hidden_state, head.weight, head.bias, labels, count_correct=not self.training
        )

    def carried_state(self) -> dict[str, torch.Tensor]:
        """The memory as named tensors, to save in a checkpoint."""
        return {f"memory_{layer}": tensor for layer, tensor in enumerate(self.state or ())}

    def restore_carried_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Put back a memory saved by `carried_state` (other tensors saved beside it are ignored)."""
        layers = sum(name.startswith("memory_") for name in tensors)
        self.state = tuple(tensors[f"memory_{layer}"] for layer in range(layers)) or None
