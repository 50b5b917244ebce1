"""Training FLOPs of the model families, and the machine's matrix-product rate they are measured against.

One place for both, shared by `finetune profile` (what a recipe will cost) and bench/mlm_pretrain.py (the MFU a
run reached). The counts are the standard ones (Kaplan et al. 2020, PaLM's appendix B): every weight matrix
costs one multiply-add per token it reads, an attention layer 2 x seq x width more (its scores and the mixing of
the values), embedding lookups nothing; biases, norms and activations are left out. A multiply-add is 2 FLOPs
forward and 4 backward (the gradients of the input and of the weight): training costs 6 per multiply-add, a frozen
group below every trainable one only its forward 2 (autograd runs no backward there). Attention is counted over
the whole sequence, for causal models too (as PaLM's 6N + 12 L H Q T), and for ModernBERT's local-window layers;
DeBERTa's relative-position terms are not counted.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from transformers import PreTrainedModel

from finetune.models.families import is_recurrent
from finetune.models.mean_pooling import backbone_config

TRAINING_FLOPS_PER_MULTIPLY_ADD = 6  # forward 2, backward 4
FORWARD_FLOPS_PER_MULTIPLY_ADD = 2


def training_flops_per_token(
    layers: int,
    hidden: int,
    seq_len: int,
    vocab: int,
    masked_fraction: float,
    sparse_decoder: bool,
    head_transform: bool = True,
) -> float:
    """Forward+backward FLOPs per token of a transformer LM (feed-forward 4 x hidden), decoder work counted only
    where it is useful.

    Per layer: QKV and output projections 4h^2, feed-forward 8h^2, attention scores and mixing 2*s*h.
    The MLM head (transform h^2 + vocabulary projection h*V) is useful only at masked positions,
    so MFU counts it there alone, for both sides; `sparse_decoder` only affects the reported
    executed FLOPs. A causal LM (GPT-2) has no head transform (`head_transform=False`) and predicts at every
    position (`masked_fraction=1`). (The benchmarks' figure; `multiply_adds_per_token` counts any built model.)
    """
    per_layer = 12 * hidden**2 + 2 * seq_len * hidden
    head = (hidden**2 if head_transform else 0) + hidden * vocab
    decoded = masked_fraction if sparse_decoder else 1.0
    return TRAINING_FLOPS_PER_MULTIPLY_ADD * (layers * per_layer + decoded * head)


def lookup_tables(model: nn.Module) -> set[int]:
    """ids of the embedding tables: read by index, no multiply-add (a tied decoder is counted on its own)."""
    return {id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)}


def matrix_multiply_adds(parameters: list[nn.Parameter], lookups: set[int]) -> int:
    """Multiply-adds per token of the weight matrices among `parameters` (linear and convolution weights)."""
    return sum(parameter.numel() for parameter in parameters if parameter.dim() >= 2 and id(parameter) not in lookups)


def multiply_adds_per_token(
    model: nn.Module,
    groups: list[list[nn.Parameter]],
    seq_len: int,
    top_fraction: float,
    blocks: slice,
    layer_terms: bool = True,
) -> list[float]:
    """Multiply-adds per token of each layer group (bottom to top) of a built model (the meta device will do).

    `blocks`: the groups that are layers (transformer blocks or LSTM layers); in a transformer each also gets the
    attention term, and shared weights (ALBERT) count once per layer that applies them. The top group (a task head,
    or a language model's head with its decoder, tied or not) reads `top_fraction` of the tokens: 1 / seq_len for a
    classifier's head (once per example), the masked fraction for a sparse masked-LM decoder, 1 for a causal LM.
    `layer_terms=False` counts the weights of `groups` alone: no attention term, no tied decoder (what an adapter
    trains of a model's groups).
    """
    assert isinstance(model, PreTrainedModel)  # every stage's model is a Hugging Face one (its config read here)
    config = backbone_config(model.config)
    lookups = lookup_tables(model)
    counts = [float(matrix_multiply_adds(group, lookups)) for group in groups]
    layer_indices = range(len(groups))[blocks]
    recurrent = is_recurrent(config)
    layers = getattr(config, "num_layers" if recurrent else "num_hidden_layers")
    repeats = layers / len(layer_indices)  # 1, but for weights shared across layers (ALBERT's layer groups)
    for index in layer_indices:
        counts[index] *= repeats
        if not recurrent and layer_terms:
            counts[index] += repeats * 2 * seq_len * config.hidden_size  # scores q.k and the mixing of v
    decoder = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if layer_terms and decoder is not None and id(decoder.weight) in lookups:  # tied to the input embedding
        counts[-1] += decoder.weight.numel()
    counts[-1] *= top_fraction
    return counts


def training_flops(multiply_adds: list[float], trainable_groups: int) -> float:
    """Forward and backward FLOPs per token with the top `trainable_groups` groups trainable (the rest frozen below)."""
    frozen = len(multiply_adds) - trainable_groups
    return sum(
        (FORWARD_FLOPS_PER_MULTIPLY_ADD if index < frozen else TRAINING_FLOPS_PER_MULTIPLY_ADD) * count
        for index, count in enumerate(multiply_adds)
    )


def adapter_training_flops(multiply_adds: list[float], trained: list[float], first_trainable: int) -> float:
    """Forward and backward FLOPs per token of a model with an adapter, whose groups hold frozen weights beside
    the trained ones (`trained`: their multiply-adds per group): every multiply-add forward (2), the gradient of the
    input through the groups from `first_trainable` up (2), the weight gradient of the trained ones there (2)."""
    return sum(
        FORWARD_FLOPS_PER_MULTIPLY_ADD * count
        + (FORWARD_FLOPS_PER_MULTIPLY_ADD * (count + own) if index >= first_trainable else 0)
        for index, (count, own) in enumerate(zip(multiply_adds, trained))
    )


def cpu_model() -> str:
    """The CPU's model name, as a figure measured on it should say (platform.processor() is empty on most Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def matmul_gflops(
    size: int | None = None, repeats: int = 20, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> float:
    """The machine's matmul rate (GFLOP/s) with torch's current threads: the denominator of MFU.

    `size` None: 1024 on a CPU, 8192 on a GPU. A GPU runs a 1024 product in microseconds, about its launch cost,
    so small products measure the launches: on an H100 they gave 93 TFLOP/s in bf16 where 8192 gives ~800."""
    size = size or (1024 if device == "cpu" else 8192)
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()  # GPU products are queued: wait for the last one before reading the clock
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9
