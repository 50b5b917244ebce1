"""The token cache's entries on disk: a folder of .npy arrays written as the ids come (TokenWriter), found by a key
made of the tokenizer and the text or the files' names, sizes and times, and renamed into place only when complete
(TokenCache). data/token_cache.py tokenises into them and decides when an entry still matches its text."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from finetune.data.token_arrays import IDS_FILE, OFFSETS_FILE, TokenizedDocuments, offsets_of

CACHE_FORMAT = 2  # part of every cache key: bump it when the cached arrays change meaning (1: one .npz file)
POSITIONS_FILE, META_FILE = "positions.npy", "meta.json"
PIECES_FILE, FIRST_PIECES_FILE = "pieces.npy", "first_pieces.npy"  # paragraphs and files (corpus.document)
NPY_INT32 = np.dtype("<i4")


class TokenWriter:
    """Token ids added a batch at a time: appended to `folder/ids.npy` (or kept in memory without a folder).

    The .npy header is written first for an empty array and rewritten with the final length at the end; numpy
    pads headers so that the length can grow in place ("growth axis"), so the data never moves. `grouped`: what is
    added are pieces, and documents are the runs of pieces from one that starts a document to the next.
    """

    def __init__(self, folder: Path | None, grouped: bool = False):
        self.folder, self.count, self.grouped, self.added = folder, 0, grouped, 0  # count: ids; added: texts
        self.lengths: list[np.ndarray] = []
        self.positions: list[np.ndarray] = []
        self.first_pieces: list[np.ndarray] = []  # grouped: the index of each document's first piece
        self.parts: list[np.ndarray] = []  # without a folder
        self.handle: BinaryIO | None = None
        if folder is not None:
            # held open across add() calls; finish() closes it (a with-block cannot span them)
            self.handle = handle = open(folder / IDS_FILE, "wb")  # noqa: SIM115
            self._write_header(handle)
            self.data_start = handle.tell()

    def _write_header(self, handle: BinaryIO) -> None:
        handle.seek(0)
        np.lib.format.write_array_header_1_0(
            handle, {"descr": np.lib.format.dtype_to_descr(NPY_INT32), "fortran_order": False, "shape": (self.count,)}
        )

    def add(
        self, id_lists: list[list[int]], positions: list[int] | None = None, firsts: list[bool] | None = None
    ) -> None:
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=NPY_INT32, count=int(lengths.sum()))
        if self.grouped:
            assert firsts is not None  # grouped batches say which of their pieces start a document
            self.first_pieces.append(np.flatnonzero(firsts) + self.added)
        self.added += len(id_lists)
        self.lengths.append(lengths)
        if positions is not None:
            self.positions.append(np.asarray(positions, dtype=np.int64))
        if self.handle is not None:
            self.handle.write(ids.tobytes())
        else:
            self.parts.append(ids)
        self.count += len(ids)

    def finish(self, meta: dict) -> TokenizedDocuments:
        """The documents written; with a folder, also offsets, positions and meta.json there, ids mapped from it."""
        offsets = pieces = offsets_of(np.concatenate([np.empty(0, dtype=np.int64), *self.lengths]))
        if self.grouped:  # a document's ids are its pieces' one after another: its offsets are its first piece's
            first_pieces = np.concatenate([np.empty(0, dtype=np.int64), *self.first_pieces, [len(pieces) - 1]])
            offsets = pieces[first_pieces]
        if self.handle is None:
            return TokenizedDocuments(np.concatenate([np.empty(0, dtype=np.int32), *self.parts]), offsets)
        folder = self.folder
        assert folder is not None  # the ids file is open only in a folder
        self._write_header(self.handle)
        if self.handle.tell() != self.data_start:  # cannot happen with numpy's padded headers; never risk it
            raise RuntimeError("the .npy header changed length")
        self.handle.close()
        np.save(folder / OFFSETS_FILE, offsets)
        if self.positions:
            np.save(folder / POSITIONS_FILE, np.concatenate(self.positions))
        if self.grouped:
            np.save(folder / PIECES_FILE, pieces)
            np.save(folder / FIRST_PIECES_FILE, first_pieces)
            meta = {"pieces": len(pieces) - 1, **meta}
        meta = {"format": CACHE_FORMAT, "documents": len(offsets) - 1, "tokens": self.count, **meta}
        (folder / META_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        return TokenizedDocuments.load(folder)

    def close(self) -> None:
        if self.handle is not None and not self.handle.closed:
            self.handle.close()


class TokenCache:
    """One entry of the token cache: `cache_dir/tokens-KEY/`, read memory-mapped, written whole or not at all."""

    def __init__(self, cache_dir: Path, key: str):
        self.cache_dir = Path(cache_dir).expanduser()
        self.path = self.cache_dir / f"tokens-{key}"

    def load(self, document_count: int | None = None, check=None) -> TokenizedDocuments | None:
        """The entry's documents, memory-mapped; None when absent, or (with a warning) unreadable or failing
        `check(documents) -> reason or None`, so that they are made again."""
        if not self.path.is_dir():
            return None
        try:
            cached = TokenizedDocuments.load(self.path)
            if document_count is not None and len(cached) != document_count:
                raise ValueError(f"{len(cached)} documents instead of {document_count}")
            reason = check(cached) if check is not None else None
        except (OSError, ValueError, EOFError, KeyError) as error:
            warnings.warn(f"ignoring the unreadable token cache {self.path} ({error}); tokenizing again", stacklevel=3)
            return None
        if reason is not None:
            warnings.warn(
                f"the token cache {self.path} does not match the text: {reason} (a file changed but kept "
                "its size and modification time); tokenizing again",
                stacklevel=3,
            )
            return None
        return cached

    @contextmanager
    def filling(self) -> Iterator[Path]:
        """A temporary folder beside the entry, renamed to it when the block ends without an error, else deleted."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=f".{self.path.name}.", suffix=".tmp"))
        try:
            yield temporary
            if self.path.exists():  # an unreadable entry: out of the way first (a folder cannot be replaced)
                stale = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=f".{self.path.name}.", suffix=".old"))
                os.replace(self.path, stale / "entry")
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(temporary, self.path)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise


def tokenizer_digest(tokenizer) -> str:
    """A digest of the tokenizer's full JSON (vocabulary, merges, normaliser, added tokens): its identity here."""
    return hashlib.blake2b(tokenizer.backend_tokenizer.to_str().encode("utf-8"), digest_size=16).hexdigest()


def corpus_cache_key(tokenizer, documents: list[str]) -> str:
    """A digest of the tokenizer and the documents' text: a change to either gives another key."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"finetune tokens v{CACHE_FORMAT} documents {tokenizer_digest(tokenizer)}".encode())
    for text in documents:
        encoded = text.encode("utf-8")
        # Length-prefixed, so that ["ab", "c"] and ["a", "bc"] differ.
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


def files_cache_key(tokenizer, paths: list[Path], document: str = "line", piece_bytes: int | None = None) -> str:
    """A digest of the tokenizer, what a document is (and the pieces of one) and each file's absolute path, size
    and modification time: no text is read."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"finetune tokens v{CACHE_FORMAT} files {tokenizer_digest(tokenizer)}".encode())
    if document != "line":  # a line entry's key is what it was before documents could be anything else
        digest.update(f" {document} pieces of {piece_bytes or 'a whole document'}".encode())
    for path in paths:
        stat = path.stat()
        digest.update(json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns]).encode("utf-8"))
    return digest.hexdigest()
