"""Raw text -> documents (streamed from files, or read from a dataset), the validation split, masked blocks.

The token ids live in finetune/data/token_arrays.py (flat arrays, the lazy document stream, packed blocks) and
are made and cached by finetune/data/token_cache.py; the names of both used from here before still import.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.data.masking import MaskingRule
from finetune.data.token_arrays import (DocumentStream, PackedBlocks, TokenizedDocuments,  # noqa: F401  (re-exported)
                                        document_stream, pack_blocks)
from finetune.errors import UserError

# Characters that show nothing: controls, format characters (zero-width space U+200B, joiners, the byte-order
# mark U+FEFF), spaces and separators. BERT's normaliser deletes most of them, so a line of only these is empty.
INVISIBLE_CATEGORIES = {"Cc", "Cf", "Zs", "Zl", "Zp"}


def document_text(line: str) -> str:
    """A line as a document: stripped, and empty when none of its characters shows."""
    line = line.strip()
    return line if any(unicodedata.category(character) not in INVISIBLE_CATEGORIES for character in line) else ""


def file_documents(paths: list[Path]) -> Iterator[tuple[str, int]]:
    """Every non-empty line of the files as (document, byte position of its line in the files one after another).

    Read a line at a time: a corpus larger than memory streams through. A file that is not UTF-8 is named with
    its line. The positions let the token cache find a document again without reading the text before it.
    """
    position = 0
    for path in paths:
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, start=1):
                try:
                    line = document_text(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    raise UserError(f"{path} line {line_number}: not valid UTF-8") from None
                if line:
                    yield line, position
                position += len(raw)


def no_text(paths: list[Path]) -> UserError:
    """The error for files without a single document."""
    return UserError(f"{', '.join(map(str, paths))}: no text (every line is empty, or holds only invisible "
                     "characters such as U+200B)")


def read_documents(paths: list[Path]) -> list[str]:
    """Every non-empty line of the files is one document (all in memory: small corpora, tokenizer training)."""
    documents = [document for document, _ in file_documents(paths)]
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
        raise UserError(f"{dataset_label(name, config, data_files)}: cannot {verb} split {split!r}: {reason}") from None


def read_dataset_documents(name: str, config: str | None = None, split: str = "train", text_column: str = "text",
                           data_files: str | list[str] | None = None) -> list[str]:
    """Each non-empty row of a `datasets` dataset's text column is one document (stripped, as lines are)."""
    label = dataset_label(name, config, data_files)
    dataset = load_dataset_split(name, config, split, data_files)
    if text_column not in dataset.column_names:
        raise UserError(f"{label}: no column {text_column!r} (columns: {', '.join(dataset.column_names)}; "
                        "set corpus.text_column)")
    texts = (text for text in dataset[text_column] if isinstance(text, str))
    documents = [document for document in map(document_text, texts) if document]
    if not documents:
        raise UserError(f"{label}: no text in column {text_column!r} of split {split!r}")
    return documents


def split_indices(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which of `count` documents train and which (`fraction`, at least one, chosen with the seed) validate.

    Both sorted, so each part keeps the corpus order. Works on indices, so the same split is made whether the
    documents are strings in memory or rows of the token cache.
    """
    if count < 2:
        raise UserError("the corpus has a single document: give corpus.validation_files to validate on")
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
