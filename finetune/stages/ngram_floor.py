"""The n-gram floor of a pretraining run (`ngram_floor: N` in a causal family's recipe).

Before a network trains, an order-N interpolated modified Kneser-Ney model (models/ngram.py) is counted on the same
training ids (the same tokenizer, the same direction, documents and separators as the run reads them) and scored on
the same validation ids, so that the run's report can show the loss a network must beat to have learnt more than
N-gram statistics. It costs seconds on WikiText-2 (bench/lm_families.py) and holds the count tables in memory for
the scoring only.

The floor is scored on next-token blocks of `corpus.block_size` tokens (gpt2's layout, each token with the
context before it in its block): for an N-gram model only the first N - 1 tokens of a block miss context, so the
figure hardly depends on the layout, also for the AWD-LSTM, which validates on carried BPTT streams.
"""

from __future__ import annotations

import time

from torch.utils.data import DataLoader

from finetune.console import console, phase_bar
from finetune.data.causal import NextTokenBlocks
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.inference.language_model_validation import validation_metrics
from finetune.models.families import NGRAM
from finetune.models.ngram import NGramForCausalLM, NGramNextTokenLM

FLOOR_PHASE = "floor"  # the metrics.jsonl record's phase; plots and the model card look for it


def count_ngram_model(
    train_tokens: TokenizedDocuments, tokenizer, order: int, label: str, show_progress: bool = True
) -> NGramForCausalLM:
    """Every n-gram up to `order` of the training stream, documents and separators as the causal families read it
    (the `ngram` family's run and the floor count the same way)."""
    stream = DocumentStream(train_tokens, NGRAM.separator_id(tokenizer)).array()
    with phase_bar(f"{label}counting n-grams up to order {order}", order, show_progress) as advance:
        return NGramForCausalLM.count(stream, len(tokenizer), order, tokenizer.eos_token_id, advance)


def ngram_floor(
    order: int,
    accelerator,
    tokenizer,
    train_tokens: TokenizedDocuments,
    validation_tokens: TokenizedDocuments,
    block_size: int,
    batch_size: int,
) -> dict:
    """The metrics.jsonl record of the floor: {"phase": "floor", "model": "ngram-N", validation_loss,
    validation_perplexity, next_token_accuracy, seconds}. Every process counts and scores every block (the same
    figures: `validation_metrics` sums them over processes, which leaves its ratios unchanged); the main one writes
    it."""
    started = time.perf_counter()
    main = accelerator.is_main_process
    ngram = count_ngram_model(train_tokens, tokenizer, order, "n-gram floor: ", main)
    blocks = NextTokenBlocks(
        PackedBlocks(
            DocumentStream(validation_tokens, NGRAM.separator_id(tokenizer)), block_size + 1, name="the validation text"
        )
    )
    metrics = validation_metrics(
        accelerator,
        NGramNextTokenLM(ngram).to(accelerator.device),
        DataLoader(blocks, batch_size=batch_size),
        "next_token_accuracy",
    )
    if main:
        console.print(
            f"n-gram floor (order {order}, Kneser-Ney, same tokens): validation loss "
            f"{metrics['validation_loss']:.4f}, perplexity {metrics['validation_perplexity']:.1f}; "
            "the network has to go below it"
        )
    return {
        "phase": FLOOR_PHASE,
        "model": f"ngram-{order}",
        **metrics,
        "seconds": round(time.perf_counter() - started, 1),
    }
