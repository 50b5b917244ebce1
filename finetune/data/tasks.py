"""Task data: GLUE-layout TSV files (or CSV, JSON Lines, the hub) read by a TaskSpec, tokenized into padded batches."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from finetune.console import console, phase_bar
from finetune.data.corpus import document_text
from finetune.data.examples import TaskExamples
from finetune.data.long_documents import (
    WINDOW_DOCUMENT,
    DocumentReading,
    ReadingError,
    head_tail_positions,
    window_positions,
)
from finetune.data.reverse import reverse_segments
from finetune.data.sampling import ResumableSampler
from finetune.errors import DataFileError, InputError
from finetune.glue.specs import STANDARD_FILES, TaskSpec, label_text
from finetune.kinds.multilabel.data import has_label_set, label_set_row


def task_file(spec: TaskSpec, data_dir: Path | None, split: str) -> Path:
    """The file of `split`, or a one-line error naming what exists (or that no folder was given to look in)."""
    splits = STANDARD_FILES if spec.files is None else spec.files
    if split not in splits:
        raise InputError(f"task '{spec.name}' has no split '{split}' (splits: {', '.join(splits)})", value=split)
    if data_dir is None:  # the recipes require a data_dir for files; a caller without one gets this, not a TypeError
        raise InputError(f"task '{spec.name}': no data folder to read its {split} file from", value=split)
    if spec.files is None:
        return found_task_file(spec, Path(data_dir), split)
    path = Path(data_dir) / spec.files[split]
    if not path.is_file():
        raise DataFileError(f"task '{spec.name}': no {split} file {path}", value=path)
    return path


def found_task_file(spec: TaskSpec, data_dir: Path, split: str) -> Path:
    """The one file of `split` in the folder, by what is there: SPLIT.tsv, SPLIT.csv or SPLIT.jsonl (any case)."""
    entries = data_dir.iterdir() if data_dir.is_dir() else []
    found = sorted(
        path for path in entries if path.stem == split and path.suffix.lower() in FORMAT_BY_EXTENSION and path.is_file()
    )
    if not found:
        looked_for = ", ".join(f"{split}{extension}" for extension in FORMAT_BY_EXTENSION)
        raise DataFileError(
            f"task '{spec.name}': no {split} file in {data_dir} (looked for {looked_for})", value=data_dir
        )
    if len(found) > 1:
        raise DataFileError(
            f"task '{spec.name}': {' and '.join(str(path) for path in found)} are both {split} "
            "files: keep one, or name it in task.files",
            value=found,
        )
    return found[0]


def read_task_split(spec: TaskSpec, data_dir: Path | None, split: str) -> TaskExamples:
    """One split from the hub (`spec.source`) or from its file in `data_dir`, every row checked."""
    if spec.source == "hub":
        from finetune.glue.hub import read_hub_split  # late import: `datasets` is slow to import

        return read_hub_split(spec, split)
    path = task_file(spec, data_dir, split)
    file_format = spec.file_format or FORMAT_BY_EXTENSION.get(path.suffix.lower())
    if file_format is None:
        raise DataFileError(
            f"unknown file type '{path.suffix}' (expected .tsv, .csv or .jsonl, or set task.format)",
            source=path,
            value=path.suffix,
        )
    return read_examples_file(spec, path, file_format, spec.headerless_columns.get(split))


def read_labelled_split(spec: TaskSpec, data_dir: Path | None, split: str) -> TaskExamples:
    """A split to learn from or to score against: without its label column, one line naming its file."""
    examples = read_task_split(spec, data_dir, split)
    if examples.labels is None:
        raise DataFileError(
            f"task '{spec.name}': {split_source(spec, data_dir, split)} has no '{spec.label_column}' "
            f"column to {'learn from' if split == 'train' else 'score against'}",
            value=split,
        )
    return examples


def split_source(spec: TaskSpec, data_dir: Path | None, split: str) -> str:
    """How a message names a split: its file, or the hub's split."""
    return (
        f"the hub's {split} split" if spec.source == "hub" else f"the {split} file {task_file(spec, data_dir, split)}"
    )


def read_examples_file(
    spec: TaskSpec, path: Path, file_format: str, headerless: tuple[str, ...] | None = None
) -> TaskExamples:
    """The examples of one TSV, CSV or JSON Lines file, every row checked; bad bytes name their line."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:  # -sig: MRPC starts with a BOM
            if file_format == "jsonl":
                return examples_from_records(spec, path, json_records(handle, path))
            return examples_from_records(spec, path, delimited_records(handle, path, spec, file_format, headerless))
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path, line=first_undecodable_line(path)) from None


def first_undecodable_line(path: Path) -> int:
    """The number of the first line of a file that is not UTF-8 (0 if every line decodes on its own)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


FORMAT_BY_EXTENSION = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl"}
FLOAT32_MAX = float(np.finfo(np.float32).max)  # regression labels are stored as float32


def delimited_records(
    handle, path: Path, spec: TaskSpec, file_format: str, headerless: tuple[str, ...] | None
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {column: value}) per row of a TSV or CSV file; a row with the wrong column count names its line.

    TSV is read with quoting disabled (GLUE files hold stray quotes that belong to the text); CSV
    with the usual CSV quoting, since that is how CSV writers protect commas.
    """
    reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if file_format == "tsv" else csv.reader(handle)
    rows = _checked_rows(reader, path)
    columns = list(headerless) if headerless else next(rows, [])
    if not columns:
        raise DataFileError("no examples (the file is empty)", source=path)
    counts = Counter(columns)
    repeated = [name for name in counts if counts[name] > 1]
    if repeated and not headerless:  # dict(zip(...)) below would silently keep the last of them
        raise DataFileError(
            f"column '{repeated[0]}' appears {counts[repeated[0]]} times in the header",
            source=path,
            line=reader.line_num,
            value=repeated[0],
        )
    missing = [name for name in spec.text_columns if name not in columns]
    if missing:
        raise DataFileError(
            f"missing column(s) {', '.join(missing)} (header: {', '.join(columns)})", source=path, value=missing
        )
    for row in rows:
        if not row:  # an empty line (e.g. trailing): no example
            continue
        if len(row) != len(columns):
            raise DataFileError(
                f"expected {len(columns)} {'tab-' if file_format == 'tsv' else 'comma-'}separated "
                f"columns, found {len(row)}",
                source=path,
                line=reader.line_num,
                value=row,
            )
        yield reader.line_num, dict(zip(columns, row))


def _checked_rows(reader, path: Path) -> Iterator[list[str]]:
    """The rows of a csv reader; a row it cannot read (a field past the csv module's size limit) names its line."""
    try:
        yield from reader
    except csv.Error as error:
        limit = csv.field_size_limit()
        # No task text needs that much (examples are cut to task.max_length tokens): rather a broken file,
        # e.g. a CSV quote never closed. The limit is process-wide, so it stays as it is.
        reason = (
            f"a field longer than {limit:,} characters, the most a field may hold"
            if "field larger than field limit" in str(error)
            else str(error)
        )
        raise DataFileError(reason, source=path, line=reader.line_num) from None


def json_records(handle, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) per non-empty line of a JSON Lines file; invalid JSON names its line."""
    for line, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataFileError(f"invalid JSON ({error.msg})", source=path, line=line) from None
        if not isinstance(record, dict):
            raise DataFileError(
                f"expected a JSON object, found {type(record).__name__}", source=path, line=line, value=record
            )
        yield line, record


def examples_from_records(spec: TaskSpec, path: Path, records: Iterator[tuple[int, dict]]) -> TaskExamples:
    """Texts, labels and ids from checked records; a file is labelled when its first record has the label."""
    texts: list[tuple[str, ...]] = []
    labels: list[list[float] | float | int] = []  # a 0/1 row (multilabel), a score or a class index per example
    ids: list[str] = []
    labelled = None
    for line, record in records:
        missing = [name for name in spec.text_columns if name not in record]
        if missing:
            raise DataFileError(f"missing key(s) {', '.join(missing)}", source=path, line=line, value=missing)
        texts.append(spec.model_texts(tuple(_text(record[name], name, path, line) for name in spec.text_columns)))
        ids.append(str(record[spec.index_column]) if spec.index_column in record else str(len(ids)))
        if labelled is None:
            labelled = has_label_set(spec, record) if spec.label_sets else spec.label_column in record
        if labelled and spec.label_sets:  # a 0/1 row over the task's labels
            labels.append(label_set_row(spec, record, path, line))
        elif labelled:
            if spec.label_column not in record:
                raise DataFileError(
                    f"missing key {spec.label_column} (earlier lines have it)",
                    source=path,
                    line=line,
                    value=spec.label_column,
                )
            labels.append(_parse_label(spec, record[spec.label_column], path, line))
    if not texts:
        raise DataFileError("no examples", source=path)
    if not labelled:
        return TaskExamples(texts, None, ids)
    dtype = np.float32 if spec.is_regression or spec.label_sets else np.int64
    return TaskExamples(texts, np.array(labels, dtype=dtype), ids)


def _text(value: Any, name: str, path: Path, line: int) -> str:
    """A text field; JSON can hold other types, which are refused rather than turned into strings."""
    if not isinstance(value, str):
        raise DataFileError(f"{name} is not a string ({value!r})", source=path, line=line, value=value)
    return value


def _parse_label(spec: TaskSpec, value: Any, path: Path, line: int) -> float | int:
    """A class index from the label string, or a float score; a bad label names the file and line."""
    if spec.is_regression:
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise DataFileError(f"label '{value}' is not a number", source=path, line=line, value=value) from None
        # NaN or inf (1e999 reads as inf; float32 labels make inf of anything past 3.4e38) poisons the loss and
        # the dev scores: refused here, where the line is known.
        if not math.isfinite(score) or abs(score) > FLOAT32_MAX:
            beyond = f" as a 32-bit float (past ±{FLOAT32_MAX:.1e})" if math.isfinite(score) else ""
            raise DataFileError(f"label '{value}' is not a finite number{beyond}", source=path, line=line, value=value)
        return score
    # JSON Lines may hold numbers and booleans: 1 stands for the text "1", true for "true" (1.0 for nothing).
    label, labels = label_text(value), spec.file_labels or spec.labels
    assert labels is not None  # a classifier's spec has its classes (regression returned above)
    if label not in labels:
        raise DataFileError(
            f"label '{value}' is not one of {', '.join(labels)}" + _label_hint(label, labels),
            source=path,
            line=line,
            value=value,
        )
    return labels.index(label)


YAML_BOOLEAN_WORDS = {"yes", "no", "on", "off"}  # what YAML 1.1 (PyYAML) also reads as true or false


def _label_hint(label: Any, labels: tuple[str, ...]) -> str:
    """Why a file's label may have missed the recipe's: a letter case, or YAML's reading of unquoted yes/no."""
    if not isinstance(label, str):
        return ""
    if label.lower() in YAML_BOOLEAN_WORDS and {"true", "false"} & set(labels):
        return f" (YAML reads an unquoted {label} in task.labels as true or false: quote it, '{label}')"
    same = next((known for known in labels if known.lower() == label.lower()), None)
    return f" (labels compare as written: '{same}' is not '{label}'; write '{label}' in task.labels)" if same else ""


def task_documents(spec: TaskSpec, data_dir: Path, splits: list[str]) -> list[str]:
    """Every non-empty text of the splits, one document each: a task's own text for language-model fine-tuning."""
    documents = []
    for split in splits:
        for texts in read_task_split(spec, data_dir, split).texts:
            documents += [document for document in map(document_text, texts) if document]
    return documents


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
        chunk: int = 20_000,
        backwards: bool = False,
        both_directions: bool = False,
        name: str | None = None,
    ):
        reading = reading if isinstance(reading, DocumentReading) else DocumentReading(reading)
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
        columns = list(zip(*examples.texts))
        if len(columns) > 2:  # the readers make one text (or a pair) of more columns: TaskSpec.model_texts
            raise ValueError(f"a model reads one text or a pair, not {len(columns)} texts")
        second = columns[1] if len(columns) > 1 else None
        if reading.both_orders and second is None:
            raise InputError(
                "task.both_orders reads a sentence pair in both orders: this task's examples are one text each"
            )
        self.reading, self.labels = reading, examples.labels
        truncate = reading.mode == "truncate" and reading.max_length is not None
        # In chunks, for a progress bar on large tasks (MNLI: 393k pairs); the result is the same as in one call.
        self.encodings: dict[str, list] = {}
        self.windows: list[range] | None = [] if reading.windowed else None  # rows of each document
        self.full_lengths: list[int] = []  # tokens of each whole example (head_tail, chunks: what the note reports)
        self.windows_before_cap: list[int] = []  # chunks: windows of each document before max_chunks
        with phase_bar("tokenizing", len(columns[0]), enabled=len(columns[0]) > chunk) as advance:
            for start in range(0, len(columns[0]), chunk):
                # verbose=False: transformers' warning about texts longer than the model's positions, which
                # head_tail and chunks read whole on purpose before they cut
                part = tokenizer(
                    list(columns[0][start : start + chunk]),
                    list(second[start : start + chunk]) if second else None,
                    truncation=truncate,
                    max_length=reading.max_length if truncate else None,
                    verbose=False,
                )
                swapped = (
                    tokenizer(
                        list(second[start : start + chunk]),
                        list(columns[0][start : start + chunk]),
                        truncation=truncate,
                        max_length=reading.max_length if truncate else None,
                        verbose=False,
                    )
                    if reading.both_orders and second is not None  # both orders: a pair, as checked above
                    else None
                )
                for index in range(len(part["input_ids"])):
                    if swapped is not None:
                        self._add_both_orders(part, swapped, index)
                    else:
                        self._add(part, index, backwards, both_directions)
                advance(len(part["input_ids"]))
        lengths = [len(ids) for ids in self.encodings["input_ids"]]  # tokens of each row
        self.lengths = lengths if self.windows is None else [sum(lengths[row] for row in rows) for rows in self.windows]
        if name is not None:  # nobody should learn from the scores that most of the text was never read
            note = self._note(tokenizer, columns[0], second, name)
            if note:
                console.print(note, markup=False, highlight=False, soft_wrap=True)

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
                self.encodings.setdefault(key, []).append(values)
        if self.windows is not None:
            assert windows is not None  # windowed here is chunks (both orders has _add_both_orders): windows were cut
            rows = len(self.encodings["input_ids"])
            self.windows.append(range(rows - len(windows), rows))

    def _add_both_orders(self, part, swapped, index: int) -> None:
        """A pair as one document of two rows, (a, b) then (b, a): their logits are added (DocumentReading)."""
        for encoding in (part, swapped):
            for key, values in encoding.items():
                self.encodings.setdefault(key, []).append(values[index])
        assert self.windows is not None  # both orders is a windowed reading: __init__ made the list
        rows = len(self.encodings["input_ids"])
        self.windows.append(range(rows - 2, rows))

    def _note(self, tokenizer, first: Sequence[str], second: Sequence[str] | None, name: str) -> str | None:
        """The line that says what reading did to the examples longer than max_length (None: none was)."""
        reading = self.reading
        if reading.max_length is None:
            return None
        if reading.mode == "truncate":
            # Both orders: the (a, b) rows say what was cut (the (b, a) ones hold the same tokens).
            lengths = [len(ids) for ids in self.encodings["input_ids"][::2]] if reading.both_orders else self.lengths
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


class PaddingCollator:
    """Pads a batch to its longest example with plain torch: the tensors `DataCollatorWithPadding` gives, faster.

    Padding follows the tokenizer: its pad id and pad token type id, its padding side, an attention mask
    when the model takes one; `labels` become int64 class indices or float32 scores.
    """

    def __init__(self, tokenizer):
        if tokenizer.pad_token_id is None:
            raise InputError(f"the tokenizer of {tokenizer.name_or_path} has no pad token to pad batches with")
        input_name = tokenizer.model_input_names[0]
        self.pad_values = {
            input_name: tokenizer.pad_token_id,
            "token_type_ids": tokenizer.pad_token_type_id,
            "attention_mask": 0,
            "special_tokens_mask": 1,
            "backward_input_ids": tokenizer.pad_token_id,
        }  # a bidirectional classifier's
        self.input_name, self.pad_left = input_name, tokenizer.padding_side == "left"
        self.needs_attention_mask = "attention_mask" in tokenizer.model_input_names

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(example[self.input_name]) for example in examples]
        longest = max(lengths)
        batch = {}
        for key in examples[0]:
            if key == "labels":
                batch[key] = torch.tensor([example[key] for example in examples])
            elif key in self.pad_values:
                batch[key] = self._pad([example[key] for example in examples], self.pad_values[key], longest)
            else:
                raise ValueError(f"cannot pad the example field '{key}'")
        if self.needs_attention_mask and "attention_mask" not in batch:
            batch["attention_mask"] = self._pad([[1] * length for length in lengths], 0, longest)
        return batch

    def _pad(self, rows: list[list[int]], value: int, longest: int) -> torch.Tensor:
        """One int64 tensor of the rows, each padded with `value` to `longest` on the tokenizer's side."""
        if self.pad_left:
            return torch.tensor([[value] * (longest - len(row)) + row for row in rows])
        return torch.tensor([row + [value] * (longest - len(row)) for row in rows])


class WindowCollator:
    """Batches of windowed documents (chunks): their windows as padded rows, and which document each row belongs to
    (WINDOW_DOCUMENT); `labels` stay one per document."""

    def __init__(self, tokenizer):
        self.pad = PaddingCollator(tokenizer)

    def __call__(self, documents: list[dict]) -> dict[str, torch.Tensor]:
        rows, owners = [], []
        for number, document in enumerate(documents):
            keys = [key for key in document if key != "labels"]
            for window in range(len(document["input_ids"])):
                rows.append({key: document[key][window] for key in keys})
                owners.append(number)
        batch = self.pad(rows)
        if "labels" in documents[0]:
            batch["labels"] = torch.tensor([document["labels"] for document in documents])
        batch[WINDOW_DOCUMENT] = torch.tensor(owners)
        return batch


def task_collator(tokenizer, encoded: EncodedTask):
    """The collator for batches of `encoded`: windowed documents or plain examples."""
    return WindowCollator(tokenizer) if encoded.windows is not None else PaddingCollator(tokenizer)


class LengthGroupedSampler(ResumableSampler):
    """Shuffled indices in which each run of `batch_size` holds examples of similar length: batches need less padding.

    Per (seed, epoch): shuffle; sort by length within chunks of `chunk_batches` batches; cut the chunks
    into batches; shuffle the whole batches, the one short batch staying last. So a DataLoader with the
    same batch size cuts exactly these batches, and the order never depends on the global random state.
    Give it the examples of a whole optimizer step (batch x processes x accumulated micro-batches): under
    accelerate every process computes the same order and takes its own slice of each group, so a step
    holds the same examples however it is split. Resumable mid-epoch like its base class (`skip`).
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, chunk_batches: int = 50):
        super().__init__(len(lengths), seed)
        self.lengths, self.batch_size = np.asarray(lengths), batch_size
        self.chunk_batches = chunk_batches  # bigger chunks: less padding, less randomness

    def epoch_order(self) -> np.ndarray:
        generator = np.random.default_rng((self.seed, self.epoch))
        order = generator.permutation(len(self.lengths))
        chunk = self.batch_size * self.chunk_batches
        # Longest first within a chunk; the stable sort keeps equal lengths in their shuffled order.
        order = np.concatenate(
            [
                part[np.argsort(-self.lengths[part], kind="stable")]
                for part in np.split(order, range(chunk, len(order), chunk))
            ]
        )
        batches = np.split(order, range(self.batch_size, len(order), self.batch_size))
        full = len(batches) - (len(batches[-1]) < self.batch_size)  # only the very last batch can be short
        shuffled = [batches[index] for index in generator.permutation(full)] + batches[full:]
        return np.concatenate(shuffled)
