"""How big a model a recipe asks for, and how much memory training it takes, known before anything is allocated.

A typo such as `model.hidden=1048576` would otherwise end in an allocation failure deep inside
torch (or the kernel's out-of-memory killer) after the corpus has been read (the stage refuses it:
stages/pretrain.py, check_model_fits_in_memory). The parameters are
counted exactly, on a model built on PyTorch's meta device (shapes without storage, so any size is
counted at once); `finetune profile` counts its models the same way. Activations can only be estimated.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from finetune.models.language_models import VocabularyOfSize, build_language_model

BYTES_PER_VALUE = 4  # fp32: weights, gradients and optimizer state stay fp32 under mixed precision too
# fp32 weights, their gradients and AdamW's two moments: 4 bytes each.
TRAINING_BYTES_PER_PARAMETER = 4 * BYTES_PER_VALUE


def parameter_count(model: nn.Module) -> int:
    """Parameters of a model, each tied (shared) tensor once."""
    return sum(parameter.numel() for parameter in model.parameters())


def language_model_parameters(model_config, vocabulary: int, max_positions: int | None) -> int:
    """Exact parameter count of a new language model of the recipe's family and sizes (built on the meta device)."""
    with torch.device("meta"):
        return parameter_count(build_language_model(model_config, VocabularyOfSize(vocabulary), max_positions))


def transformer_layer_activation_bytes(tokens: int, seq_len: int, hidden: int, intermediate: int, heads: int) -> float:
    """A rough estimate of what one transformer layer keeps for its backward pass over `tokens` tokens, in fp32.

    Korthikanti et al. (2022) count 34·s·b·h + 5·a·s²·b bytes per layer with 16-bit values and a 4h feed-forward
    (attention 11 sbh + 5 as²b, feed-forward 19 sbh, norms 4 sbh); with any feed-forward size that is
    18 h + 4 i + 5 a s bytes per token, doubled here for 32-bit values. Dropout masks, fused kernels and the
    allocator's rounding move the real figure either way.
    """
    return 2 * tokens * (18 * hidden + 4 * intermediate + 5 * heads * seq_len)


def lstm_layer_activation_bytes(tokens: int, inputs: int, outputs: int) -> float:
    """A rough estimate of what one LSTM layer keeps for its backward pass over `tokens` tokens, in fp32: per token
    its input, the four gates, the cell, the cell's tanh and the output."""
    return BYTES_PER_VALUE * tokens * (inputs + 7 * outputs)


def physical_memory_bytes() -> int | None:
    """The machine's memory, where the OS says (Linux, macOS); None elsewhere."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
