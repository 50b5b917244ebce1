"""A `datasets` corpus read as a stream (`corpus.streaming: true`): tokenised on the fly into training batches.

For text larger than a token cache should hold. `datasets.load_dataset(..., streaming=True)` reads rows as they are
needed; here they become documents (non-empty, stripped, as lines of text files do), token ids and packed blocks,
the same layout as the cached path (a separator after each document; bert: [CLS] + 127 tokens, masked per block;
gpt2: 129 tokens, inputs and next-token labels), a batch at a time. Nothing is cached and nothing is held but the
current batch of rows and the ids not yet cut into a block.

The stream has no length, so a run's length is training.max_steps: the batches are numbered 0 .. max_steps x
gradient_accumulation_steps - 1, and when the stream ends before that it starts again from its beginning (a new
pass; bert draws other masks). Which documents each batch holds is fixed by the seed, the process count and
training.num_workers: document i goes to shard i mod (processes x workers); each shard reads the whole stream (rows
are cheap to read) and tokenises only its own documents; the loader takes batch j from shard j mod workers of its
process. `--resume` reads (and tokenises) the stream again up to where the run stopped, training on nothing, and
continues with exactly the batches the interrupted run would have read next.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from finetune.data.corpus import dataset_label, document_text, load_dataset_split
from finetune.data.masking import MaskingRule
from finetune.data.reverse import read_backwards
from finetune.data.token_arrays import DocumentStream, TokenizedDocuments
from finetune.data.token_cache import encode
from finetune.errors import DataFileError, InputError

ROWS_PER_READ = 256  # rows fetched from the stream at once
DOCUMENTS_PER_ENCODING = 256  # documents per batch encoding (the tokenizer's Rust threads share them)


def stream_documents(dataset, text_column: str, label: str) -> Iterator[str]:
    """The stream's documents: each non-empty row of its text column, stripped (`dataset.iter` reads every row,
    whatever torch worker runs it: the sharding is ours)."""
    for rows in dataset.iter(batch_size=ROWS_PER_READ):
        if text_column not in rows:
            raise DataFileError(
                f"no column {text_column!r} (columns: {', '.join(rows)}; set corpus.text_column)",
                source=label,
                value=text_column,
            )
        for text in rows[text_column]:
            document = document_text(text) if isinstance(text, str) else ""
            if document:
                yield document


@dataclass
class StreamedDocuments:
    """A streamed split's documents: calling it opens the stream from its beginning (every pass does)."""

    dataset: Any  # a datasets.IterableDataset
    text_column: str
    label: str  # how errors name the dataset

    @classmethod
    def open(cls, name: str, config: str | None, split: str, text_column: str, data_files=None) -> StreamedDocuments:
        """The split, its first rows read now: an unreadable dataset or a wrong column stops a run before it starts."""
        documents = cls(
            load_dataset_split(name, config, split, data_files, streaming=True),
            text_column,
            dataset_label(name, config, data_files),
        )
        if next(documents(), None) is None:
            raise DataFileError(
                f"no text in column {text_column!r} of split {split!r}", source=documents.label, value=text_column
            )
        return documents

    def __call__(self) -> Iterator[str]:
        return stream_documents(self.dataset, self.text_column, self.label)


class StreamedBatches(IterableDataset):
    """Training batches packed from a stream of documents; item j is batch j (see the module for the order).

    `documents()` opens the stream from its beginning (again at every pass); the first `held_out` documents are the
    validation text and never trained on. `rule` masks bert's blocks (None: next-token blocks of block_size + 1).
    `backwards`: each document's ids reversed (a backward LM, data/reverse.py).
    """

    def __init__(
        self,
        documents: Callable[[], Iterator[str]],
        tokenizer,
        separator_id: int,
        block_size: int,
        batch_size: int,
        batches: int,
        seed: int,
        rule: MaskingRule | None = None,
        start_id: int | None = None,
        held_out: int = 0,
        process_index: int = 0,
        num_processes: int = 1,
        backwards: bool = False,
    ):
        self.documents, self.tokenizer, self.separator_id = documents, tokenizer, separator_id
        self.block_size, self.batch_size, self.batches, self.seed = block_size, batch_size, batches, seed
        self.rule, self.start_id, self.held_out = rule, start_id, held_out
        self.process_index, self.num_processes = process_index, num_processes
        self.backwards = backwards
        self.skipped = 0  # batches trained on before a resume

    def set_epoch(self, epoch: int) -> None:
        """The whole run is one epoch of max_steps steps (passes over the stream are counted inside)."""

    def skip(self, batches: int) -> None:
        """Start after the first `batches` batches (those a resumed run trained on)."""
        self.skipped = batches

    def __len__(self) -> int:
        return self.batches - self.skipped

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker is not None else (1, 0)
        # Worker w plays role r = (w + skipped) mod workers, so that after a resume the loader's round-robin over
        # the workers still hands out the batches in the order of the uninterrupted run.
        role = (worker_id + self.skipped) % workers
        done = len(range(role, self.skipped, workers))  # this role's batches trained on before a resume
        wanted = len(range(role, self.batches, workers)) - done
        shard, shards = self.process_index * workers + role, self.num_processes * workers
        yield from itertools.islice(self._batches(shard, shards), done, done + wanted)

    def _batches(self, shard: int, shards: int) -> Iterator[dict[str, torch.Tensor]]:
        """This shard's batches, pass after pass over the stream."""
        blocks: list[dict[str, np.ndarray]] = []  # the examples of the batch being filled
        for number, block in enumerate(self._blocks(shard, shards)):
            blocks.append(self._example(block, number, shard))
            if len(blocks) == self.batch_size:
                yield {
                    key: torch.from_numpy(np.stack([example[key] for example in blocks]))
                    for key in ("input_ids", "labels")
                }
                blocks = []

    def _example(self, block: np.ndarray, number: int, shard: int) -> dict[str, np.ndarray]:
        """Inputs and labels of one block: masked (bert, masks drawn per shard and block), or next tokens (gpt2)."""
        if self.rule is None:
            return {"input_ids": block[:-1], "labels": block[1:]}
        inputs, labels = self.rule.apply(block, np.random.default_rng((self.seed, shard, number)))
        return {"input_ids": inputs, "labels": labels}

    def _blocks(self, shard: int, shards: int) -> Iterator[np.ndarray]:
        """Packed blocks of this shard's documents (a separator after each), the stream read again at its end."""
        length = self.block_size + (1 if self.rule is None else 0)  # next-token blocks carry the last label
        body = length - (1 if self.start_id is not None else 0)
        for _ in itertools.count():
            pending, found = np.empty(0, dtype=np.int64), False
            documents = itertools.islice(self.documents(), self.held_out, None)
            mine = (document for index, document in enumerate(documents) if index % shards == shard)
            while chunk := list(itertools.islice(mine, DOCUMENTS_PER_ENCODING)):
                # The cached corpora's stream (data/token_arrays.py): a separator after each document, read backwards
                # for a backward LM.
                tokenized = TokenizedDocuments.from_lists(encode(self.tokenizer, chunk))
                stream = DocumentStream(read_backwards(tokenized) if self.backwards else tokenized, self.separator_id)
                pending = np.concatenate([pending, stream.array()])
                count = len(pending) // body
                for index in range(count):
                    found = True
                    block = pending[index * body : (index + 1) * body]
                    yield block if self.start_id is None else np.concatenate([[self.start_id], block])
                pending = pending[count * body :]
            if not found:  # the last incomplete block of a pass is dropped, as packing drops it
                raise InputError(
                    f"the stream's training documents (shard {shard + 1} of {shards}) give fewer than "
                    f"{body} tokens, not one block of {length} (corpus.block_size)"
                )
