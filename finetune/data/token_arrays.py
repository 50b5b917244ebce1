"""Token ids of many documents as flat arrays (memory-mapped from the cache), and the document stream read from them.

Training reads text as one stream: the documents, each followed by a separator, cut into blocks (bert, gpt2) or
rows (awd_lstm's BPTT). On a 100M-token corpus that stream is 400 MB of int32 (800 MB as the int64 torch wants),
so nothing here builds it: `DocumentStream.take` gathers the tokens at given stream positions straight from the
ids, which after a restart are a read-only memory map of the cache (pages come from the file as they are read
and can always be dropped again). What is held in memory is per document, not per token: see `DocumentStream`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from finetune.errors import InputError

IDS_FILE, OFFSETS_FILE = "ids.npy", "offsets.npy"


@dataclass
class TokenizedDocuments:
    """The ids of many documents as two flat arrays, and optionally which of them are meant, in which order.

    `order` makes a selection without copying any id: the training and validation parts of one cached corpus,
    or an epoch's shuffle, are index arrays (8 bytes per document) over the same `ids`.
    """

    ids: np.ndarray  # int32: every stored document's ids, one document after another (np.memmap from the cache)
    offsets: np.ndarray  # int64, one more than the stored documents: document i is ids[offsets[i]:offsets[i + 1]]
    order: np.ndarray | None = None  # int64 indices of the stored documents meant here; None: all, as stored
    source: Path | None = None  # the cache folder the arrays are mapped from (pickling sends this, not the ids)
    # Each document read from its last token to its first (a backward LM, data/reverse.py): the ids stay forward.
    backwards: bool = False

    def __post_init__(self):
        # asanyarray: a memory map stays one (asarray would keep the data mapped but hide that it is).
        self.ids = np.asanyarray(self.ids, dtype=np.int32)
        self.offsets = np.asanyarray(self.offsets, dtype=np.int64)
        # A cache file that loads but does not hold this shape is corrupt: fail here, not mid-training.
        if (
            self.ids.ndim != 1
            or self.offsets.ndim != 1
            or len(self.offsets) == 0
            or self.offsets[0] != 0
            or self.offsets[-1] != len(self.ids)
            or (np.diff(self.offsets) < 0).any()
        ):
            raise ValueError("offsets do not delimit the ids")
        if self.order is not None:
            self.order = np.asarray(self.order, dtype=np.int64)
            if self.order.ndim != 1 or (
                len(self.order) and not (self.order.min() >= 0 and self.order.max() < len(self.offsets) - 1)
            ):
                raise ValueError("order names documents that are not stored")

    @classmethod
    def from_lists(cls, id_lists: list[list[int]]) -> TokenizedDocuments:
        """The flat form of a list of id lists."""
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter((token for ids in id_lists for token in ids), dtype=np.int32, count=int(lengths.sum()))
        return cls(ids, offsets_of(lengths))

    @classmethod
    def concatenate(cls, parts: list[TokenizedDocuments]) -> TokenizedDocuments:
        """The documents of `parts`, one part after another, in memory (a selection's documents gathered)."""
        ids = [part.document_ids() for part in parts]
        lengths = [part.lengths for part in parts]
        return cls(
            np.concatenate([np.empty(0, dtype=np.int32), *ids]),
            offsets_of(np.concatenate([np.empty(0, dtype=np.int64), *lengths])),
        )

    def document_ids(self) -> np.ndarray:
        """The selected documents' ids one after another, gathered into memory."""
        if self.order is None and not self.backwards:
            return np.asarray(self.ids)
        return np.concatenate([np.empty(0, dtype=np.int32), *(self.document(index) for index in range(len(self)))])

    @classmethod
    def load(cls, folder: Path, memory_map: bool = True) -> TokenizedDocuments:
        """Documents saved by `save` (or the token cache), memory-mapped: nothing of the ids is read until used."""
        folder = Path(folder)
        mode: Literal["r"] | None = "r" if memory_map else None
        ids = _load_array(folder / IDS_FILE, mode)
        return cls(ids, _load_array(folder / OFFSETS_FILE, mode), source=folder if memory_map else None)

    def save(self, folder: Path) -> None:
        """The stored arrays as plain .npy files in `folder` (made if needed); the selection and the direction are not
        saved."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / IDS_FILE, self.ids)
        np.save(folder / OFFSETS_FILE, self.offsets)

    def select(self, indices: np.ndarray) -> TokenizedDocuments:
        """Documents `indices` of this selection, in that order, sharing the ids (nothing is copied)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and not (indices.min() >= 0 and indices.max() < len(self)):
            raise IndexError("document index out of range")
        order = indices if self.order is None else self.order[indices]
        return TokenizedDocuments(self.ids, self.offsets, order, self.source, self.backwards)

    @property
    def starts(self) -> np.ndarray:
        """Where each selected document starts in `ids`."""
        return self.offsets[:-1] if self.order is None else self.offsets[self.order]

    @property
    def lengths(self) -> np.ndarray:
        """Tokens in each selected document."""
        if self.order is None:
            return np.diff(self.offsets)
        return self.offsets[self.order + 1] - self.offsets[self.order]

    @property
    def token_count(self) -> int:
        """Tokens in the selected documents (all of `ids` without a selection)."""
        return len(self.ids) if self.order is None else int(self.lengths.sum())

    def document(self, index: int) -> np.ndarray:
        """The ids of one selected document, in reading order."""
        stored = index if self.order is None else int(self.order[index])
        ids = self.ids[self.offsets[stored] : self.offsets[stored + 1]]
        return ids[::-1] if self.backwards else ids

    def __len__(self) -> int:
        return len(self.offsets) - 1 if self.order is None else len(self.order)

    def __getstate__(self) -> dict:
        """Pickled (DataLoader workers started by spawning): a cache's arrays travel as their folder, not 400 MB."""
        state = dict(self.__dict__)
        if self.source is not None:
            state["ids"] = state["offsets"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        if state["ids"] is None:
            loaded = TokenizedDocuments.load(state["source"])
            state = {**state, "ids": loaded.ids, "offsets": loaded.offsets}
        self.__dict__.update(state)


def _load_array(path: Path, mode: Literal["r"] | None) -> np.ndarray:
    """An .npy file, memory-mapped when `mode` is given (an empty array cannot be mapped: it is read)."""
    array = np.load(path, mmap_mode=mode)
    return np.load(path) if mode is not None and array.size == 0 else array


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """Where each document starts, and the end of the last: [0, cumulative lengths...]."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


class DocumentStream:
    """The selected documents, each followed by `separator_id`, as one stream read lazily by position (each document
    from its end when they are read backwards: the one place a backward LM's text is reversed).

    Held in memory: where each document starts in the ids and in the stream, 16 bytes per document (16 MB per
    million documents, about 100M tokens of Wikipedia paragraphs), beside the selection's own 8. The ids are
    read only where positions are asked for.
    """

    def __init__(self, documents: TokenizedDocuments, separator_id: int):
        self.documents, self.separator_id = documents, separator_id
        self.document_starts = np.ascontiguousarray(documents.starts)
        self.stream_starts = offsets_of(documents.lengths + 1)  # the last entry is the stream's length

    def __len__(self) -> int:
        return int(self.stream_starts[-1])

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The stream's tokens at `positions` (any shape), as int64."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"stream position out of range [0, {len(self)})")
        rank = np.searchsorted(self.stream_starts, positions, side="right") - 1  # the document of each position
        separator = positions == self.stream_starts[rank + 1] - 1  # each document's last stream position
        tokens = np.full(positions.shape, self.separator_id, dtype=np.int64)
        rank, inside = rank[~separator], (positions - self.stream_starts[rank])[~separator]
        if self.documents.backwards:  # the k-th token of a document read backwards is its k-th from the end
            inside = self.stream_starts[rank + 1] - self.stream_starts[rank] - 2 - inside
        sources = self.document_starts[rank] + inside
        tokens[~separator] = self.documents.ids[sources]  # a gather: only these ids are read from the map
        return tokens

    def array(self) -> np.ndarray:
        """The whole stream, as int64 (small corpora and tests; training reads positions with `take`)."""
        return self.take(np.arange(len(self)))


def document_stream(documents: TokenizedDocuments, separator_id: int, order: np.ndarray | None = None) -> np.ndarray:
    """The documents (all, or those of `order` in that order) in one int32 stream with `separator_id` after each."""
    selected = documents if order is None else documents.select(order)
    return DocumentStream(selected, separator_id).array().astype(np.int32)


class PackedBlocks:
    """A document stream cut into blocks of `block_size` tokens, each led by `start_id` if given, built per block.

    BERT gives start_id=[CLS] and a [SEP] stream; causal LMs give no start and an <|endoftext|> stream. Packing
    leaves no padding anywhere, so every position in a batch is real text; the last incomplete block is dropped.
    Indexing gives one block (int64), as a row of the materialised (blocks, block_size) array would be. Held in
    memory: nothing per block here; the loader's shuffled order of the blocks (data/sampling.py) is 8 bytes per
    block plus a Python list of the epoch's indices, ~35 MB per 100M tokens in blocks of 128.
    """

    def __init__(self, stream: DocumentStream, block_size: int, start_id: int | None = None, name: str = "the corpus"):
        self.stream, self.block_size, self.start_id = stream, block_size, start_id
        self.body = block_size if start_id is None else block_size - 1
        self.count = len(stream) // self.body
        if self.count == 0:
            raise InputError(
                f"{name} has {len(stream)} tokens, fewer than one block of {block_size} (corpus.block_size)"
            )

    def __len__(self) -> int:
        return self.count

    @property
    def shape(self) -> tuple[int, int]:
        return self.count, self.block_size

    def __getitem__(self, index: int) -> np.ndarray:
        if not -self.count <= index < self.count:
            raise IndexError(index)
        return self.blocks(np.array([index % self.count]))[0]

    def blocks(self, indices: np.ndarray) -> np.ndarray:
        """Blocks `indices`, as a (len(indices), block_size) int64 array."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), self.block_size), dtype=np.int64)
        out[:, self.block_size - self.body :] = self.stream.take(indices[:, None] * self.body + np.arange(self.body))
        if self.start_id is not None:
            out[:, 0] = self.start_id
        return out

    def array(self) -> np.ndarray:
        """Every block, materialised (small corpora and tests)."""
        return self.blocks(np.arange(self.count))


def pack_blocks(
    documents: TokenizedDocuments | list[list[int]],
    block_size: int,
    separator_id: int,
    *,
    start_id: int | None = None,
    name: str = "the corpus",
) -> np.ndarray:
    """Documents with `separator_id` after each, cut into an int64 (blocks, block_size) array (see PackedBlocks)."""
    if not isinstance(documents, TokenizedDocuments):
        documents = TokenizedDocuments.from_lists(documents)
    return PackedBlocks(DocumentStream(documents, separator_id), block_size, start_id, name).array()
