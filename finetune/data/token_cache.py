"""Text -> token ids, once: batches through the fast tokenizer on every core, written to .npy files as they come,
cached so that the next run maps them from disk instead of tokenising (or even reading) the text again.

A cache entry (data/token_store.py writes, keys and finds them) is a folder `CACHE_DIR/tokens-KEY/` of plain arrays
that `np.load(..., mmap_mode="r")` opens: `ids.npy` (int32, every document's ids one after another), `offsets.npy`
(int64, where each document starts), for text files `positions.npy` (int64, the byte where each document's line
starts) and `meta.json` (counts, the files' sizes and times: for people, and for the check below). Paragraphs and
whole files (corpus.document) are tokenised in pieces (data/corpus.py), so their entries say where each piece starts
instead: `positions.npy` per piece, `pieces.npy` (int64, where each piece starts in the ids, and their end) and
`first_pieces.npy` (int64, each document's first piece, and the piece count). It is written under a temporary name
and renamed when complete, so a killed run leaves no half entry behind.

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

import time
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from finetune.console import console, parallel_tokenizing, progress_bar
from finetune.data.corpus import PIECE_BYTES, Piece, file_pieces, no_text, read_line, read_piece
from finetune.data.token_arrays import TokenizedDocuments
from finetune.data.token_store import (
    FIRST_PIECES_FILE,
    PIECES_FILE,
    POSITIONS_FILE,
    TokenCache,
    TokenWriter,
    corpus_cache_key,
    files_cache_key,
    tokenizer_digest,
)
from finetune.errors import InputError

SAMPLE_SIZE = 16  # documents read back and tokenised again to check a text files' cache entry
BATCH_CHARACTERS = 1 << 22  # a batch ends at this much text too: a corpus of very long lines stays a few MB a batch


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
