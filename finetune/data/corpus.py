"""Raw text -> documents (streamed from files, or read from a dataset), the validation split, masked blocks.

A document of text files is a non-empty line, a paragraph or a whole file (corpus.document); the last two are read
and tokenised in pieces (`file_pieces`), which the token cache reads back by their byte positions (`read_piece`).

The token ids live in finetune/data/token_arrays.py (flat arrays, the lazy document stream, packed blocks) and
are made and cached by finetune/data/token_cache.py; the names of both used from here before still import.
"""

from __future__ import annotations

import bisect
import itertools
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.data.masking import MaskingRule
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments, document_stream, pack_blocks  # noqa: F401  (re-exported)
from finetune.errors import DataFileError, InputError

# Characters that show nothing: controls, format characters (zero-width space U+200B, joiners, the byte-order
# mark U+FEFF), spaces and separators. BERT's normaliser deletes most of them, so a line of only these is empty.
INVISIBLE_CATEGORIES = {"Cc", "Cf", "Zs", "Zl", "Zp"}


def document_text(line: str) -> str:
    """A line as a document: stripped, and empty when none of its characters shows."""
    line = line.strip()
    return line if any(unicodedata.category(character) not in INVISIBLE_CATEGORIES for character in line) else ""


# What a document of text files is (corpus.document). A paragraph or a file is tokenised in pieces of about
# PIECE_BYTES, cut where the tokenizers split text anyway (before a line break that follows a character that is
# not a space), so that a document of 100 MB streams through as lines do, a piece at a time.
PIECE_BYTES = 1 << 16


class Piece(NamedTuple):
    """A document, or a part of a paragraph or a file, as it is tokenised: its text, the byte where it starts in the
    files one after another (the token cache reads it back from there), and whether its document starts with it."""

    text: str
    position: int
    first: bool


def piece_text(raw: str, document: str, first: bool, last: bool) -> str:
    """The text of a paragraph's or a file's piece from its bytes (decoded): how pieces are made and read back.

    A piece after its document's first starts with the line break it was cut before. paragraph: the lines stripped
    (as lines are), empty ones left out (blank lines only ever follow a paragraph's last piece), joined by line
    breaks; file: the text as it is (indentation, blank lines), \r\n read as \n, the file's start and end stripped.
    """
    if document == "paragraph":
        text = "\n".join(line for line in map(document_text, raw.split("\n")) if line)
        return text if first else "\n" + text
    text = raw.replace("\r\n", "\n")
    text = text.lstrip() if first else text
    return text.rstrip() if last else text


DOCUMENT_KINDS = ("line", "paragraph", "file")  # the values of corpus.document


def text_documents(text: str, document: str = "line") -> list[str]:
    """The documents of a text held in memory (a prompt), read as text files of that `document` kind are read."""
    if document not in DOCUMENT_KINDS:
        raise InputError(f"expected one of {', '.join(DOCUMENT_KINDS)} (got {document!r})", value=document)
    if document == "line":
        return [line for line in map(document_text, text.splitlines()) if line]
    if document == "file":
        return [piece_text(text, "file", True, True)] if document_text(text) else []
    paragraphs, lines = [], []
    for line in [*text.splitlines(), ""]:  # a blank line (or the end) closes a paragraph
        if document_text(line):
            lines.append(document_text(line))
        elif lines:
            paragraphs.append("\n".join(lines))
            lines = []
    return paragraphs


def file_pieces(paths: list[Path], document: str = "line", piece_bytes: int | None = PIECE_BYTES) -> Iterator[Piece]:
    """The files' documents (corpus.document: every non-empty line, paragraph or file), as pieces (a line's document
    is one piece; `piece_bytes` None: every document one piece), with their byte positions in the files one after
    another.

    Read a line at a time: a corpus larger than memory streams through. A file that is not UTF-8 is named with
    its line. The positions let the token cache find a piece again without reading the text before it.
    """
    position = 0
    for path in paths:
        with open(path, "rb") as handle:
            if document == "line":
                for line_number, raw in enumerate(handle, start=1):
                    line = document_text(_decoded(raw, path, line_number))
                    if line:
                        yield Piece(line, position, True)
                    position += len(raw)
            else:
                position = yield from _cut_pieces(handle, path, position, document, piece_bytes)


def _decoded(raw: bytes, path: Path, line_number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path, line=line_number) from None


def _cut_pieces(handle, path: Path, position: int, document: str, piece_bytes: int | None):
    """The pieces of one file's paragraphs (or of the file as one document); returns the position after the file."""
    pending = bytearray()  # the current piece's bytes, from `start`
    start, cut, first, shown = position, None, True, False  # cut: where in `pending` the piece may end
    for line_number, raw in enumerate(handle, start=1):
        line = _decoded(raw, path, line_number)
        visible = bool(document_text(line))
        if document == "paragraph" and not visible:  # a blank line ends the paragraph
            if shown:
                yield Piece(piece_text(pending.decode(), document, first, True), start, first)
            pending, start, cut, first, shown = bytearray(), position + len(raw), None, True, False
            position += len(raw)
            continue
        if visible and cut is not None:  # the piece is long enough and the document goes on: cut it off
            yield Piece(piece_text(pending[:cut].decode(), document, first, False), start, first)
            pending, start, cut, first = pending[cut:], start + cut, None, False
        pending += raw
        position += len(raw)
        shown = shown or visible
        ending = len(raw) - len(raw.rstrip(b"\r\n")) if raw.endswith(b"\n") else 0
        body = line[: len(line) - ending]
        # Cut before a line break that follows a character that is not a space: byte-level BPE and WordPiece split
        # the text there anyway, so the pieces' tokens are the document's (a tokenizer that does not gets whole
        # documents: token_cache.cuts_cleanly).
        if (
            piece_bytes is not None
            and shown
            and ending
            and len(pending) >= piece_bytes
            and body
            and not body[-1].isspace()
        ):
            cut = len(pending) - ending
    if shown:
        yield Piece(piece_text(pending.decode(), document, first, True), start, first)
    return position


def _file_at(paths: list[Path], position: int) -> tuple[Path | None, int, int]:
    """The file holding byte `position` of the files one after another, where it starts and ends (None: past them)."""
    ends = list(itertools.accumulate(path.stat().st_size for path in paths))
    file = bisect.bisect_right(ends, position)
    if file == len(paths):
        return None, 0, 0
    return paths[file], ends[file - 1] if file else 0, ends[file]


def _read_at(paths: list[Path], start: int, end: int | None = None, line: bool = False) -> str | None:
    """The text from byte `start` of the files one after another to the end of its line (`line`), or to `end` or
    its file's end, whichever is first; None where no file is, or where the bytes are not UTF-8."""
    path, file_start, file_end = _file_at(paths, start)
    if path is None:
        return None
    with open(path, "rb") as handle:
        handle.seek(start - file_start)
        stop = file_end if end is None else min(end, file_end)
        raw = handle.readline() if line else handle.read(max(0, stop - start))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_line(paths: list[Path], position: int) -> str:
    """The line document whose line starts at byte `position` ('' if none is there): the token cache's check."""
    text = _read_at(paths, position, line=True)
    return document_text(text) if text is not None else ""


def read_piece(paths: list[Path], start: int, end: int | None, document: str, first: bool, last: bool) -> str:
    """A paragraph's or a file's piece read back from its bytes, `start` to `end` (the next piece's start; None: its
    file's end), as `file_pieces` made it ('' if it is not there): the token cache's check."""
    text = _read_at(paths, start, end)
    return piece_text(text, document, first, last) if text is not None else ""


def file_documents(paths: list[Path], document: str = "line") -> Iterator[str]:
    """The files' documents as whole texts (each paragraph or file joined from its pieces)."""
    parts: list[str] = []
    for piece in file_pieces(paths, document):
        if piece.first and parts:
            yield "".join(parts)
            parts = []
        parts.append(piece.text)
    if parts:
        yield "".join(parts)


def no_text(paths: list[Path]) -> DataFileError:
    """The error for files without a single document."""
    return DataFileError(
        "no text (every line is empty, or holds only invisible characters such as U+200B)",
        source=", ".join(map(str, paths)),
    )


def read_documents(paths: list[Path], document: str = "line") -> list[str]:
    """The files' documents (lines, paragraphs or whole files), all in memory: small corpora, tokenizer training."""
    documents = list(file_documents(paths, document))
    if not documents:
        raise no_text(paths)
    return documents


def dataset_label(name: str, config: str | None = None, data_files=None) -> str:
    """How errors name a `datasets` dataset."""
    return f"dataset {name}" + (f" ({config})" if config else "") + (f" files {data_files}" if data_files else "")


def load_dataset_split(name: str, config: str | None, split: str, data_files=None, streaming: bool = False):
    """`datasets.load_dataset` of one split (read whole, or as a stream); a failure is one line naming the dataset."""
    import datasets  # only this path needs it, and it is slow to import

    try:
        return datasets.load_dataset(name, config, split=split, data_files=data_files, streaming=streaming)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        verb = "stream" if streaming else "load"
        raise DataFileError(
            f"cannot {verb} split {split!r}: {reason}", source=dataset_label(name, config, data_files), value=split
        ) from None


def read_dataset_documents(
    name: str,
    config: str | None = None,
    split: str = "train",
    text_column: str = "text",
    data_files: str | list[str] | None = None,
) -> list[str]:
    """Each non-empty row of a `datasets` dataset's text column is one document (stripped, as lines are)."""
    label = dataset_label(name, config, data_files)
    dataset = load_dataset_split(name, config, split, data_files)
    if text_column not in dataset.column_names:
        raise DataFileError(
            f"no column {text_column!r} (columns: {', '.join(dataset.column_names)}; set corpus.text_column)",
            source=label,
            value=text_column,
        )
    texts = (text for text in dataset[text_column] if isinstance(text, str))
    documents = [document for document in map(document_text, texts) if document]
    if not documents:
        raise DataFileError(f"no text in column {text_column!r} of split {split!r}", source=label, value=text_column)
    return documents


def split_indices(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which of `count` documents train and which (`fraction`, at least one, chosen with the seed) validate.

    Both sorted, so each part keeps the corpus order. Works on indices, so the same split is made whether the
    documents are strings in memory or rows of the token cache.
    """
    if count < 2:
        raise InputError("the corpus has a single document: give corpus.validation_files to validate on", value=count)
    order = np.random.default_rng(seed).permutation(count)
    held_out = max(1, int(count * fraction))
    validation = np.sort(order[:held_out])
    train = np.ones(count, dtype=bool)
    train[validation] = False
    return np.flatnonzero(train), validation


def split_documents(documents: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Hold out `fraction` of the documents (at least one), chosen with the seed, for validation."""
    train, validation = split_indices(len(documents), fraction, seed)
    return [documents[index] for index in train], [documents[index] for index in validation]


class MaskedBlocks(Dataset):
    """Packed blocks (an array, or PackedBlocks cut from the mapped ids as they are read) whose masks are drawn per
    (seed, epoch, block): reproducible whatever the worker count."""

    def __init__(self, blocks: np.ndarray | PackedBlocks, rule: MaskingRule, seed: int, fixed_masks: bool = False):
        self.blocks, self.rule, self.seed = blocks, rule, seed
        # Validation uses the same masks at every evaluation so that its loss is comparable over time.
        self.fixed_masks = fixed_masks
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """New masks each epoch (dynamic masking, as RoBERTa does); no effect with fixed masks."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        epoch = 0 if self.fixed_masks else self.epoch
        rng = np.random.default_rng((self.seed, epoch, index))
        inputs, labels = self.rule.apply(self.blocks[index], rng)
        return {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
