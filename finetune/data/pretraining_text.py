"""The text a pretraining run reads, and how it becomes its training and validation token ids.

Text files are never held in memory: they are streamed to train a tokenizer (when the run trains one) and to
tokenise them (once: the ids are cached and memory-mapped by later runs, which then read no text at all). When
validation is held out of them, the held-out documents are chosen by index among all non-empty lines, so they
are the documents `split_documents` would choose from the list of lines, and the split is a selection of the
cached ids (changing the seed or the fraction tokenises nothing again). A `datasets` dataset or a task's text
columns are read whole, as before, and keyed in the cache by their text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from finetune.data.corpus import file_documents, no_text, read_dataset_documents, read_documents, split_indices
from finetune.data.tasks import task_documents
from finetune.data.token_arrays import TokenizedDocuments
from finetune.data.token_cache import tokenize_corpus, tokenize_files
from finetune.glue.specs import task_spec

TRAINING_NAME, VALIDATION_NAME = "the training text", "the validation text"


@dataclass
class PretrainingText:
    """Training text (files, or documents in memory) and validation text (files, a dataset's split, or held out of
    the training text)."""

    train_files: list[Path] = field(default_factory=list)  # streamed; empty when `documents` holds the text
    documents: Optional[list[str]] = None  # a dataset's or a task's text
    validation_files: list[Path] = field(default_factory=list)
    validation_documents: Optional[list[str]] = None  # a dataset's validation split
    validation_fraction: float = 0.05  # held out of the training text when no validation text is given
    seed: int = 0
    _count: Optional[int] = None  # documents of the training files, once counted

    @property
    def held_out(self) -> bool:
        """Whether validation is split off the training text."""
        return not self.validation_files and self.validation_documents is None

    def document_count(self) -> int:
        """Non-empty lines of the training files (read once, streamed), or documents in memory."""
        if self.documents is not None:
            return len(self.documents)
        if self._count is None:
            self._count = sum(1 for _ in file_documents(self.train_files))
            if not self._count:
                raise no_text(self.train_files)
        return self._count

    def check(self) -> None:
        """Read all the text once, streamed, for what can be wrong with it (not UTF-8, no text, one document)."""
        if self.held_out:
            split_indices(self.document_count(), self.validation_fraction, self.seed)
        else:
            self.document_count()
            if self.validation_files:
                read_documents(self.validation_files)

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the training and the held-out documents among all the training text's documents."""
        return split_indices(self.document_count(), self.validation_fraction, self.seed)

    def tokenizer_training_documents(self) -> Iterator[str]:
        """The documents a tokenizer is trained on: the training text without the held-out ones, streamed."""
        keep = None
        if self.held_out:
            keep = np.zeros(self.document_count(), dtype=bool)
            keep[self.split()[0]] = True
        if self.documents is not None:
            documents = iter(self.documents)
        else:
            documents = (document for document, _ in file_documents(self.train_files))
        for index, document in enumerate(documents):
            if keep is None or keep[index]:
                yield document

    def tokenize(self, tokenizer, cache_dir: Optional[Path], show_progress: bool = True,
                 ) -> tuple[TokenizedDocuments, TokenizedDocuments]:
        """Training and validation token ids: each text tokenised once (or mapped from the cache), then split."""
        options = {"show_progress": show_progress}
        if self.documents is not None:
            train = tokenize_corpus(tokenizer, self.documents, cache_dir, f"tokenizing {TRAINING_NAME}",
                                    name=TRAINING_NAME, **options)
        else:
            train = tokenize_files(tokenizer, self.train_files, cache_dir, f"tokenizing {TRAINING_NAME}",
                                   name=TRAINING_NAME, **options)
            self._count = len(train)
        if self.held_out:
            train_indices, validation_indices = self.split()
            return train.select(train_indices), train.select(validation_indices)
        if self.validation_documents is not None:
            validation = tokenize_corpus(tokenizer, self.validation_documents, cache_dir,
                                         f"tokenizing {VALIDATION_NAME}", name=VALIDATION_NAME, **options)
        else:
            validation = tokenize_files(tokenizer, self.validation_files, cache_dir, f"tokenizing {VALIDATION_NAME}",
                                        name=VALIDATION_NAME, **options)
        return train, validation


def pretraining_text(corpus, seed: int) -> PretrainingText:
    """The recipe's corpus section as text to read: a dataset or a task is read here, files are only named."""
    text = PretrainingText(validation_files=list(corpus.validation_files),
                           validation_fraction=corpus.validation_fraction, seed=seed)
    if corpus.dataset is not None:
        text.documents = read_dataset_documents(corpus.dataset, corpus.dataset_config, "train", corpus.text_column,
                                                corpus.dataset_files)
        if corpus.validation_split is not None:
            text.validation_documents = read_dataset_documents(corpus.dataset, corpus.dataset_config,
                                                               corpus.validation_split, corpus.text_column,
                                                               corpus.dataset_files)
    elif corpus.task is not None:
        text.documents = task_documents(task_spec(corpus.task), corpus.task.data_dir, corpus.task_splits)
    else:
        text.train_files = list(corpus.train_files)
    return text
