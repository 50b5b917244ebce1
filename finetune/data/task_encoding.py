"""A task's examples tokenized (EncodedTask): truncated, head and tail, in windows or in both orders, read backwards;
the one line that says what the reading did to the examples longer than task.max_length."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from finetune.console import console, phase_bar
from finetune.data.examples import PackedRows, TaskExamples
from finetune.data.long_documents import DocumentReading, ReadingError, head_tail_positions, window_positions
from finetune.data.reverse import reverse_segments
from finetune.data.token_arrays import offsets_of
from finetune.errors import InputError


def truncation_note(
    tokenizer, first: Sequence[str], second: Sequence[str] | None, lengths: list[int], max_length: int, name: str
) -> str | None:
    """One line when task.max_length cut examples: how many, and the lengths they had (None when nothing was cut).

    Only the examples that reached max_length can have been cut: they alone are tokenised again, whole.
    """
    reached = [index for index, length in enumerate(lengths) if length >= max_length]
    if not reached:
        return None
    whole = tokenizer(
        [first[index] for index in reached], [second[index] for index in reached] if second else None, truncation=False
    )["input_ids"]
    full_lengths = np.array(lengths)
    full_lengths[reached] = [len(ids) for ids in whole]
    cut = int((full_lengths > max_length).sum())
    if not cut:
        return None
    median, ninetieth = np.percentile(full_lengths, [50, 90])
    share = f"{cut / len(lengths):.0%}"
    return (
        f"task.max_length {max_length} cuts {cut:,} of the {len(lengths):,} {name} examples ({share}) to "
        f"{max_length} tokens; their lengths in tokens: median {median:,.0f}, 90th percentile {ninetieth:,.0f}, "
        f"longest {full_lengths.max():,}"
    )


def check_reading(reading: DocumentReading, tokenizer, backwards: bool, both_directions: bool) -> None:
    """Refuse a reading the model or its tokenizer cannot do: one line saying what it needs."""
    if backwards and both_directions:
        raise ValueError("a model reads backwards or in both directions, not both")
    if reading.mode != "truncate" and reading.max_length is None:  # checked here: after the model's fitting
        raise ReadingError(
            f"mode {reading.mode} needs task.max_length (without it the model reads every example whole)",
            value=reading.mode,
        )
    if (backwards or both_directions or reading.mode != "truncate") and not tokenizer.is_fast:
        need = (
            "a model that reads text backwards needs"
            if reading.mode == "truncate"
            else f"task.long_documents mode {reading.mode} needs"
        )
        raise InputError(
            f"the tokenizer of {tokenizer.name_or_path} is not a fast tokenizer, which {need} "
            "(to tell its texts from its special tokens)"
        )


def example_columns(examples: TaskExamples, reading: DocumentReading) -> tuple[Sequence[str], Sequence[str] | None]:
    """The examples' first texts and their second ones (None: one text each; both orders needs a pair)."""
    # Packed texts give each position's texts as they are held; a list of rows is turned into columns.
    texts = examples.texts
    columns: Sequence[Sequence[str]] = texts.columns if isinstance(texts, PackedRows) else list(zip(*texts))
    if len(columns) > 2:  # the readers make one text (or a pair) of more columns: TaskSpec.model_texts
        raise ValueError(f"a model reads one text or a pair, not {len(columns)} texts")
    second = columns[1] if len(columns) > 1 else None
    if reading.both_orders and second is None:
        raise InputError(
            "task.both_orders reads a sentence pair in both orders: this task's examples are one text each"
        )
    return columns[0], second


def tokenized(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, reading: DocumentReading):
    """The tokenizer's encoding of some examples: cut to max_length under truncate, whole under the other modes."""
    truncate = reading.mode == "truncate" and reading.max_length is not None
    # verbose=False: transformers' warning about texts longer than the model's positions, which head_tail and
    # chunks read whole on purpose before they cut
    return tokenizer(
        list(texts),
        list(pairs) if pairs is not None else None,
        truncation=truncate,
        max_length=reading.max_length if truncate else None,
        verbose=False,
    )


PROGRESS_BAR_EXAMPLES = 20_000  # tokenizing more examples than this shows a progress bar


class RaggedColumn:
    """Rows of ints of different lengths (one key of an encoding: input ids, a mask) in one flat array and the rows'
    offsets into it, in the smallest type that holds them: 2 bytes a token for the ids of a vocabulary under 65,536,
    where a Python list of lists of ints takes ~36 (a pointer and an int object each). A column whose values are all
    one value (the attention mask's 1s, the segment ids of one text) stores none: it reads them from that value. A
    row reads back as a list; a slice as a list of them.

    Chunks are appended to one growing buffer (a bytearray: large reallocations, outside Python's small-object
    arenas) rather than kept as an array each: small objects that outlive their chunk would pin the arenas of the
    chunk's freed int objects, and the process would keep that memory."""

    def __init__(self) -> None:
        self.dtype: np.dtype = np.dtype(np.uint8)  # widened when a chunk holds larger (or negative) values
        self.constant: int | None = None  # while every value so far is this one, no value is stored
        self._storing = False  # whether the values are in the buffer (from the first chunk of two values on)
        self._values, self._lengths = bytearray(), bytearray()  # until `finish`
        self.flat: np.ndarray = np.zeros(0, dtype=np.uint8)
        self.offsets = np.zeros(1, dtype=np.int64)

    def extend(self, rows: list[list[int]]) -> None:
        """Add a chunk's rows (the chunk's lists can then be dropped)."""
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
        if not self._storing and len(flat):
            value = int(flat[0]) if self.constant is None else self.constant
            if (flat == value).all():
                self.constant = value  # still one value: nothing to store but the lengths
            else:  # the first other value: the earlier ones are written out now
                self._storing = True
                if self.constant is not None:
                    self._write(np.full(int(np.frombuffer(self._lengths, np.int64).sum()), self.constant))
                    self.constant = None
        if self._storing:
            self._write(flat)
        self._lengths += lengths.tobytes()

    def _write(self, values: np.ndarray) -> None:
        dtype = np.promote_types(self.dtype, _smallest_int_type(values))
        if dtype != self.dtype:  # e.g. ids past 255 after a first chunk of small ones
            self._values = bytearray(np.frombuffer(self._values, self.dtype).astype(dtype).tobytes())
            self.dtype = dtype
        self._values += values.astype(dtype).tobytes()

    def finish(self) -> None:
        """One flat array (a view of the buffer, or of the one value) and the offsets of its rows."""
        self.offsets = offsets_of(np.frombuffer(self._lengths, np.int64))
        self._lengths = bytearray()
        if self.constant is not None:
            self.dtype = np.dtype(_smallest_int_type(np.array([self.constant])))
        self.flat = self._flat()

    def _flat(self) -> np.ndarray:
        if self.constant is None:
            return np.frombuffer(self._values, self.dtype)
        # every position reads the one value: a read-only view that takes no memory a value
        return np.broadcast_to(np.array(self.constant, dtype=self.dtype), (int(self.offsets[-1]),))

    def __getstate__(self) -> dict:  # a data-loader worker gets the one value, not the view copied out in full
        return {**self.__dict__, "flat": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.flat = self._flat()

    @property
    def nbytes(self) -> int:
        """What the column holds: its stored values and its offsets."""
        return len(self._values) + self.offsets.nbytes

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int | slice) -> list:
        if isinstance(index, slice):
            return [self[row] for row in range(*index.indices(len(self)))]
        return self.flat[self.offsets[index] : self.offsets[index + 1]].tolist()


def _smallest_int_type(values: np.ndarray) -> type:
    """uint8 for masks and segment ids, uint16 for the ids of a vocabulary under 65,536 (BERT's, GPT-2's), int32
    past that; signed types for negative values."""
    if not len(values):
        return np.uint8
    low, high = int(values.min()), int(values.max())
    for dtype in (np.uint8, np.uint16, np.int8, np.int16, np.int32):
        limits = np.iinfo(dtype)
        if limits.min <= low and high <= limits.max:
            return dtype
    return np.int64


class EncodedTask(Dataset):
    """Tokenized examples (unpadded), read as `reading` says; `task_collator` pads each batch to its longest.

    `reading`: a DocumentReading (data/long_documents.py), or just task.max_length (truncate; None: whole).
    A windowed reading (chunks) makes each example a document of one or more windows: an item then holds a list of
    rows per key, which `WindowCollator` flattens. `backwards` (a model that reads backwards, data/reverse.py): each
    text's tokens reversed, special tokens kept where the tokenizer puts them. `both_directions` (a bidirectional
    classifier): the forward ids as `input_ids` and the reversed ones as `backward_input_ids`. This is where every
    task example becomes ids: training, dev, eval and predict. `name` (e.g. "dev"): say in one line what the reading
    does to examples longer than max_length.
    """

    def __init__(
        self,
        examples: TaskExamples,
        tokenizer,
        reading: DocumentReading | int | None,
        # Examples per tokenizer call: what encoding holds beyond the flat arrays (see _encode). 1,000 rows of ~50
        # tokens: ~17 MB of the tokenizer's objects (4,000: ~68 MB, measured), and no slower.
        chunk: int = 1_000,
        backwards: bool = False,
        both_directions: bool = False,
        name: str | None = None,
    ):
        reading = reading if isinstance(reading, DocumentReading) else DocumentReading(reading)
        check_reading(reading, tokenizer, backwards, both_directions)
        first, second = example_columns(examples, reading)
        self.reading, self.labels = reading, examples.labels
        self.encodings: dict[str, RaggedColumn] = {}  # key (input_ids, attention_mask, ...) -> every row's values
        self._rows = 0  # rows encoded so far (an example has several under a windowed reading)
        self._pending: dict[str, list] = {}  # the rows of the chunk being encoded, as the tokenizer gave them
        self.windows: list[range] | None = [] if reading.windowed else None  # rows of each document
        self.full_lengths: list[int] = []  # tokens of each whole example (head_tail, chunks: what the note reports)
        self.windows_before_cap: list[int] = []  # chunks: windows of each document before max_chunks
        self._encode(tokenizer, first, second, chunk, backwards, both_directions)
        lengths = self.encodings["input_ids"].lengths.tolist()  # tokens of each row
        self.lengths = lengths if self.windows is None else [sum(lengths[row] for row in rows) for rows in self.windows]
        if name is not None:  # nobody should learn from the scores that most of the text was never read
            note = self._note(tokenizer, first, second, name)
            if note:
                console.print(note, markup=False, highlight=False, soft_wrap=True)

    def _encode(
        self,
        tokenizer,
        first: Sequence[str],
        second: Sequence[str] | None,
        chunk: int,
        backwards: bool,
        both_directions: bool,
    ) -> None:
        """The rows of every example, tokenized `chunk` examples at a time."""
        reading = self.reading
        # In chunks, for a progress bar on large tasks (MNLI: 393k pairs) and for memory: the tokenizer's output of a
        # chunk (its Encodings and lists of Python ints, ~200 bytes a token) lives until the chunk is in flat arrays.
        # The result is the same as in one call.
        with phase_bar("tokenizing", len(first), enabled=len(first) > PROGRESS_BAR_EXAMPLES) as advance:
            for start in range(0, len(first), chunk):
                part = tokenized(
                    tokenizer, first[start : start + chunk], second[start : start + chunk] if second else None, reading
                )
                swapped = (
                    tokenized(tokenizer, second[start : start + chunk], first[start : start + chunk], reading)
                    if reading.both_orders and second is not None  # both orders: a pair, as example_columns checked
                    else None
                )
                for index in range(len(part["input_ids"])):
                    if swapped is not None:
                        self._add_both_orders(part, swapped, index)
                    else:
                        self._add(part, index, backwards, both_directions)
                advance(len(part["input_ids"]))
                del part, swapped  # the tokenizer's objects of a chunk hold ~100 bytes a token: gone before the next
                for key, rows in self._pending.items():  # into flat arrays, chunk by chunk (see RaggedColumn)
                    self.encodings.setdefault(key, RaggedColumn()).extend(rows)
                self._pending = {}
        for column in self.encodings.values():
            column.finish()
        if not self.encodings:  # no examples: an empty column, so that lengths and len() read 0
            self.encodings["input_ids"] = RaggedColumn()

    def _add(self, part, index: int, backwards: bool, both_directions: bool) -> None:
        """The rows of one encoded example: itself (truncate), its head and tail, or its windows."""
        reading, row = self.reading, {key: values[index] for key, values in part.items()}
        needs_segments = reading.mode != "truncate" or backwards or both_directions
        # The segment of each position (None: a special token); [] where nothing below reads it.
        sequence_ids: list[int | None] = part.sequence_ids(index) if needs_segments else []
        windows: list[list[int]] | None = None
        if reading.mode != "truncate":
            assert reading.max_length is not None  # __init__ refuses a mode other than truncate without one
            self.full_lengths.append(len(row["input_ids"]))
            if reading.mode == "head_tail":
                windows = [head_tail_positions(sequence_ids, reading.max_length, reading.head_tokens)]
            else:
                windows, before_cap = window_positions(
                    sequence_ids, reading.max_length, reading.overlap_tokens, reading.max_chunks
                )
                self.windows_before_cap.append(before_cap)
        rows_positions: Sequence[list[int] | None] = windows or [None]  # None: the example as it is
        for positions in rows_positions:
            kept, kept_sequence_ids = row, sequence_ids
            if positions is not None and len(positions) != len(sequence_ids):
                kept = {key: [values[position] for position in positions] for key, values in row.items()}
                kept_sequence_ids = [sequence_ids[position] for position in positions]
            if backwards or both_directions:
                reversed_ids = reverse_segments(kept["input_ids"], kept_sequence_ids)
                kept = {**kept, ("backward_input_ids" if both_directions else "input_ids"): reversed_ids}
            for key, values in kept.items():
                self._pending.setdefault(key, []).append(values)
            self._rows += 1
        if self.windows is not None:
            assert windows is not None  # windowed here is chunks (both orders has _add_both_orders): windows were cut
            self.windows.append(range(self._rows - len(windows), self._rows))

    def _add_both_orders(self, part, swapped, index: int) -> None:
        """A pair as one document of two rows, (a, b) then (b, a): their logits are added (DocumentReading)."""
        for encoding in (part, swapped):
            for key, values in encoding.items():
                self._pending.setdefault(key, []).append(values[index])
        self._rows += 2
        assert self.windows is not None  # both orders is a windowed reading: __init__ made the list
        self.windows.append(range(self._rows - 2, self._rows))

    def _note(self, tokenizer, first: Sequence[str], second: Sequence[str] | None, name: str) -> str | None:
        """The line that says what reading did to the examples longer than max_length (None: none was)."""
        reading = self.reading
        if reading.max_length is None:
            return None
        if reading.mode == "truncate":
            # Both orders: the (a, b) rows say what was cut (the (b, a) ones hold the same tokens).
            lengths = self.encodings["input_ids"].lengths[::2].tolist() if reading.both_orders else self.lengths
            return truncation_note(tokenizer, first, second, lengths, reading.max_length, name)
        return long_documents_note(reading, np.array(self.full_lengths), np.array(self.windows_before_cap or [1]), name)

    def __len__(self) -> int:
        return len(self.windows) if self.windows is not None else len(self.encodings["input_ids"])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.windows is not None:  # a document: each key holds the rows of its windows
            rows = self.windows[index]
            item = {key: values[rows.start : rows.stop] for key, values in self.encodings.items()}
        else:
            item = {key: values[index] for key, values in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = self.labels[index].tolist()  # a class, a score, or a multi-label 0/1 row
        return item


def long_documents_note(
    reading: DocumentReading, full_lengths: np.ndarray, windows: np.ndarray, name: str
) -> str | None:
    """One line on the examples longer than max_length under head_tail or chunks (None when there are none)."""
    longer = int((full_lengths > reading.max_length).sum())
    if not longer:
        return None
    median, ninetieth = np.percentile(full_lengths, [50, 90])
    lengths = (
        f"their lengths in tokens: median {median:,.0f}, 90th percentile {ninetieth:,.0f}, longest "
        f"{full_lengths.max():,}"
    )
    share = f"{longer:,} of the {len(full_lengths):,} {name} examples ({longer / len(full_lengths):.0%})"
    if reading.mode == "head_tail":
        return (
            f"task.long_documents head_tail: {share} are longer than task.max_length {reading.max_length}; each "
            f"keeps its first {reading.head_tokens} and its last text tokens; {lengths}"
        )
    capped = int((windows > reading.max_chunks).sum())
    cap = (
        f"; the {capped:,} with more than max_chunks {reading.max_chunks} windows are read in "
        f"{reading.max_chunks} spread over them"
        if capped
        else ""
    )
    return (
        f"task.long_documents chunks: {share} are longer than task.max_length {reading.max_length} and are read in "
        f"windows (median {np.median(windows[windows > 1]):,.0f}, most {windows.max():,}){cap}; {lengths}"
    )
