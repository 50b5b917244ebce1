"""Validation of language models: the metrics every pretraining run logs, and a saved gpt2-family model read at other
segment and memory lengths than it trained with (`segment_validation`: Transformer-XL's evaluation at a longer
context, bench/lm_families.py --long-context)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from finetune.console import phase_bar
from finetune.data.causal import BPTTBatches
from finetune.data.token_cache import tokenize_files
from finetune.errors import UserError
from finetune.models.causal_lm import MemoryNextTokenLM, NextTokenLM
from finetune.models.causal_transformer import CausalTransformerForCausalLM
from finetune.models.hub import load_model, load_tokenizer, resolve_checkpoint
from finetune.models.language_models import ACCURACY_NAME


@torch.no_grad()
def validation_metrics(accelerator, model, loader, accuracy_name: str) -> dict[str, float]:
    """Validation loss (per labelled token), perplexity and accuracy over all processes."""
    model.eval()
    totals = torch.zeros(3, device=accelerator.device)  # summed loss, labelled tokens, correct
    network = accelerator.unwrap_model(model)  # not through DDP: processes may hold different numbers of batches
    with network.fresh_state(), phase_bar("evaluating", len(loader), accelerator.is_main_process) as advance:
        for batch in loader:  # a recurrent model reads validation from a clean state (fresh_state)
            loss, count, correct = network(batch["input_ids"].to(accelerator.device),
                                           batch["labels"].to(accelerator.device))
            totals += torch.stack([loss.float() * count, count.float(), correct.float()])
            advance()
    totals = accelerator.reduce(totals, reduction="sum")
    loss = (totals[0] / totals[1].clamp(min=1)).item()
    return {"validation_loss": loss, "validation_perplexity": math.exp(min(loss, 50.0)),
            accuracy_name: (totals[2] / totals[1].clamp(min=1)).item()}


def segment_validation(checkpoint: str | Path, validation_files: list[Path], segment_length: int,
                       memory_length: int | None = None, rows: int = 16, device: str = "cpu") -> dict[str, float]:
    """A saved gpt2-family model's validation metrics on `validation_files` read as BPTT segments of
    `segment_length` tokens, with `memory_length` remembered positions per layer (Transformer-XL; default: the
    model's own): e.g. longer segments or a longer memory than training had, as Transformer-XL is evaluated.

    The text is cut into `rows` streams (fewer for a short text) read in order from an empty memory, as validation
    in a run is; a GPT-2 or a sparse model without memory reads every segment on its own. Nothing is cached.
    """
    source = resolve_checkpoint(str(checkpoint), "checkpoint")
    model = load_model(AutoModelForCausalLM, source, "checkpoint")
    config = model.config
    if isinstance(model, CausalTransformerForCausalLM):
        if memory_length and not config.relative_positions:
            raise UserError(f"memory_length: {checkpoint} was trained without memory (learned absolute positions)")
        network = MemoryNextTokenLM(model, memory_length)
    elif config.model_type == "gpt2" and not memory_length:
        network = NextTokenLM(model)
    else:
        raise UserError(f"checkpoint: {checkpoint} is a '{config.model_type}' model; segment validation reads gpt2 "
                        "family models (memory_length: those trained with model.memory_length)")
    stride = getattr(config, "attention_stride", None)
    if stride is not None and segment_length % stride:
        raise UserError(f"segment_length {segment_length}: the attention stride {stride} must divide it")
    positions = None if getattr(config, "relative_positions", False) else config.max_position_embeddings
    if positions is not None and segment_length > positions:
        raise UserError(f"segment_length {segment_length} exceeds the {positions} positions of {checkpoint}")
    tokenizer = load_tokenizer(str(checkpoint), "checkpoint")
    tokens = tokenize_files(tokenizer, validation_files, None, show_progress=False, name="the validation text")
    streams = BPTTBatches.rows_that_fit(tokens, segment_length, 1, rows)
    segments = BPTTBatches(tokens, tokenizer.eos_token_id, streams, segment_length, seed=0, shuffle=False,
                           name="the validation text")
    accelerator = Accelerator(cpu=device == "cpu")
    return validation_metrics(accelerator, network.to(accelerator.device), DataLoader(segments, batch_size=None),
                              ACCURACY_NAME["gpt2"])
