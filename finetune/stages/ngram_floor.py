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

import torch
from torch.utils.data import DataLoader

from finetune.console import console, phase_bar
from finetune.data.causal import NextTokenBlocks
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.models.language_models import document_separator_id
from finetune.models.ngram import NGramForCausalLM, NGramNextTokenLM

FLOOR_PHASE = "floor"  # the metrics.jsonl record's phase; plots and the model card look for it


def ngram_floor(order: int, tokenizer, train_tokens: TokenizedDocuments, validation_tokens: TokenizedDocuments,
                block_size: int, batch_size: int, show_progress: bool = True) -> dict:
    """The metrics.jsonl record of the floor: {"phase": "floor", "model": "ngram-N", validation_loss,
    validation_perplexity, next_token_accuracy, seconds}. Computed in this process alone (every process of a
    distributed run gets the same figure; only the main one writes it)."""
    started = time.perf_counter()
    separator = document_separator_id("ngram", tokenizer)
    stream = DocumentStream(train_tokens, separator).array()
    with phase_bar(f"n-gram floor: counting up to order {order}", order, show_progress) as advance:
        ngram = NGramForCausalLM.count(stream, len(tokenizer), order, tokenizer.eos_token_id, advance)
    blocks = NextTokenBlocks(PackedBlocks(DocumentStream(validation_tokens, separator), block_size + 1,
                                          name="the validation text"))
    scorer = NGramNextTokenLM(ngram)
    loss_sum, tokens, correct = 0.0, 0, 0
    loader = DataLoader(blocks, batch_size=batch_size)
    with phase_bar("n-gram floor: scoring", len(loader), show_progress) as advance:
        for batch in loader:
            loss, count, right = scorer(batch["input_ids"], batch["labels"])
            loss_sum, tokens, correct = loss_sum + loss.item() * count.item(), tokens + count.item(), \
                correct + right.item()
            advance()
    loss = loss_sum / tokens
    record = {"phase": FLOOR_PHASE, "model": f"ngram-{order}", "validation_loss": loss,
              "validation_perplexity": float(torch.exp(torch.tensor(loss))), "next_token_accuracy": correct / tokens,
              "seconds": round(time.perf_counter() - started, 1)}
    if show_progress:
        console.print(f"n-gram floor (order {order}, Kneser-Ney, same tokens): validation loss {loss:.4f}, "
                      f"perplexity {record['validation_perplexity']:.1f}; the network has to go below it")
    return record
