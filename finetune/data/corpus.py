"""Raw text -> documents -> token ids packed into fixed-length blocks, masked on the fly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.data.masking import MaskingRule
from finetune.errors import UserError


def read_documents(paths: list[Path]) -> list[str]:
    """Every non-empty line of the files is one document; a file that is not UTF-8 is named with its line."""
    documents = []
    for path in paths:
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    raise UserError(f"{path} line {line_number}: not valid UTF-8") from None
                if line:
                    documents.append(line)
    if not documents:
        raise UserError(f"{', '.join(map(str, paths))}: no text (every line is empty)")
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


def pack_blocks(token_lists: list[list[int]], block_size: int, cls_id: int, sep_id: int,
                name: str = "the corpus") -> np.ndarray:
    """Concatenate documents with [SEP] after each, cut into blocks of `block_size` that start with [CLS].

    Packing leaves no padding anywhere, so every position in a batch is real text; the last
    incomplete block is dropped.
    """
    lengths = np.fromiter((len(ids) + 1 for ids in token_lists), dtype=np.int64, count=len(token_lists))
    stream = np.empty(int(lengths.sum()), dtype=np.int64)
    position = 0
    for ids in token_lists:
        stream[position : position + len(ids)] = ids
        stream[position + len(ids)] = sep_id
        position += len(ids) + 1
    body = block_size - 1
    count = len(stream) // body
    if count == 0:
        raise UserError(f"{name} has {len(stream)} tokens, fewer than one block of {block_size} (corpus.block_size)")
    blocks = np.empty((count, block_size), dtype=np.int64)
    blocks[:, 0] = cls_id
    blocks[:, 1:] = stream[: count * body].reshape(count, body)
    return blocks


def tokenize_documents(tokenizer, documents: list[str], batch_size: int = 2000) -> list[list[int]]:
    """Token ids of each document without special tokens (the fast tokenizer works in parallel batches)."""
    ids: list[list[int]] = []
    for start in range(0, len(documents), batch_size):
        ids += tokenizer(documents[start : start + batch_size], add_special_tokens=False)["input_ids"]
    return ids


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
