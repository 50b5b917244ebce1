"""Validation of language models: the metrics every pretraining run logs, a saved gpt2-family model read at other
segment and memory lengths than it trained with (`segment_validation`: Transformer-XL's evaluation at a longer
context, bench/lm_families.py --long-context), and `finetune score`: nats per token of a text file under any causal
checkpoint (`score_text`), through the same validation code."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoModelForCausalLM, GPT2LMHeadModel

from finetune.console import phase_bar
from finetune.data.causal import BPTTBatches
from finetune.data.corpus import DOCUMENT_KINDS
from finetune.data.reverse import read_backwards, reads_backwards
from finetune.data.token_arrays import DocumentStream, TokenizedDocuments
from finetune.data.token_cache import tokenize_files
from finetune.errors import UserError, recipe_key
from finetune.models.auto_lm import AutoNextTokenLM
from finetune.models.awd_lstm import AWDLSTMForCausalLM
from finetune.models.causal_lm import MemoryNextTokenLM, NextTokenLM, RecurrentNextTokenLM
from finetune.models.causal_transformer import CausalTransformerForCausalLM
from finetune.models.families import CAUSAL_MODEL_TYPES, GPT2, reads_next_tokens
from finetune.models.hub import load_pretrained, load_tokenizer, resolve_checkpoint
from finetune.models.loading import load_model
from finetune.models.ngram import NGramForCausalLM, NGramNextTokenLM
from finetune.models.objectives import LanguageModelLoss
from finetune.training.checkpoints import trained_document_kind

UNBOUNDED_SEGMENT_LENGTH = 1024  # score's segments for a model without a position table (its state is carried)


@torch.no_grad()
def validation_metrics(accelerator, model, loader, accuracy_name: str) -> dict[str, float]:
    """Validation loss (per labelled token), perplexity and accuracy over all processes."""
    model.eval()
    totals = torch.zeros(3, device=accelerator.device)  # summed loss, labelled tokens, correct
    network = accelerator.unwrap_model(model)  # not through DDP: processes may hold different numbers of batches
    with network.fresh_state(), phase_bar("evaluating", len(loader), accelerator.is_main_process) as advance:
        for batch in loader:  # a recurrent model reads validation from a clean state (fresh_state)
            loss, count, correct = network(
                batch["input_ids"].to(accelerator.device), batch["labels"].to(accelerator.device)
            )
            totals += torch.stack([loss.float() * count, count.float(), correct.float()])
            advance()
    totals = accelerator.reduce(totals, reduction="sum")
    loss = (totals[0] / totals[1].clamp(min=1)).item()
    return {
        "validation_loss": loss,
        "validation_perplexity": math.exp(min(loss, 50.0)),
        accuracy_name: (totals[2] / totals[1].clamp(min=1)).item(),
    }


def language_model_loss(model, memory_length: int | None = None) -> LanguageModelLoss:
    """A loaded causal model behind validation's contract (models/objectives.py), read as its pretraining validated
    it: the causal transformer with its memory (`memory_length`: the config's by default), the AWD-LSTM with its
    state carried (no AR/TAR: they only train), the n-gram model, GPT-2, a decoder of transformers' other families."""
    if isinstance(model, CausalTransformerForCausalLM):
        return MemoryNextTokenLM(model, memory_length)
    if isinstance(model, AWDLSTMForCausalLM):
        return RecurrentNextTokenLM(model)
    if isinstance(model, NGramForCausalLM):
        return NGramNextTokenLM(model)
    return NextTokenLM(model) if isinstance(model, GPT2LMHeadModel) else AutoNextTokenLM(model)


def learned_positions(config) -> int | None:
    """How many positions a model's table has (GPT-2's n_positions); None for relative positions, a recurrent or an
    n-gram model, which read any length."""
    if getattr(config, "relative_positions", False):
        return None
    return getattr(config, "max_position_embeddings", None)  # GPT2Config maps it to n_positions


def check_segment_length(config, checkpoint: str | Path, segment_length: int, key: str = "segment_length") -> None:
    """Segments must fit the position table and, for a sparse pattern, be whole strides (its blocks line up)."""
    stride = getattr(config, "attention_stride", None)
    if stride is not None and segment_length % stride:
        raise UserError(f"{key} {segment_length}: the attention stride {stride} must divide it")
    positions = learned_positions(config)
    if positions is not None and segment_length > positions:
        raise UserError(f"{key} {segment_length} exceeds the {positions} positions of {checkpoint}")


def load_causal_language_model(checkpoint: str | Path, command: str, key: str = "CHECKPOINT"):
    """(model in eval mode, tokenizer) of a causal checkpoint (this toolkit's causal families, or a decoder of
    transformers' own: `reads_next_tokens`) with the tokenizer saved beside it; a masked LM, a classifier or another
    family is refused in one line naming its type."""
    from finetune.models.hub import is_classifier

    with recipe_key(key):
        source = resolve_checkpoint(str(checkpoint))
        config = load_pretrained(AutoConfig.from_pretrained, source)
    if not reads_next_tokens(config):
        raise UserError(
            f"{key}: {checkpoint} is a '{config.model_type}' model; `finetune {command}` reads causal "
            f"language models ({', '.join(CAUSAL_MODEL_TYPES)}, or another decoder with a causal-LM head)"
        )
    if is_classifier(config):
        raise UserError(
            f"{key}: {checkpoint} is a '{config.model_type}' classifier ({', '.join(config.architectures)})"
            f", not a language model; `finetune {command}` reads the language model it was fine-tuned "
            "from"
        )
    with recipe_key(key):
        model = load_model(AutoModelForCausalLM, source, config=config)
        tokenizer = load_tokenizer(source)
    if tokenizer.eos_token_id is None:
        raise UserError(
            f"{key}: the tokenizer of {checkpoint} has no end-of-text token, which separates documents "
            "in a causal model's text"
        )
    return model.eval(), tokenizer


class TextSegments:
    """A text read in order, as one stream, `length` tokens at a time (the last segment shorter): (1, length) input
    ids and their next tokens as labels.

    The stream is pretraining's (every document followed by the separator) with one separator in front, so the
    first document is read after a document end as every other is, and every token of the text and every
    document's end is predicted once.
    """

    def __init__(self, documents: TokenizedDocuments, separator_id: int, length: int):
        self.stream, self.separator_id, self.length = DocumentStream(documents, separator_id), separator_id, length

    def __len__(self) -> int:
        return (len(self.stream) + self.length - 1) // self.length  # blocks, the last one short

    def __iter__(self):
        for start in range(0, len(self.stream), self.length):
            stop = min(start + self.length, len(self.stream))
            # Inputs are the tokens before each label: the stream from start - 1 (the separator in front at 0).
            tokens = np.concatenate(
                [
                    [self.separator_id] if start == 0 else self.stream.take(np.array([start - 1])),
                    self.stream.take(np.arange(start, stop)),
                ]
            )
            ids = torch.from_numpy(tokens.astype(np.int64))[None]
            yield {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


def score_text(
    checkpoint: str | Path,
    files: list[Path],
    segment_length: int | None = None,
    device: str | None = None,
    document: str | None = None,
) -> dict[str, float]:
    """`finetune score`: the mean nats per token, perplexity and next-token accuracy of the text files (one text,
    its documents read as pretraining reads them: `document` line, paragraph or file; None: as the checkpoint's own
    pretraining did, corpus.document of its saved recipe) under a causal checkpoint.

    The text is read in order as one stream of `segment_length` tokens at a time (default: the model's positions,
    the block it trained on; UNBOUNDED_SEGMENT_LENGTH for a model that has none), through the same validation as a
    pretraining run: the AWD-LSTM carries its state and the causal transformer its memory from segment to segment
    (so the length changes nothing for the first, and for the second only what its memory reaches), a GPT-2 reads
    each segment on its own, the n-gram model each token after its n - 1 before. A backward model reads every
    document backwards, as it trained. `device`: cpu or cuda (default: cuda when there is one).
    """
    model, tokenizer = load_causal_language_model(checkpoint, "score")
    length = segment_length or learned_positions(model.config) or UNBOUNDED_SEGMENT_LENGTH
    check_segment_length(model.config, checkpoint, length, "--segment-length")
    for path in files:
        if not Path(path).is_file():
            raise UserError(f"FILE: no such file: {path}")
    if document is not None and document not in DOCUMENT_KINDS:
        raise UserError(f"--document: expected one of {', '.join(DOCUMENT_KINDS)} (got {document!r})")
    documents = tokenize_files(
        tokenizer,
        [Path(path) for path in files],
        None,
        show_progress=False,
        name="the text to score",
        document=document or trained_document_kind(checkpoint),
    )
    if reads_backwards(model.config):
        documents = read_backwards(documents)
    segments = TextSegments(documents, tokenizer.eos_token_id, length)
    accelerator = Accelerator(cpu=(device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu")
    metrics = validation_metrics(
        accelerator, language_model_loss(model).to(accelerator.device), segments, GPT2.accuracy_name
    )
    return {
        "tokens": len(segments.stream),
        "segment_length": length,
        "nats_per_token": metrics["validation_loss"],
        "perplexity": metrics["validation_perplexity"],
        "next_token_accuracy": metrics["next_token_accuracy"],
    }


def segment_validation(
    checkpoint: str | Path,
    validation_files: list[Path],
    segment_length: int,
    memory_length: int | None = None,
    rows: int = 16,
    device: str = "cpu",
) -> dict[str, float]:
    """A saved gpt2-family model's validation metrics on `validation_files` read as BPTT segments of
    `segment_length` tokens, with `memory_length` remembered positions per layer (Transformer-XL; default: the
    model's own): e.g. longer segments or a longer memory than training had, as Transformer-XL is evaluated.

    The text is cut into `rows` streams (fewer for a short text) read in order from an empty memory, as validation
    in a run is; a GPT-2 or a sparse model without memory reads every segment on its own. Nothing is cached.
    """
    with recipe_key("checkpoint"):
        source = resolve_checkpoint(str(checkpoint))
        model = load_model(AutoModelForCausalLM, source)
    config = model.config
    if isinstance(model, CausalTransformerForCausalLM):
        if memory_length and not config.relative_positions:
            raise UserError(f"memory_length: {checkpoint} was trained without memory (learned absolute positions)")
    elif not GPT2.owns(config) or memory_length:
        raise UserError(
            f"checkpoint: {checkpoint} is a '{config.model_type}' model; segment validation reads gpt2 "
            "family models (memory_length: those trained with model.memory_length)"
        )
    network = language_model_loss(model, memory_length)
    check_segment_length(config, checkpoint, segment_length)
    with recipe_key("checkpoint"):
        tokenizer = load_tokenizer(str(checkpoint))
    tokens = tokenize_files(tokenizer, validation_files, None, show_progress=False, name="the validation text")
    streams = BPTTBatches.rows_that_fit(tokens, segment_length, 1, rows)
    segments = BPTTBatches(
        tokens, tokenizer.eos_token_id, streams, segment_length, seed=0, shuffle=False, name="the validation text"
    )
    accelerator = Accelerator(cpu=device == "cpu")
    return validation_metrics(
        accelerator, network.to(accelerator.device), DataLoader(segments, batch_size=None), GPT2.accuracy_name
    )
