"""Training data of causal language models: each input token is labelled with the token after it.

Two layouts:
- `NextTokenBlocks` (GPT-2): independent packed blocks, shuffled like any dataset;
- `BPTTBatches` (AWD-LSTM, ULMFiT): the corpus as parallel streams read `bptt` tokens at a time,
  so that row i of batch t+1 continues row i of batch t and the LSTM state can be carried over
  (truncated backpropagation through time).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.errors import InputError


class NextTokenBlocks(Dataset):
    """Packed blocks of `block_size + 1` tokens: the first `block_size` are the input, the last ones the labels."""

    def __init__(self, blocks: np.ndarray | PackedBlocks):
        self.blocks = blocks

    def set_epoch(self, epoch: int) -> None:
        """The blocks are the same every epoch (the loader reshuffles them); here for a uniform interface."""

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        block = torch.from_numpy(self.blocks[index])
        return {"input_ids": block[:-1], "labels": block[1:]}


class BPTTBatches(Dataset):
    """Item t is batch t of an epoch: (rows, bptt) inputs and the next tokens as labels.

    Each epoch the documents are shuffled (seeded by seed and epoch) and concatenated with a
    separator after each, as ULMFiT's LM loader does; the stream is cut into
    `batch_size * num_processes` rows of equal length and each process reads its own
    `batch_size` rows, so no token is seen twice per epoch whatever the process count.
    Nothing of that stream is built: a batch gathers its (rows, bptt + 1) tokens from the ids (a memory map
    of the token cache), and the epoch's shuffle is an order of the documents; held in memory are 24 bytes
    per document (the order and the stream's document starts: 24 MB per million documents).
    """

    def __init__(
        self,
        documents: TokenizedDocuments,
        separator_id: int,
        batch_size: int,
        bptt: int,
        seed: int,
        shuffle: bool = True,
        process_index: int = 0,
        num_processes: int = 1,
        name: str = "the corpus",
    ):
        self.documents, self.separator_id, self.seed, self.shuffle = documents, separator_id, seed, shuffle
        self.batch_size, self.bptt = batch_size, bptt
        self.process_index, self.num_processes = process_index, num_processes
        stream_length = documents.token_count + len(documents)  # every document is followed by a separator
        self.row_length = stream_length // (batch_size * num_processes)
        if self.row_length < bptt + 1:
            raise InputError(
                f"{name} has {stream_length} tokens, too few for {batch_size * num_processes} rows of "
                f"at least {bptt + 1} tokens (training.batch_size, corpus.block_size)"
            )
        self.epoch = 0
        self._stream: DocumentStream | None = None

    @staticmethod
    def rows_that_fit(documents: TokenizedDocuments, bptt: int, num_processes: int, wanted: int) -> int:
        """Up to `wanted` rows per process, fewer for a text too short for them (a small validation set)."""
        stream_length = documents.token_count + len(documents)
        return max(1, min(wanted, stream_length // ((bptt + 1) * num_processes)))

    def set_epoch(self, epoch: int) -> None:
        """A new document order for the epoch (no effect without shuffling)."""
        if epoch != self.epoch:
            self.epoch, self._stream = epoch, None

    def __len__(self) -> int:
        # Every batch has the full bptt length: the remainder of each row (< bptt tokens) is left out.
        return (self.row_length - 1) // self.bptt

    def stream(self) -> DocumentStream:
        """The epoch's stream: the documents in the order of (seed, epoch), or as given without shuffling."""
        if self._stream is None:
            documents = self.documents
            if self.shuffle:
                documents = documents.select(np.random.default_rng((self.seed, self.epoch)).permutation(len(documents)))
            self._stream = DocumentStream(documents, self.separator_id)
        return self._stream

    def window(self, start: int, stop: int) -> np.ndarray:
        """Columns [start, stop) of this process's (batch_size, row_length) rows of the epoch's stream, int64."""
        first_row = self.process_index * self.batch_size
        row_starts = (first_row + np.arange(self.batch_size, dtype=np.int64)) * self.row_length
        return self.stream().take(row_starts[:, None] + np.arange(start, stop))

    def rows(self) -> np.ndarray:
        """This process's whole rows of the epoch (checks on small corpora; training reads `window`s)."""
        return self.window(0, self.row_length)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.bptt
        window = torch.from_numpy(self.window(start, start + self.bptt + 1))
        return {"input_ids": window[:, :-1], "labels": window[:, 1:]}
