"""How big a language model a pretrain recipe asks for, checked before anything is allocated.

A typo such as `model.hidden=1048576` would otherwise end in an allocation failure deep inside
torch (or the kernel's out-of-memory killer) after the corpus has been read. The count is the
leading terms of each family's parameters: exact enough to tell a model that fits from one that
cannot (a refusal needs it to be off by orders of magnitude, not by a few percent).
"""

from __future__ import annotations

import os
from typing import Optional

from finetune.errors import UserError

# fp32 weights, their gradients and AdamW's two moments: 4 bytes each.
TRAINING_BYTES_PER_PARAMETER = 16


def language_model_parameters(model_config, vocabulary: int, max_positions: Optional[int]) -> int:
    """Approximate parameter count of a new language model of the recipe's family and sizes."""
    if model_config.family == "awd_lstm":
        sizes = [model_config.embedding_size] + [model_config.hidden] * (model_config.layers - 1) \
            + [model_config.embedding_size]
        # An LSTM layer from size a to size b: four gates over the input and the previous output, with biases.
        lstm = sum(4 * (inputs * outputs + outputs * outputs + 2 * outputs)
                   for inputs, outputs in zip(sizes, sizes[1:]))
        return vocabulary * model_config.embedding_size + lstm + vocabulary  # tied decoder: only its bias
    hidden = model_config.hidden
    intermediate = model_config.intermediate or 4 * hidden
    block = 4 * hidden * hidden + 2 * hidden * intermediate + 9 * hidden + intermediate  # attention, MLP, norms
    embeddings = (vocabulary + (max_positions or 0)) * hidden
    return embeddings + model_config.layers * block + hidden * hidden  # + the masked-LM head's transform


def physical_memory_bytes() -> Optional[int]:
    """The machine's memory, where the OS says (Linux, macOS); None elsewhere."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_model_fits_in_memory(recipe) -> None:
    """Refuse a new model whose weights, gradients and optimizer state alone exceed this machine's memory."""
    model = recipe.model
    if model.checkpoint is not None:  # its sizes come from a checkpoint that was loaded once already
        return
    memory = physical_memory_bytes()
    if memory is None:
        return
    vocabulary = recipe.tokenizer.vocab_size  # an upper bound: a trained tokenizer has at most this many pieces
    max_positions = getattr(model, "max_positions", None) or recipe.corpus.block_size
    parameters = language_model_parameters(model, vocabulary, max_positions if model.family != "awd_lstm" else None)
    needed = parameters * TRAINING_BYTES_PER_PARAMETER
    if needed > memory:
        sizes = ", ".join(f"model.{key}={getattr(model, key)}" for key in ("layers", "hidden", "embedding_size",
                                                                              "intermediate", "max_positions")
                          if getattr(model, key, None) is not None)
        raise UserError(f"{sizes} ask for ~{parameters / 1e9:,.1f} billion parameters, ~{needed / 2**30:,.0f} GiB "
                        f"with gradients and AdamW state; this machine has {memory / 2**30:,.0f} GiB: choose "
                        "smaller sizes")
