"""A task's encoded examples in batches: padded (PaddingCollator), windowed documents (WindowCollator), an order
that groups examples of similar length (LengthGroupedSampler), a batch cut into pieces of similar length
(length_pieces), and what an order costs in padding (batch_padding)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from finetune.data.long_documents import WINDOW_DOCUMENT
from finetune.data.sampling import ResumableSampler
from finetune.data.task_encoding import EncodedTask
from finetune.errors import InputError


class PaddingCollator:
    """Pads a batch to its longest example with plain torch: the tensors `DataCollatorWithPadding` gives, faster.

    Padding follows the tokenizer: its pad id and pad token type id, its padding side, an attention mask
    when the model takes one; `labels` become int64 class indices or float32 scores.
    """

    def __init__(self, tokenizer):
        if tokenizer.pad_token_id is None:
            raise InputError(f"the tokenizer of {tokenizer.name_or_path} has no pad token to pad batches with")
        input_name = tokenizer.model_input_names[0]
        self.pad_values = {
            input_name: tokenizer.pad_token_id,
            "token_type_ids": tokenizer.pad_token_type_id,
            "attention_mask": 0,
            "special_tokens_mask": 1,
            "backward_input_ids": tokenizer.pad_token_id,
        }  # a bidirectional classifier's
        self.input_name, self.pad_left = input_name, tokenizer.padding_side == "left"
        self.needs_attention_mask = "attention_mask" in tokenizer.model_input_names

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(example[self.input_name]) for example in examples]
        longest = max(lengths)
        batch = {}
        for key in examples[0]:
            if key == "labels":
                batch[key] = torch.tensor([example[key] for example in examples])
            elif key in self.pad_values:
                batch[key] = self._pad([example[key] for example in examples], self.pad_values[key], longest)
            else:
                raise ValueError(f"cannot pad the example field '{key}'")
        if self.needs_attention_mask and "attention_mask" not in batch:
            batch["attention_mask"] = self._pad([[1] * length for length in lengths], 0, longest)
        return batch

    def _pad(self, rows: list[list[int]], value: int, longest: int) -> torch.Tensor:
        """One int64 tensor of the rows, each padded with `value` to `longest` on the tokenizer's side."""
        if self.pad_left:
            return torch.tensor([[value] * (longest - len(row)) + row for row in rows])
        return torch.tensor([row + [value] * (longest - len(row)) for row in rows])


class WindowCollator:
    """Batches of windowed documents (chunks): their windows as padded rows, and which document each row belongs to
    (WINDOW_DOCUMENT); `labels` stay one per document."""

    def __init__(self, tokenizer):
        self.pad = PaddingCollator(tokenizer)

    def __call__(self, documents: list[dict]) -> dict[str, torch.Tensor]:
        rows, owners = [], []
        for number, document in enumerate(documents):
            keys = [key for key in document if key != "labels"]
            for window in range(len(document["input_ids"])):
                rows.append({key: document[key][window] for key in keys})
                owners.append(number)
        batch = self.pad(rows)
        if "labels" in documents[0]:
            batch["labels"] = torch.tensor([document["labels"] for document in documents])
        batch[WINDOW_DOCUMENT] = torch.tensor(owners)
        return batch


def task_collator(tokenizer, encoded: EncodedTask):
    """The collator for batches of `encoded`: windowed documents or plain examples."""
    return WindowCollator(tokenizer) if encoded.windows is not None else PaddingCollator(tokenizer)


class LengthGroupedSampler(ResumableSampler):
    """Shuffled indices in which each run of `batch_size` holds examples of similar length: batches need less padding.

    Per (seed, epoch): shuffle; sort by length within chunks of `chunk_batches` batches; cut the chunks
    into batches; shuffle the whole batches, the one short batch staying last. So a DataLoader with the
    same batch size cuts exactly these batches, and the order never depends on the global random state.
    Give it the examples of a whole optimizer step (batch x processes x accumulated micro-batches): under
    accelerate every process computes the same order and takes its own slice of each group, so a step
    holds the same examples however it is split. Resumable mid-epoch like its base class (`skip`).
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, chunk_batches: int = 50, passes: int = 1):
        if chunk_batches < 1:
            raise ValueError(f"chunk_batches must be at least 1 (got {chunk_batches})")
        super().__init__(len(lengths), seed, passes=passes)
        self.lengths, self.batch_size = np.asarray(lengths), batch_size
        self.chunk_batches = chunk_batches  # training.group_chunk_batches; bigger: less padding, less randomness

    def pass_order(self, index: int) -> np.ndarray:
        generator = np.random.default_rng((self.seed, index))
        order = generator.permutation(len(self.lengths))
        chunk = self.batch_size * self.chunk_batches
        # Longest first within a chunk; the stable sort keeps equal lengths in their shuffled order.
        order = np.concatenate(
            [
                part[np.argsort(-self.lengths[part], kind="stable")]
                for part in np.split(order, range(chunk, len(order), chunk))
            ]
        )
        batches = np.split(order, range(self.batch_size, len(order), self.batch_size))
        full = len(batches) - (len(batches[-1]) < self.batch_size)  # only the very last batch can be short
        shuffled = [batches[index] for index in generator.permutation(full)] + batches[full:]
        return np.concatenate(shuffled)


# What one more forward and backward pass costs beyond its positions, in positions: every backward writes (then
# accumulates) a gradient for every weight, whatever the piece's size. Fitted on MiniLM-L6 on 2 CPU cores
# (bench/pass_cost.py: 26-32 ms + 0.36 ms a position, 73-90 positions); split batches ran within 10% of each other from
# 50 to 200 on CoNLL-2003, so one figure serves.
PIECE_OVERHEAD_POSITIONS = 64


def length_pieces(lengths: list[int], overhead: int = PIECE_OVERHEAD_POSITIONS) -> list[np.ndarray]:
    """A batch's examples (positions in `lengths`) in pieces of similar length, longest first, cut where that
    computes the fewest positions: a piece costs its size x its longest example (its padded positions) plus
    `overhead`. Exact, by dynamic programming over the cut points of the length-sorted batch (n² for n examples).

    Each piece pads only to its own longest: the batch's examples and its gradient stay the same (the loop weights
    each piece by its loss terms), only the padding goes.
    """
    order = np.argsort(-np.asarray(lengths), kind="stable")
    sorted_lengths = np.asarray(lengths)[order]
    count = len(order)
    best = np.full(count + 1, np.inf)  # best[j]: the cheapest cut of the j longest examples
    best[0] = 0.0
    start = np.zeros(count + 1, dtype=np.int64)  # where the last piece of that cut starts
    for end in range(1, count + 1):
        # A piece from `first` to `end` pads to sorted_lengths[first], its longest.
        firsts = np.arange(end)
        costs = best[:end] + overhead + (end - firsts) * sorted_lengths[:end]
        start[end] = int(np.argmin(costs))
        best[end] = costs[start[end]]
    pieces, end = [], count
    while end:
        pieces.append(order[start[end] : end])
        end = int(start[end])
    return pieces[::-1]


class BatchPadding(NamedTuple):
    """What one epoch's batches cost in padding."""

    padding_share: float  # padded positions / all positions of the padded batches
    cost: int  # sum over batches of examples x longest: the positions computed, a proxy of the time


def batch_padding(lengths: list[int], batch_size: int, seed: int, chunk_batches: int | None) -> BatchPadding:
    """The padding of epoch 0's batches of `batch_size` (the last one short) as training reads them: grouped by
    LengthGroupedSampler with `chunk_batches`, or shuffled (ResumableSampler) when it is None. Trains nothing."""
    sampler = (
        ResumableSampler(len(lengths), seed)
        if chunk_batches is None
        else LengthGroupedSampler(lengths, batch_size, seed, chunk_batches)
    )
    ordered = np.asarray(lengths, dtype=np.int64)[sampler.epoch_order()]
    batches = np.split(ordered, range(batch_size, len(ordered), batch_size)) if len(ordered) else []
    cost = sum(len(batch) * int(batch.max()) for batch in batches)
    return BatchPadding(1 - int(ordered.sum()) / cost if cost else 0.0, cost)


def batching_summary(training, grouped: bool, split: bool, skips_padding: bool) -> str:
    """One line on how the training examples are batched."""
    order = f"grouped by length (chunks of {training.group_chunk_batches} batches)" if grouped else "shuffled"
    return (
        f"batches of {training.batch_size}, {order}"
        + (", each cut into pieces of similar length" if split else "")
        + ("; the model computes their real tokens only (training.skip_padding)" if skips_padding else "")
    )
