"""The text a pretraining run reads, and how it becomes its training and validation token ids.

Text files are never held in memory: they are streamed to train a tokenizer (when the run trains one) and to
tokenise them (once: the ids are cached and memory-mapped by later runs, which then read no text at all). Their
documents are lines, paragraphs or whole files (corpus.document; the last two read in pieces, data/corpus.py).
When validation is held out of them, the held-out documents are chosen by index among all documents, so they are
the documents `split_documents` would choose from the list of them, and the split is a selection of the cached ids
(changing the seed or the fraction tokenises nothing again). A `datasets` dataset or a task's text columns are
read whole, as before, and keyed in the cache by their text.

Before anything is tokenised, a text too short for the run's layout (one block, a batch of blocks or of BPTT rows)
is refused from its size in bytes alone: no token of the families' tokenizers stands for less than one byte but one
that a tokenizer may put before a document (SentencePiece's '▁'), and each document adds one separator. A text that
passes that bound and still gives too few tokens is refused once they are counted, with its files and the numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from finetune.data.corpus import dataset_label, file_pieces, no_text, read_dataset_documents, split_indices
from finetune.data.task_files import task_documents
from finetune.data.token_arrays import TokenizedDocuments
from finetune.data.token_cache import tokenize_corpus, tokenize_files
from finetune.errors import InputError
from finetune.tasks.specs import task_spec

TRAINING_NAME, VALIDATION_NAME = "the training text", "the validation text"


class StreamNeed(NamedTuple):
    """The fewest tokens a text must give as the run reads it (its documents, a separator after each), and for
    what, as the error says it: e.g. "8 blocks of 129 tokens (training.batch_size, corpus.block_size)"."""

    tokens: int
    purpose: str


class SingleDocumentError(InputError):
    """Training text that is one document of its kind (a paragraph, a file): none is left to hold out. The reason
    starts with the kind of document, for the stage to name the setting that chose it."""


@dataclass
class PretrainingText:
    """Training text (files, or documents in memory) and validation text (files, a dataset's split, or held out of
    the training text)."""

    train_files: list[Path] = field(default_factory=list)  # streamed; empty when `documents` holds the text
    documents: list[str] | None = None  # a dataset's or a task's text
    validation_files: list[Path] = field(default_factory=list)
    validation_documents: list[str] | None = None  # a dataset's validation split
    validation_fraction: float = 0.05  # held out of the training text when no validation text is given
    seed: int = 0
    document: str = "line"  # what a document of the files is: line, paragraph or file (corpus.document)
    source: str = ""  # how errors name the training text: its files, the dataset or the task
    needs: tuple[StreamNeed, StreamNeed] | None = None  # what the training and the validation text must give
    _count: int | None = None  # documents of the training files, once counted

    @property
    def held_out(self) -> bool:
        """Whether validation is split off the training text."""
        return not self.validation_files and self.validation_documents is None

    def document_count(self) -> int:
        """Documents of the training files (read once, streamed), or documents in memory."""
        if self.documents is not None:
            return len(self.documents)
        if self._count is None:
            self._count = count_documents(self.train_files, self.document)
        return self._count

    def check(self) -> None:
        """Read all the text once, streamed, for what can be wrong with it (not UTF-8, no text, one document)."""
        if self.held_out:
            self.split()
        else:
            self.document_count()
            if self.validation_files:
                count_documents(self.validation_files, self.document)

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the training and the held-out documents among all the training text's documents."""
        if self.document != "line" and self.document_count() < 2:
            raise SingleDocumentError(
                f"{self.document}: {self.source} holds a single document, none to hold out for "
                "validation; give corpus.validation_files",
                value=self.document,
            )
        return split_indices(self.document_count(), self.validation_fraction, self.seed)

    def validation_source(self) -> str:
        """How errors name the validation text."""
        if self.held_out:
            return f"held out of {self.source}"
        return ", ".join(map(str, self.validation_files)) if self.validation_files else "the validation split"

    def check_size(self) -> None:
        """Refuse, before tokenising, text whose size in bytes cannot give the tokens the run needs (see the module)."""
        if self.needs is None:
            return
        training, validation = self.needs
        if self.held_out:  # both parts come out of the training text
            training = StreamNeed(
                training.tokens + validation.tokens,
                f"{training.purpose}, and {validation.purpose} held out to validate on",
            )
        if self.documents is not None:
            _refuse_short(self.source, *documents_size(self.documents), training)
        else:
            self._refuse_short_files(self.source, self.train_files, training)
        if self.validation_documents is not None:
            _refuse_short(self.validation_source(), *documents_size(self.validation_documents), validation)
        elif self.validation_files:
            self._refuse_short_files(self.validation_source(), self.validation_files, validation)

    def _refuse_short_files(self, source: str, paths: list[Path], need: StreamNeed) -> None:
        size, most = files_size(paths, self.document)
        if most < need.tokens:  # a small text, read for its more precise errors first (not UTF-8, no text)
            count_documents(paths, self.document)
        _refuse_short(source, size, most, need)

    def tokenizer_training_documents(self) -> Iterator[str]:
        """The documents a tokenizer is trained on: the training text without the held-out ones, streamed."""
        keep = None
        if self.held_out:
            keep = np.zeros(self.document_count(), dtype=bool)
            keep[self.split()[0]] = True
        if self.documents is not None:
            yield from (document for index, document in enumerate(self.documents) if keep is None or keep[index])
            return
        # A paragraph or a file in its pieces: the trainers count words, which never span a cut (data/corpus.py).
        index = -1
        for piece in file_pieces(self.train_files, self.document):
            index += piece.first
            if keep is None or keep[index]:
                yield piece.text

    def tokenize(
        self, tokenizer, cache_dir: Path | None, show_progress: bool = True
    ) -> tuple[TokenizedDocuments, TokenizedDocuments]:
        """Training and validation token ids: each text tokenised once (or mapped from the cache), then split."""
        options = {"show_progress": show_progress}
        if self.documents is not None:
            train = tokenize_corpus(
                tokenizer, self.documents, cache_dir, f"tokenizing {TRAINING_NAME}", name=TRAINING_NAME, **options
            )
        else:
            train = tokenize_files(
                tokenizer,
                self.train_files,
                cache_dir,
                f"tokenizing {TRAINING_NAME}",
                name=TRAINING_NAME,
                document=self.document,
                **options,
            )
            self._count = len(train)
        if self.held_out:
            train_indices, validation_indices = self.split()
            train, validation = train.select(train_indices), train.select(validation_indices)
        elif self.validation_documents is not None:
            validation = tokenize_corpus(
                tokenizer,
                self.validation_documents,
                cache_dir,
                f"tokenizing {VALIDATION_NAME}",
                name=VALIDATION_NAME,
                **options,
            )
        else:
            validation = tokenize_files(
                tokenizer,
                self.validation_files,
                cache_dir,
                f"tokenizing {VALIDATION_NAME}",
                name=VALIDATION_NAME,
                document=self.document,
                **options,
            )
        self.check_tokens(train, validation)
        return train, validation

    def check_tokens(self, train: TokenizedDocuments, validation: TokenizedDocuments) -> None:
        """Refuse a text that gives fewer tokens than the run needs, naming it and the numbers."""
        if self.needs is None:
            return
        sources = (
            f"{self.source} without the held-out documents" if self.held_out else self.source,
            self.validation_source(),
        )
        for name, source, tokens, need in zip(
            (TRAINING_NAME, VALIDATION_NAME), sources, (train, validation), self.needs
        ):
            given = tokens.token_count + len(tokens)  # a separator after every document
            if given < need.tokens:
                raise InputError(
                    f"{name} ({source}) gives {given:,} tokens, a separator after each document "
                    f"included, fewer than the {need.tokens:,} needed for {need.purpose}"
                )


def pretraining_text(corpus, seed: int, needs: tuple[StreamNeed, StreamNeed] | None = None) -> PretrainingText:
    """The recipe's corpus section as text to read: a dataset or a task is read here, files are only named; with
    `needs` (training, validation), a text too short for them by its size is refused here, before any tokenising."""
    text = PretrainingText(
        validation_files=list(corpus.validation_files),
        validation_fraction=corpus.validation_fraction,
        seed=seed,
        document=corpus.document,
        needs=needs,
    )
    if corpus.dataset is not None:
        text.source = dataset_label(corpus.dataset, corpus.dataset_config, corpus.dataset_files)
        text.documents = read_dataset_documents(
            corpus.dataset, corpus.dataset_config, "train", corpus.text_column, corpus.dataset_files
        )
        if corpus.validation_split is not None:
            text.validation_documents = read_dataset_documents(
                corpus.dataset, corpus.dataset_config, corpus.validation_split, corpus.text_column, corpus.dataset_files
            )
    elif corpus.task is not None:
        text.source = f"the text of task {corpus.task.name}"
        text.documents = task_documents(task_spec(corpus.task), corpus.task.data_dir, corpus.task_splits)
    else:
        text.source = ", ".join(map(str, corpus.train_files))
        text.train_files = list(corpus.train_files)
    text.check_size()
    return text


def count_documents(paths: list[Path], document: str) -> int:
    """The files' documents (lines, paragraphs or files), streamed; files without any are refused."""
    count = sum(piece.first for piece in file_pieces(paths, document))
    if not count:
        raise no_text(paths)
    return count


def files_size(paths: list[Path], document: str) -> tuple[int, int]:
    """The files' bytes, and the most tokens they can give with their separators (see the module): per file, a
    token per byte and a prefix and a separator per document, of which there is one per file, or at most one per
    two bytes (a character and a line break)."""
    sizes = [Path(path).stat().st_size for path in paths]
    return sum(sizes), sum(size + 2 if document == "file" else 2 * size + 1 for size in sizes)


def documents_size(documents: list[str]) -> tuple[int, int]:
    """Documents' bytes, and the most tokens they can give with their separators (see the module)."""
    size = sum(len(text.encode("utf-8")) for text in documents)
    return size, size + 2 * len(documents)


def _refuse_short(source: str, size: int, most: int, need: StreamNeed) -> None:
    if most < need.tokens:
        raise InputError(
            f"{size:,} bytes give at most {most:,} tokens (documents and their separators), "
            f"fewer than the {need.tokens:,} needed for {need.purpose}",
            source=source,
            value=size,
        )
