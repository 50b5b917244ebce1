"""The examples of one split of a task, as every reader returns them (files, the hub) and every model reads them;
and the dataset of their encodings that the task kinds with their own layout build (tagging, choices, spans)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
from torch.utils.data import Dataset


@dataclass
class TaskExamples:
    """One split of a task: the texts of each example, their labels (None for unlabeled test files), ids."""

    texts: Sequence[tuple[str, ...]]  # a list, or PackedRows (what the file readers return)
    labels: np.ndarray | None  # class indices (int64), scores (float32), or 0/1 rows (multilabel, float32)
    ids: Sequence[str]  # a list, or PackedStrings


class PackedStrings(Sequence[str]):
    """Strings in one UTF-8 buffer and the offsets where each ends: a byte a character (ASCII) and 8 a string, where
    a list of str takes ~57 more bytes each. A task file's texts then take about the file's size, not twice it: the
    token ids are made while the texts are still held (bench/large_csv_memory.py). A string is decoded when read."""

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._buffer = bytearray()
        self._ends = array("q")
        for string in strings:
            self.append(string)

    def append(self, string: str) -> None:
        # surrogatepass: JSON may hold a lone surrogate ("\ud800"), which reads back as it was
        self._buffer += string.encode("utf-8", "surrogatepass")
        self._ends.append(len(self._buffer))

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[row] for row in range(*index.indices(len(self)))]
        row = range(len(self))[index]  # negative indices; IndexError past the end
        start = self._ends[row - 1] if row else 0
        return self._buffer[start : self._ends[row]].decode("utf-8", "surrogatepass")

    def take(self, rows: Iterable[int]) -> PackedStrings:
        """The strings of `rows`, in that order."""
        return PackedStrings(self[row] for row in rows)

    def __eq__(self, other: object) -> bool:  # as a list of the same strings would compare
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(mine == theirs for mine, theirs in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"PackedStrings({len(self):,} strings, {len(self._buffer):,} bytes)"


class PackedRows(Sequence[tuple[str, ...]]):
    """Rows of the same number of texts (an example's text, or its pair), one PackedStrings per position; a row
    reads back as a tuple. `columns` gives the texts of each position without building the rows."""

    def __init__(self, rows: Iterable[tuple[str, ...]] = ()) -> None:
        self.columns: list[PackedStrings] = []  # made at the first row, which gives the width
        self._rows = 0
        for row in rows:
            self.append(row)

    def append(self, row: tuple[str, ...]) -> None:
        if not self._rows:
            self.columns = [PackedStrings() for _ in row]
        if len(row) != len(self.columns):
            raise ValueError(f"a row of {len(row)} texts among rows of {len(self.columns)}")
        for column, text in zip(self.columns, row):
            column.append(text)
        self._rows += 1

    def __len__(self) -> int:
        return self._rows

    @overload
    def __getitem__(self, index: int) -> tuple[str, ...]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, ...]]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, ...] | list[tuple[str, ...]]:
        if isinstance(index, slice):
            return [self[row] for row in range(*index.indices(len(self)))]
        row = range(len(self))[index]
        return tuple(column[row] for column in self.columns)

    def take(self, rows: Iterable[int]) -> PackedRows:
        """The rows of `rows`, in that order."""
        return PackedRows(self[row] for row in rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(mine == tuple(theirs) for mine, theirs in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedRows({len(self):,} rows of {len(self.columns)} texts)"


class EncodedItems(Dataset):
    """A dataset of encoded items, one dict per training example (a sentence, a question, a window), in `items`;
    `lengths` (tokens of each) is what length grouping sorts by."""

    items: list[dict]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]

    @property
    def lengths(self) -> list[int]:
        return [len(item["input_ids"]) for item in self.items]
