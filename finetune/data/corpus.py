"""Raw text -> documents -> token ids (flat arrays, cached) packed into fixed-length blocks, masked on the fly."""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import unicodedata
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.console import console, progress_bar
from finetune.data.masking import MaskingRule
from finetune.errors import UserError

CACHE_FORMAT = 1  # part of every cache key: bump it when the cached arrays change meaning
# Characters that show nothing: controls, format characters (zero-width space U+200B, joiners, the byte-order
# mark U+FEFF), spaces and separators. BERT's normaliser deletes most of them, so a line of only these is empty.
INVISIBLE_CATEGORIES = {"Cc", "Cf", "Zs", "Zl", "Zp"}


def document_text(line: str) -> str:
    """A line as a document: stripped, and empty when none of its characters shows."""
    line = line.strip()
    return line if any(unicodedata.category(character) not in INVISIBLE_CATEGORIES for character in line) else ""


def read_documents(paths: list[Path]) -> list[str]:
    """Every non-empty line of the files is one document; a file that is not UTF-8 is named with its line."""
    documents = []
    for path in paths:
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, start=1):
                try:
                    line = document_text(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    raise UserError(f"{path} line {line_number}: not valid UTF-8") from None
                if line:
                    documents.append(line)
    if not documents:
        raise UserError(f"{', '.join(map(str, paths))}: no text (every line is empty, or holds only invisible "
                        "characters such as U+200B)")
    return documents


def read_dataset_documents(name: str, config: str | None = None, split: str = "train", text_column: str = "text",
                           data_files: str | list[str] | None = None) -> list[str]:
    """Each non-empty row of a `datasets` dataset's text column is one document (stripped, as lines are)."""
    import datasets  # only this path needs it, and it is slow to import

    label = f"dataset {name}" + (f" ({config})" if config else "") + (f" files {data_files}" if data_files else "")
    try:
        dataset = datasets.load_dataset(name, config, split=split, data_files=data_files)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{label}: cannot load split {split!r}: {reason}") from None
    if text_column not in dataset.column_names:
        raise UserError(f"{label}: no column {text_column!r} (columns: {', '.join(dataset.column_names)}; "
                        "set corpus.text_column)")
    texts = (text for text in dataset[text_column] if isinstance(text, str))
    documents = [document for document in map(document_text, texts) if document]
    if not documents:
        raise UserError(f"{label}: no text in column {text_column!r} of split {split!r}")
    return documents


def split_documents(documents: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Hold out `fraction` of the documents (at least one), chosen with the seed, for validation."""
    if len(documents) < 2:
        raise UserError("the corpus has a single document: give corpus.validation_files to validate on")
    order = np.random.default_rng(seed).permutation(len(documents))
    held_out = max(1, int(len(documents) * fraction))
    validation = set(order[:held_out].tolist())
    train = [doc for index, doc in enumerate(documents) if index not in validation]
    return train, [documents[index] for index in sorted(validation)]


@dataclass
class TokenizedDocuments:
    """The token ids of many documents as two flat arrays: a WikiText-103-sized corpus stays a few hundred MB."""

    ids: np.ndarray  # int32: every document's ids, one document after another
    offsets: np.ndarray  # int64, one more than the documents: document i is ids[offsets[i]:offsets[i + 1]]

    def __post_init__(self):
        self.ids = np.asarray(self.ids, dtype=np.int32)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        # A cache file that loads but does not hold this shape is corrupt: fail here, not mid-training.
        if (self.ids.ndim != 1 or self.offsets.ndim != 1 or len(self.offsets) == 0 or self.offsets[0] != 0
                or self.offsets[-1] != len(self.ids) or (np.diff(self.offsets) < 0).any()):
            raise ValueError("offsets do not delimit the ids")

    @classmethod
    def from_lists(cls, id_lists: list[list[int]]) -> TokenizedDocuments:
        """The flat form of a list of id lists."""
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int32, count=int(lengths.sum()))
        return cls(ids, _offsets(lengths))

    @classmethod
    def concatenate(cls, parts: list[TokenizedDocuments]) -> TokenizedDocuments:
        """The documents of `parts`, one part after another."""
        ids = np.concatenate([np.empty(0, dtype=np.int32)] + [part.ids for part in parts])
        lengths = np.concatenate([np.empty(0, dtype=np.int64)] + [part.lengths for part in parts])
        return cls(ids, _offsets(lengths))

    @classmethod
    def load(cls, path: Path) -> TokenizedDocuments:
        """Documents saved by `save`."""
        with np.load(path) as arrays:
            return cls(arrays["ids"], arrays["offsets"])

    def save(self, path: Path) -> None:
        """Write under a temporary name in the same folder, then rename: a killed run leaves no half file at `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
        try:
            with handle:
                np.savez(handle, ids=self.ids, offsets=self.offsets)
            os.replace(handle.name, path)
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise

    @property
    def lengths(self) -> np.ndarray:
        """Tokens in each document."""
        return np.diff(self.offsets)

    def document(self, index: int) -> np.ndarray:
        """The ids of one document."""
        return self.ids[self.offsets[index] : self.offsets[index + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Where each document starts, and the end of the last: [0, cumulative lengths...]."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def document_stream(documents: TokenizedDocuments, separator_id: int, order: np.ndarray | None = None) -> np.ndarray:
    """The documents (all, or those of `order` in that order) in one int32 stream with `separator_id` after each."""
    with_separators = np.insert(documents.ids, documents.offsets[1:], separator_id)
    if order is None:
        return with_separators
    # Each document and its separator is a segment of `with_separators`; gather the segments in order by
    # cumulating steps of 1 that jump, at each segment start, from the previous segment's end to the next start.
    order = np.asarray(order, dtype=np.int64)
    if len(order) == 0:
        return with_separators[:0]
    segment_starts = documents.offsets[:-1] + np.arange(len(documents))
    segment_lengths = documents.lengths[order] + 1
    output_starts = _offsets(segment_lengths)
    steps = np.ones(output_starts[-1], dtype=np.int64)
    sources = segment_starts[order]
    steps[0] = sources[0]
    steps[output_starts[1:-1]] = sources[1:] - (sources[:-1] + segment_lengths[:-1] - 1)
    return with_separators[np.cumsum(steps, out=steps)]


def pack_blocks(documents: TokenizedDocuments | list[list[int]], block_size: int, separator_id: int, *,
                start_id: int | None = None, name: str = "the corpus") -> np.ndarray:
    """Documents with `separator_id` after each, cut into int64 blocks of `block_size`, each led by `start_id` if given.

    BERT gives start_id=[CLS], separator_id=[SEP]; causal LMs give no start and separator_id=<|endoftext|>.
    Packing leaves no padding anywhere, so every position in a batch is real text; the last
    incomplete block is dropped.
    """
    if not isinstance(documents, TokenizedDocuments):
        documents = TokenizedDocuments.from_lists(documents)
    stream = document_stream(documents, separator_id)
    body = block_size if start_id is None else block_size - 1
    count = len(stream) // body
    if count == 0:
        raise UserError(f"{name} has {len(stream)} tokens, fewer than one block of {block_size} (corpus.block_size)")
    blocks = np.empty((count, block_size), dtype=np.int64)
    blocks[:, block_size - body :] = stream[: count * body].reshape(count, body)
    if start_id is not None:
        blocks[:, 0] = start_id
    return blocks


def _tokenized_batches(tokenizer, documents: list[str], batch_size: int) -> Iterator[list[list[int]]]:
    """Token ids without special tokens, one batch of documents at a time (the fast tokenizer works in parallel)."""
    for start in range(0, len(documents), batch_size):
        yield tokenizer(documents[start : start + batch_size], add_special_tokens=False)["input_ids"]


def tokenize_documents(tokenizer, documents: list[str], batch_size: int = 2000) -> list[list[int]]:
    """Token ids of each document without special tokens, as Python lists (small corpora; see tokenize_corpus)."""
    ids: list[list[int]] = []
    for batch in _tokenized_batches(tokenizer, documents, batch_size):
        ids += batch
    return ids


def tokenize_corpus(tokenizer, documents: list[str], cache_dir: Path | None = None, description: str = "tokenizing",
                    batch_size: int = 2000, show_progress: bool = True, name: str = "the corpus") -> TokenizedDocuments:
    """Token ids of every document without special tokens; from `cache_dir` if this text and tokenizer were seen.

    Text that gives no token but [UNK] and other special tokens is refused (`name` says which text).
    """
    cache_path = None
    if cache_dir is not None:
        cache_path = Path(cache_dir).expanduser() / f"tokens-{corpus_cache_key(tokenizer, documents)}.npz"
        cached = _read_cache(cache_path, len(documents))
        if cached is not None:
            console.print(f"{description}: {len(cached):,} documents, {len(cached.ids):,} tokens from {cache_path}")
            check_known_tokens(cached, tokenizer, documents, name)
            return cached
    parts = []
    with progress_bar(show_progress and len(documents) > batch_size) as progress:
        task = progress.add_task(description, total=len(documents), status="")
        for batch in _tokenized_batches(tokenizer, documents, batch_size):
            parts.append(TokenizedDocuments.from_lists(batch))
            progress.advance(task, len(batch))
    tokenized = TokenizedDocuments.concatenate(parts)
    check_known_tokens(tokenized, tokenizer, documents, name)
    if cache_path is not None:
        tokenized.save(cache_path)
    return tokenized


def check_known_tokens(tokenized: TokenizedDocuments, tokenizer, documents: list[str], name: str,
                       chunk: int = 1 << 20) -> None:
    """Refuse text whose tokens are all [UNK] or other special tokens: a model learns nothing from it (BERT: loss 0)."""
    if not documents:  # nothing to tokenize: packing says the text is too short
        return
    special_ids = np.array(sorted(set(tokenizer.all_special_ids)))
    for start in range(0, len(tokenized.ids), chunk):  # a real corpus shows a known token in its first chunk
        if not np.isin(tokenized.ids[start : start + chunk], special_ids).all():
            return
    if len(tokenized.ids) == 0:
        found = "no tokens at all"
    else:
        found = "only " + ", ".join(tokenizer.convert_ids_to_tokens(np.unique(tokenized.ids).tolist()))
    raise UserError(f"{name} gives no known tokens: its {len(documents):,} documents tokenize to {found} "
                    f"(the tokenizer knows none of their characters; the first is {documents[0][:40]!r})")


def corpus_cache_key(tokenizer, documents: list[str]) -> str:
    """A digest of the tokenizer's full JSON and the documents' text: a change to either gives another key."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"finetune tokens v{CACHE_FORMAT}".encode())
    for text in itertools.chain([tokenizer.backend_tokenizer.to_str()], documents):
        encoded = text.encode("utf-8")
        # Length-prefixed, so that ["ab", "c"] and ["a", "bc"] differ.
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


def _read_cache(path: Path, document_count: int) -> TokenizedDocuments | None:
    """The cached documents at `path`; None when absent, or (with a warning) unreadable, so they are made again."""
    if not path.is_file():
        return None
    try:
        cached = TokenizedDocuments.load(path)
        if len(cached) != document_count:
            raise ValueError(f"{len(cached)} documents instead of {document_count}")
        return cached
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
        warnings.warn(f"ignoring the unreadable token cache {path} ({error}); tokenizing again", stacklevel=3)
        return None


class MaskedBlocks(Dataset):
    """Packed blocks whose masks are drawn per (seed, epoch, block): reproducible whatever the worker count."""

    def __init__(self, blocks: np.ndarray, rule: MaskingRule, seed: int, fixed_masks: bool = False):
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
