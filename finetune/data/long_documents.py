"""Examples longer than task.max_length: cut at the end (truncate), kept at both ends (head_tail), or read whole in
windows (chunks) whose logits are pooled into the document's.

Everything happens on token positions of the whole encoded example, so special tokens ([CLS], [SEP], GPT-2's
nothing) stay where the tokenizer put them and every family's template is kept exactly: only text positions are
dropped. A sentence pair counts its two texts as one run of text positions (the first text whole in the head, the
end of the second in the tail), which suits the usual long pair, a short question or premise before a long passage.

chunks: a document of n text positions, room r for text in a window (max_length less the special tokens) and
`overlap` o gives windows starting every r - o positions, the last one ending at the document's end; a document
with more windows than `max_chunks` is read in that many spread evenly over it. A batch holds whole documents:
`WindowCollator` flattens their windows into rows and says which document each row belongs to
(WINDOW_DOCUMENT), and `pool_windows` turns the rows' logits into one row per document, the same in training
(the loss is taken on the pooled logits), `eval`, `predict` and ensembles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from finetune.errors import InputError

# task.max_length when a recipe leaves it out, for every transformer family (the recurrent ones, which read whole
# documents: models/families.py WHOLE_DOCUMENT_TYPES, have none)
DEFAULT_TRANSFORMER_MAX_LENGTH = 128
WINDOW_DOCUMENT = "window_document"  # batch key of windowed documents: the document of every row


class ReadingError(InputError):
    """A DocumentReading setting (its mode, head or overlap: the reason names which) that cannot read this task's
    examples; the stage names the recipe section it came from."""


@dataclass(frozen=True)
class DocumentReading:
    """How a classifier reads its task's examples: `max_length` tokens at most (None: whole), and how longer ones are
    read (task.long_documents)."""

    max_length: int | None
    mode: str = "truncate"
    head: int | None = None
    overlap: int | None = None
    max_chunks: int = 8
    pool: str = "mean"
    # GPT's similarity transformation (task.both_orders): a pair read as (a, b) and (b, a), two rows of one
    # document whose logits are added, which for a linear head without bias is adding their representations.
    both_orders: bool = False

    @classmethod
    def of(cls, max_length: int | None, long_documents=None, both_orders: bool = False) -> DocumentReading:
        """From task.max_length, a task.long_documents section (None: truncate) and task.both_orders."""
        if both_orders:
            return cls(max_length, pool="sum", both_orders=True)
        if long_documents is None:
            return cls(max_length)
        return cls(
            max_length,
            long_documents.mode,
            long_documents.head,
            long_documents.overlap,
            long_documents.max_chunks,
            long_documents.pool,
        )

    @property
    def windowed(self) -> bool:
        """Whether an example is a document of rows whose logits are pooled (chunks' windows, both orders)."""
        return self.mode == "chunks" or self.both_orders

    def describe(self) -> str:
        """One line for the start of a run."""
        if self.both_orders:
            return (
                f"reads at most {self.max_length} tokens per example, each pair in both orders with their "
                "logits added (GPT's similarity transformation)"
            )
        if self.max_length is None:
            return "reads each example whole"
        if self.mode == "head_tail":
            return (
                f"reads at most {self.max_length} tokens per example; longer ones: head_tail (the first "
                f"{self.head_tokens} text tokens and the last ones)"
            )
        if self.mode == "chunks":
            return (
                f"reads at most {self.max_length} tokens per window; longer examples: chunks (overlap "
                f"{self.overlap_tokens}, at most {self.max_chunks} windows, logits pooled by {self.pool})"
            )
        return f"reads at most {self.max_length} tokens per example; longer ones are truncated"

    @property
    def head_tokens(self) -> int:
        if self.head is not None:
            return self.head
        assert self.max_length is not None  # read only for head_tail with a max_length (EncodedTask checks)
        return self.max_length // 4

    @property
    def overlap_tokens(self) -> int:
        if self.overlap is not None:
            return self.overlap
        assert self.max_length is not None  # read only for chunks with a max_length (EncodedTask checks)
        return self.max_length // 4


def text_room(sequence_ids: Sequence[int | None], max_length: int) -> tuple[list[int], int]:
    """The text positions of an encoded example (not special tokens) and how many of them fit in max_length."""
    texts = [position for position, segment in enumerate(sequence_ids) if segment is not None]
    return texts, max_length - (len(sequence_ids) - len(texts))


def head_tail_positions(sequence_ids: Sequence[int | None], max_length: int, head: int) -> list[int]:
    """The positions head_tail keeps: every special token, the first `head` text positions and the last ones that
    fill max_length."""
    texts, room = text_room(sequence_ids, max_length)
    if len(texts) <= room:
        return list(range(len(sequence_ids)))
    if head >= room:
        raise ReadingError(
            f"head {head} leaves no tokens for the tail: max_length {max_length} holds {room} text "
            f"tokens of this task's examples (set head below {room})",
            value=head,
        )
    kept = set(texts[:head]) | set(texts[len(texts) - (room - head) :])
    return [position for position, segment in enumerate(sequence_ids) if segment is None or position in kept]


def window_positions(
    sequence_ids: Sequence[int | None], max_length: int, overlap: int, max_chunks: int
) -> tuple[list[list[int]], int]:
    """The positions of each window of an example (every special token in each), and how many windows it had
    before `max_chunks` (more than that: that many, spread evenly from the first to the last)."""
    texts, room = text_room(sequence_ids, max_length)
    if len(texts) <= room:
        return [list(range(len(sequence_ids)))], 1
    if overlap >= room:
        raise ReadingError(
            f"overlap {overlap} leaves windows no new tokens: max_length {max_length} holds {room} "
            f"text tokens of this task's examples (set overlap below {room})",
            value=overlap,
        )
    starts = list(range(0, len(texts) - room, room - overlap)) + [len(texts) - room]
    if len(starts) > max_chunks:
        chosen = np.unique(np.linspace(0, len(starts) - 1, max_chunks).round().astype(int))
        starts_kept = [starts[index] for index in chosen]
    else:
        starts_kept = starts
    specials = [position for position, segment in enumerate(sequence_ids) if segment is None]
    windows = [sorted(specials + texts[start : start + room]) for start in starts_kept]
    return windows, len(starts)


def pool_windows(logits: torch.Tensor, documents: torch.Tensor, pool: str) -> torch.Tensor:
    """One row of logits per document from the rows of its windows (`documents`: the document of each row, numbered
    from 0 in batch order, as WindowCollator numbers them): their mean, max or (both orders of a pair) sum."""
    count = int(documents.max()) + 1
    index = documents.to(logits.device).unsqueeze(-1).expand_as(logits)
    if pool == "max":
        start = torch.full((count, logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device)
        return start.scatter_reduce(0, index, logits, reduce="amax", include_self=True)
    total = torch.zeros((count, logits.shape[-1]), dtype=logits.dtype, device=logits.device).scatter_add(
        0, index, logits
    )
    if pool == "sum":
        return total
    windows = torch.bincount(documents.to(logits.device), minlength=count).clamp(min=1)
    return total / windows.unsqueeze(-1).to(logits.dtype)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What a Hugging Face sequence classifier computes from its logits: cross-entropy for class indices, squared
    error for a regression's float scores."""
    if labels.is_floating_point():
        return torch.nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
    return torch.nn.functional.cross_entropy(logits, labels)


def windowed_logits(model, batch: dict, pool: str) -> torch.Tensor:
    """The pooled logits of a batch of windowed documents (its labels, if any, are left in `batch`)."""
    rows = {key: value for key, value in batch.items() if key not in (WINDOW_DOCUMENT, "labels")}
    documents = batch[WINDOW_DOCUMENT]
    return pool_windows(model(**rows).logits, documents, pool)
