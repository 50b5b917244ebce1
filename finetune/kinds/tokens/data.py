"""Tagging data (task kind tokens): CoNLL column files read into sentences of words and tags, and their encoding
with the tag of each word on its first sub-token (BERT's way: the others are ignored by the loss and the scores),
or on its last for a model that reads left to right (it knows a word only once it has read all of it).

A CoNLL file holds one word per line with its columns (CoNLL-2003: word, part of speech, chunk, named entity),
a blank line between sentences, and `-DOCSTART-` lines between documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from finetune.console import console
from finetune.data.examples import EncodedItems
from finetune.data.task_files import task_file
from finetune.errors import DataFileError, InputError
from finetune.kinds.tokens.spec import tagging_spec
from finetune.tasks.specs import TaskSpec

IGNORED = -100  # the label of sub-tokens after a word's first, and of special tokens: no loss, no score
DOCUMENT_START = "-DOCSTART-"


@dataclass
class TaggedSentences:
    """One split of a tagging task: the words of each sentence, their tags (None for a file without tags), and the
    line each sentence starts on (for messages)."""

    words: list[list[str]]
    tags: list[list[str]] | None
    lines: list[int]
    source: Path


def read_tagged_split(spec: TaskSpec, data_dir: Path | None, split: str) -> TaggedSentences:
    """A split's file of the tagging task `spec`, its tags read from the task's tag column."""
    return read_conll(task_file(spec, data_dir, split), tagging_spec(spec).tag_column)


def read_conll(path: Path, tag_column: int = -1, with_tags: bool = True) -> TaggedSentences:
    """The sentences of a CoNLL column file; `with_tags`: every line must have the tag column."""
    words: list[list[str]] = []
    tags: list[list[str]] = []
    lines: list[int] = []
    sentence_words: list[str] = []
    sentence_tags: list[str] = []
    start = 0
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path) from None
    for number, line in enumerate(text.splitlines() + [""], start=1):
        columns = line.split()
        if columns and columns[0] == DOCUMENT_START:
            columns = []  # a document boundary ends the sentence too
        if not columns:
            if sentence_words:
                words.append(sentence_words)
                tags.append(sentence_tags)
                lines.append(start)
            sentence_words, sentence_tags = [], []
            continue
        if not sentence_words:
            start = number
        sentence_words.append(columns[0])
        if with_tags:
            if len(columns) < 2 or not -len(columns) <= tag_column < len(columns) or tag_column in (0, -len(columns)):
                raise DataFileError(
                    f"no tag in column {tag_column} (the line has {len(columns)} columns, the first being the word)",
                    source=path,
                    line=number,
                    value=line,
                )
            sentence_tags.append(columns[tag_column])
    if not words:
        raise DataFileError("no sentences (a word per line, a blank line between sentences)", source=path)
    return TaggedSentences(words, tags if with_tags else None, lines, Path(path))


def tag_set(sentences: TaggedSentences) -> tuple[str, ...]:
    """The tags of a training file in a stable order: O first, then by entity type, B- before I-."""
    assert sentences.tags is not None  # a training file is read with its tags (read_conll's with_tags)
    found = {tag for sentence in sentences.tags for tag in sentence}

    def order(tag: str) -> tuple:
        prefix, _, kind = tag.partition("-")
        return (tag != "O", kind if kind else prefix, prefix)

    return tuple(sorted(found, key=order))


def tag_indices(sentences: TaggedSentences, tags: Sequence[str]) -> list[list[int]]:
    """Each sentence's tags as indices into `tags`; a tag outside them is one line naming file and line."""
    assert sentences.tags is not None  # callers pass files read with their tags (read_conll's with_tags)
    index = {tag: position for position, tag in enumerate(tags)}
    encoded = []
    for sentence, start in zip(sentences.tags, sentences.lines):
        unknown = next((offset for offset, tag in enumerate(sentence) if tag not in index), None)
        if unknown is not None:
            raise DataFileError(
                f"tag '{sentence[unknown]}' is not one of the task's tags ({', '.join(tags)})",
                source=sentences.source,
                line=start + unknown,
                value=sentence[unknown],
            )
        encoded.append([index[tag] for tag in sentence])
    return encoded


class EncodedTagging(EncodedItems):
    """Sentences tokenised as running text, each word's tag on its first token (IGNORED elsewhere); `last_token`
    for a model that reads left to right, which knows a word only once it has read all of it.

    A sentence longer than `max_length` tokens is cut, and said so in one line at load time: its last words get
    no loss and are predicted O.
    """

    def __init__(
        self,
        sentences: TaggedSentences,
        tokenizer,
        max_length: int | None,
        tags: Sequence[str] | None = None,
        name: str = "training",
        last_token: bool = False,
    ):
        if not getattr(tokenizer, "is_fast", False):
            raise InputError(
                "tagging needs a fast tokenizer (one with word offsets: tokenizer.json)",
                source=getattr(tokenizer, "name_or_path", None),
            )
        self.sentences, self.max_length = sentences, max_length
        # The words joined by spaces and tokenised as running text, each token mapped to its word by character
        # offsets: every family then sees the pieces it was pretrained on (GPT-2's byte-level BPE marks a word's
        # leading space, which pre-split words would lose).
        texts = [" ".join(words) for words in sentences.words]
        encoding = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True)
        labels = tag_indices(sentences, tags) if tags is not None and sentences.tags is not None else None
        self.items, self.word_positions = [], []
        cut = 0
        for row, input_ids in enumerate(encoding["input_ids"]):
            first_tokens = word_tokens(
                encoding["offset_mapping"][row], encoding.sequence_ids(row), sentences.words[row], last_token
            )
            self.word_positions.append(first_tokens)
            cut += None in first_tokens
            item = {key: encoding[key][row] for key in encoding if key != "offset_mapping"}
            if labels is not None:
                item["labels"] = [IGNORED] * len(input_ids)
                for word, position in enumerate(first_tokens):
                    if position is not None:
                        item["labels"][position] = labels[row][word]
            self.items.append(item)
        if cut:
            console.print(
                f"note: {cut:,} of the {len(self.items):,} {name} sentences have words the tagger does not "
                f"read, mostly their last ones beyond max_length {max_length} tokens (raise "
                "task.max_length); such words are predicted O",
                markup=False,
                highlight=False,
            )

    def word_tags(self, logits: Sequence[np.ndarray], tags: Sequence[str]) -> list[list[str]]:
        """Each sentence's predicted tag per word, from per-token logits (a sentence's rows, padding cut off): the
        tag at each word's first token; a word not read gets O."""
        predicted = []
        for row, positions in enumerate(self.word_positions):
            best = logits[row].argmax(axis=-1)
            predicted.append(["O" if position is None else tags[int(best[position])] for position in positions])
        return predicted


def word_tokens(
    offsets: Sequence[tuple[int, int]], sequence_ids: Sequence[int | None], words: Sequence[str], last: bool = False
) -> list[int | None]:
    """The position of each word's first token (`last`: its last one) for `words` joined by single spaces and
    tokenised with these character `offsets`; None for a word with no token (cut off by max_length, or all of it
    dropped by the tokenizer's normalisation)."""
    starts = np.cumsum([0] + [len(word) + 1 for word in words[:-1]])
    positions: list[int | None] = [None] * len(words)
    for position, ((start, end), segment) in enumerate(zip(offsets, sequence_ids)):
        if segment is None or end <= start:
            continue  # a special token
        # The word holding the token's last character (a byte-level token may start at the space before it).
        index = int(np.searchsorted(starts, end - 1, side="right")) - 1
        if end - 1 < starts[index] + len(words[index]) and (last or positions[index] is None):
            positions[index] = position
    return positions


def words_of_lines(lines: list[str], source: str) -> TaggedSentences:
    """Plain text to tag: a sentence per line, words split at white space (blank lines skipped)."""
    words = [line.split() for line in lines]
    kept = [(number, sentence) for number, sentence in enumerate(words, start=1) if sentence]
    return TaggedSentences([sentence for _, sentence in kept], None, [number for number, _ in kept], Path(source))
