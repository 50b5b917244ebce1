"""Text -> token ids, once: batches through the fast tokenizer on every core, written to .npy files as they come,
cached so that the next run maps them from disk instead of tokenising (or even reading) the text again.

A cache entry is a folder `CACHE_DIR/tokens-KEY/` of plain arrays that `np.load(..., mmap_mode="r")` opens:
`ids.npy` (int32, every document's ids one after another), `offsets.npy` (int64, where each document starts),
for text files `positions.npy` (int64, the byte where each document's line starts) and `meta.json` (counts, the
files' sizes and times: for people, and for the check below). Paragraphs and whole files (corpus.document) are
tokenised in pieces (data/corpus.py), so their entries say where each piece starts instead: `positions.npy` per
piece, `pieces.npy` (int64, where each piece starts in the ids, and their end) and `first_pieces.npy` (int64, each
document's first piece, and the piece count). It is written under a temporary name and renamed when complete, so a
killed run leaves no half entry behind.

The key of text files is made without reading them: their absolute paths, sizes and modification times, the
tokenizer (a digest of its full JSON) and what a document is. Any write to a file changes its time, so editing,
appending or replacing a file, renaming or moving it, another file list, another tokenizer or another
corpus.document gives another key. A file changed with its size and time kept (`touch -r`, some copy tools) is
caught when it touches one of the 16 documents (pieces) that every cache hit reads back from the files and
tokenises again (the first, the last, 14 spread by a fixed seed): the entry is then made again, with a warning.
In-memory documents (a `datasets` dataset, a task's text) are keyed by their text, as before.

Memory while tokenising: one batch of text and its id lists, and 8 bytes per document (piece) for the lengths and
8 for the positions (16 MB per million documents); the ids go to the file as they come. Without a cache folder they
are kept in memory instead: 4 bytes per token (400 MB per 100M tokens). A batch is at most 2,000 texts or 4M
characters; the tokenizer library holds ~100 bytes per token of it, so a corpus of short lines peaks at a few tens
of MB and paragraphs or files, cut into ~64 KB pieces, at ~150 MB (a full batch), however long a document is. A
tokenizer that does not split text at line breaks (`cuts_cleanly`) is given whole paragraphs and files instead: its
peak then grows with the longest document (~3 GB for a file of 20 MB).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import BinaryIO

import numpy as np

from finetune.console import console, parallel_tokenizing, progress_bar
from finetune.data.corpus import PIECE_BYTES, Piece, file_pieces, no_text, read_line, read_piece
from finetune.data.token_arrays import IDS_FILE, OFFSETS_FILE, TokenizedDocuments, offsets_of
from finetune.errors import InputError

CACHE_FORMAT = 2  # part of every cache key: bump it when the cached arrays change meaning (1: one .npz file)
POSITIONS_FILE, META_FILE = "positions.npy", "meta.json"
PIECES_FILE, FIRST_PIECES_FILE = "pieces.npy", "first_pieces.npy"  # paragraphs and files (corpus.document)
SAMPLE_SIZE = 16  # documents read back and tokenised again to check a text files' cache entry
BATCH_CHARACTERS = 1 << 22  # a batch ends at this much text too: a corpus of very long lines stays a few MB a batch
NPY_INT32 = np.dtype("<i4")


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text without special tokens, by the tokenizer's Rust batch encoding (threads when allowed).

    The backend is called directly: the transformers wrapper would build attention masks and offsets that are
    thrown away (about 20% of the time). As the wrapper does for an untruncated, unpadded call, any truncation or
    padding stored with the tokenizer is turned off first.
    """
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]


def tokenize_documents(tokenizer, documents: list[str], batch_size: int = 2000) -> list[list[int]]:
    """Token ids of each document without special tokens, as Python lists (small corpora; see tokenize_corpus)."""
    ids: list[list[int]] = []
    for start in range(0, len(documents), batch_size):
        ids += encode(tokenizer, documents[start : start + batch_size])
    return ids


def tokenize_corpus(
    tokenizer,
    documents: list[str],
    cache_dir: Path | None = None,
    description: str = "tokenizing",
    batch_size: int = 2000,
    show_progress: bool = True,
    name: str = "the corpus",
) -> TokenizedDocuments:
    """Token ids of in-memory documents; from `cache_dir` if this text and tokenizer were seen (keyed by the text).

    Text that gives no token but [UNK] and other special tokens is refused (`name` says which text).
    """
    cache = TokenCache(cache_dir, corpus_cache_key(tokenizer, documents)) if cache_dir is not None else None
    if cache is not None:
        cached = cache.load(len(documents))
        if cached is not None:
            console.print(f"{description}: {len(cached):,} documents, {len(cached.ids):,} tokens from {cache.path}")
            check_known_tokens(cached, tokenizer, documents[0] if documents else "", name)
            return cached
    batches = (
        ([piece.text for piece in batch], None, None, len(batch))
        for batch in _batched((Piece(text, 0, True) for text in documents), batch_size)
    )
    with progress_bar(show_progress and len(documents) > batch_size) as progress:
        task = progress.add_task(description, total=len(documents), status="")
        tokenized = _write_tokens(
            tokenizer,
            batches,
            cache,
            lambda count: progress.advance(task, count),
            lambda tokenized: check_known_tokens(tokenized, tokenizer, documents[0] if documents else "", name),
            report=description if show_progress else None,
        )
    return tokenized


def tokenize_files(
    tokenizer,
    paths: list[Path],
    cache_dir: Path | None = None,
    description: str = "tokenizing",
    batch_size: int = 2000,
    show_progress: bool = True,
    name: str = "the corpus",
    document: str = "line",
) -> TokenizedDocuments:
    """Token ids of every document of the files (`document`: each non-empty line, paragraph or file), streamed;
    from `cache_dir` without reading the text when the files (paths, sizes, times), the tokenizer and `document`
    were seen, a sample of documents checked (see the module)."""
    paths = [Path(path) for path in paths]
    sizes = [path.stat().st_size for path in paths]
    # Paragraphs and files are cut into pieces only where this tokenizer gives the tokens of the whole text.
    piece_bytes = None if document != "line" and not cuts_cleanly(tokenizer) else PIECE_BYTES
    key = files_cache_key(tokenizer, paths, document, piece_bytes)
    cache = TokenCache(cache_dir, key) if cache_dir is not None else None
    if cache is not None:
        cached = cache.load(check=lambda tokenized: sample_mismatch(tokenized, tokenizer, cache.path, paths, document))
        if cached is not None:
            console.print(f"{description}: {len(cached):,} documents, {len(cached.ids):,} tokens from {cache.path}")
            check_known_tokens(cached, tokenizer, _first_text(paths, cache.path, document), name)
            return cached
    first_text: list[str] = []

    def batches() -> Iterator[tuple[list[str], list[int], list[bool], int]]:
        for batch in _batched(file_pieces(paths, document, piece_bytes), batch_size):
            texts, positions = [piece.text for piece in batch], [piece.position for piece in batch]
            first_text[:] = first_text or texts[:1]
            yield texts, positions, [piece.first for piece in batch], positions[-1] + len(texts[-1])

    def check(tokenized: TokenizedDocuments) -> None:
        if not len(tokenized):
            raise no_text(paths)
        check_known_tokens(tokenized, tokenizer, first_text[0], name)

    megabytes = sum(sizes) / 1e6
    files = [
        {"path": str(path.resolve()), "size": size, "mtime_ns": path.stat().st_mtime_ns}
        for path, size in zip(paths, sizes)
    ]
    with progress_bar(show_progress and megabytes > 1) as progress:
        task = progress.add_task(f"{description} (MB)", total=round(megabytes, 1), status="")
        meta = {"files": files, **({"document": document, "piece_bytes": piece_bytes} if document != "line" else {})}
        return _write_tokens(
            tokenizer,
            batches(),
            cache,
            lambda end: progress.update(task, completed=round(end / 1e6, 1)),
            check,
            meta,
            report=description if show_progress else None,
            grouped=document != "line",
        )


def cuts_cleanly(tokenizer) -> bool:
    """Whether text cut before a line break that follows a non-space tokenises as the whole text does: so for
    byte-level BPE (GPT-2's) and WordPiece; not for a tokenizer that puts a space or '▁' before every text."""
    whole, pieces = "one two\n  three\n\nfour five", ["one two", "\n  three", "\n\nfour five"]
    ids = encode(tokenizer, [whole, *pieces])
    return ids[0] == [token for piece_ids in ids[1:] for token in piece_ids]


def _batched(pieces: Iterable[Piece], batch_size: int) -> Iterator[list[Piece]]:
    """Pieces in batches of `batch_size` pieces or BATCH_CHARACTERS of text, whichever is first."""
    batch, characters = [], 0
    for piece in pieces:
        batch.append(piece)
        characters += len(piece.text)
        if len(batch) == batch_size or characters >= BATCH_CHARACTERS:
            yield batch
            batch, characters = [], 0
    if batch:
        yield batch


def _write_tokens(
    tokenizer,
    batches: Iterable[tuple],
    cache: TokenCache | None,
    advance,
    check,
    meta: dict | None = None,
    report: str | None = None,
    grouped: bool = False,
) -> TokenizedDocuments:
    """Tokenise the batches (texts, byte positions or None, whether each text starts a document or None, progress)
    into the cache entry, or into memory (`grouped`: the texts are pieces of documents); with `report`, print what
    was made and how fast (the throughput a large corpus is planned by)."""
    started = time.perf_counter()
    with cache.filling() if cache is not None else nullcontext(None) as folder:
        writer = TokenWriter(folder, grouped)
        try:
            with parallel_tokenizing():
                for texts, positions, firsts, progress in batches:
                    writer.add(encode(tokenizer, texts), positions, firsts)
                    advance(progress)
            tokenized = writer.finish({**(meta or {}), "tokenizer": tokenizer_digest(tokenizer)})
        finally:
            writer.close()
        check(tokenized)  # before the entry is kept: refused text is not cached
    if report is not None:
        seconds = time.perf_counter() - started
        console.print(
            f"{report}: {len(tokenized):,} documents, {len(tokenized.ids):,} tokens in {seconds:.1f} s "
            f"({len(tokenized.ids) / max(seconds, 1e-9):,.0f} tokens/s)"
            + (f", cached in {cache.path}" if cache is not None else "")
        )
    if cache is not None:  # mapped from the entry's final place, which pickling names
        return TokenizedDocuments.load(cache.path)
    return tokenized


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


class PieceReader:
    """A paragraph or file entry's pieces read back from the files: piece i's bytes run from its position to the
    next piece's (or its file's end), and they make its text as they did when it was tokenised."""

    def __init__(self, entry: Path, paths: list[Path], document: str):
        self.paths, self.document = paths, document
        self.positions = np.load(entry / POSITIONS_FILE, mmap_mode="r")
        self.pieces = np.load(entry / PIECES_FILE, mmap_mode="r")  # where each piece's ids start, and their end
        self.first_pieces = np.load(entry / FIRST_PIECES_FILE, mmap_mode="r")

    def __len__(self) -> int:
        return len(self.positions)

    def text(self, index: int) -> str:
        """Piece `index`'s text ('' if its bytes are no longer there, or not UTF-8)."""
        end = int(self.positions[index + 1]) if index + 1 < len(self.positions) else None
        return read_piece(
            self.paths,
            int(self.positions[index]),
            end,
            self.document,
            self.starts_document(index),
            self.starts_document(index + 1),
        )

    def starts_document(self, index: int) -> bool:
        """Whether piece `index` is a document's first (the piece count counts as one: nothing follows it)."""
        found = int(np.searchsorted(self.first_pieces, index))
        return found < len(self.first_pieces) and int(self.first_pieces[found]) == index


def sample_mismatch(
    tokenized: TokenizedDocuments, tokenizer, entry: Path, paths: list[Path], document: str = "line"
) -> str | None:
    """Why a text files' entry does not hold these files' tokens, from SAMPLE_SIZE documents (pieces of paragraphs
    or files) read back; None if it does. They are found by their byte positions: nothing before them is read."""
    if document == "line":
        positions = np.load(entry / POSITIONS_FILE, mmap_mode="r")
        count, what = len(tokenized), "document"
        if len(positions) != count:
            return f"{len(positions)} positions for {count} documents"
    else:
        reader = PieceReader(entry, paths, document)
        count, what = len(reader), "piece"
        if (
            len(reader.pieces) != count + 1
            or len(reader.first_pieces) != len(tokenized) + 1
            or reader.pieces[-1] != len(tokenized.ids)
        ):
            return f"{count} positions, {len(reader.pieces) - 1} pieces for {len(tokenized)} documents"
    if not count:
        return "no documents"
    picks = sorted({0, count - 1, *np.random.default_rng(0).integers(0, count, SAMPLE_SIZE - 2).tolist()})
    if document == "line":
        texts = [read_line(paths, int(positions[index])) for index in picks]
        stored = [tokenized.document(index) for index in picks]
    else:
        texts = [reader.text(index) for index in picks]
        stored = [tokenized.ids[reader.pieces[index] : reader.pieces[index + 1]] for index in picks]
    for index, text in zip(picks, texts):
        if not text:
            where = positions[index] if document == "line" else reader.positions[index]
            return f"{what} {index:,} is no longer at byte {int(where):,}"
    for index, ids, expected in zip(picks, encode(tokenizer, texts), stored):
        if ids != expected.tolist():
            return f"{what} {index:,} tokenizes differently"
    return None


def _first_text(paths: list[Path], entry: Path, document: str) -> str:
    """The first document's (first piece's) text, for an error message about a cached entry."""
    if document != "line":
        reader = PieceReader(entry, paths, document)
        return reader.text(0) if len(reader) else ""
    positions = np.load(entry / POSITIONS_FILE, mmap_mode="r")
    return read_line(paths, int(positions[0])) if len(positions) else ""


def check_known_tokens(
    tokenized: TokenizedDocuments, tokenizer, first_text: str, name: str, chunk: int = 1 << 20
) -> None:
    """Refuse text whose tokens are all [UNK] or other special tokens: a model learns nothing from it (BERT: loss 0)."""
    if not len(tokenized):  # nothing to tokenize: packing says the text is too short
        return
    special_ids = np.array(sorted(set(tokenizer.all_special_ids)))
    for start in range(0, len(tokenized.ids), chunk):  # a real corpus shows a known token in its first chunk
        if not np.isin(tokenized.ids[start : start + chunk], special_ids).all():
            return
    if len(tokenized.ids) == 0:
        found = "no tokens at all"
    else:
        found = "only " + ", ".join(tokenizer.convert_ids_to_tokens(np.unique(tokenized.ids).tolist()))
    raise InputError(
        f"{name} gives no known tokens: its {len(tokenized):,} documents tokenize to {found} "
        f"(the tokenizer knows none of their characters; the first is {first_text[:40]!r})"
    )
