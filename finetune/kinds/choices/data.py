"""Multiple-choice data (task kind choices): questions read from JSON Lines in ARC's layout, each with its own
number of choices, and their encoding as one (question, choice) sequence per choice.

The layout read (AI2's ARC files, ARC-Easy-Train.jsonl):
`{"id": ..., "question": {"stem": ..., "choices": [{"text": ..., "label": "A"}, ...]}, "answerKey": "A"}`.
The labels are whatever the question uses (A-E, 1-4); the answer is the index of the choice whose label is the
answerKey. Every line is checked: a question with fewer than 2 choices or more than MAX_CHOICES, repeated labels,
or an answerKey not among its labels is one line naming file and line.

A batch mixes questions of different choice counts: `collate_choices` pads them to the batch's largest count and
marks the real choices in `choice_mask`; the scores of padding choices are set to -inf before the softmax
(kinds/choices/training.py), so a question's probabilities are those it would get alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch

from finetune.data.examples import EncodedItems
from finetune.errors import DataFileError

MAX_CHOICES = 8  # ARC has 3 to 5; more is taken for a malformed row
CHOICE_MASK = "choice_mask"  # (questions, choices): True for a real choice, False for padding


@dataclass
class ChoiceQuestions:
    """One split of a multiple-choice task: each question's id, stem, choices and their labels, the index of the
    right choice (None for a file without answers), and the line it is on (for messages)."""

    ids: list[str]
    stems: list[str]
    choices: list[list[str]]
    labels: list[list[str]]
    answers: list[int] | None
    lines: list[int]
    source: Path


def read_choices(path: Path, with_answers: bool = True) -> ChoiceQuestions:
    """The questions of a JSON Lines file in ARC's layout; `with_answers`: each must have its answerKey."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path) from None
    return parse_choices(text.splitlines(), Path(path), with_answers)


def parse_choices(lines: Iterable[str], source: Path, with_answers: bool = True) -> ChoiceQuestions:
    """`read_choices` on lines already read (predict's standard input)."""
    questions = ChoiceQuestions([], [], [], [], [] if with_answers else None, [], source)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(f"not JSON ({error.msg})", source=source, line=number, value=line) from None
        _add_question(questions, row, number, with_answers)
    if not questions.ids:
        raise DataFileError(
            "no questions (one JSON object a line in ARC's layout: id, question with stem and choices, answerKey)",
            source=source,
        )
    return questions


def _add_question(questions: ChoiceQuestions, row, number: int, with_answers: bool) -> None:
    def fail(message: str, value: Any = None) -> NoReturn:
        raise DataFileError(message, source=questions.source, line=number, value=value)

    question = row.get("question") if isinstance(row, dict) else None
    if not isinstance(question, dict) or not isinstance(question.get("stem"), str):
        fail('not a question in ARC\'s layout: {"id", "question": {"stem", "choices"}, "answerKey"}')
    choices = question.get("choices")
    if not isinstance(choices, list) or not all(
        isinstance(choice, dict) and isinstance(choice.get("text"), str) and isinstance(choice.get("label"), (str, int))
        for choice in choices
    ):
        fail('question.choices must be a list of {"text", "label"}')
    if not 2 <= len(choices) <= MAX_CHOICES:
        fail(f"{len(choices)} choices: a question has 2 to {MAX_CHOICES}", value=len(choices))
    labels = [str(choice["label"]) for choice in choices]
    if len(set(labels)) != len(labels):
        fail(f"choice labels {', '.join(labels)} repeat a label", value=labels)
    answer = row.get("answerKey")
    if with_answers:
        if str(answer) not in labels:
            fail(f"answerKey {answer!r} is not one of the question's choice labels ({', '.join(labels)})", value=answer)
        assert questions.answers is not None  # parse_choices made the list: with_answers
        questions.answers.append(labels.index(str(answer)))
    questions.ids.append(str(row.get("id", number)))
    questions.stems.append(question["stem"])
    questions.choices.append([choice["text"] for choice in choices])
    questions.labels.append(labels)
    questions.lines.append(number)


class EncodedChoices(EncodedItems):
    """Each question as one token sequence per choice, at most `max_length` tokens each.

    An encoder reads a choice as a sentence pair (BERT: [CLS] question [SEP] choice [SEP]); a decoder, GPT's way
    (`delimiter` given): the question, the delimiter, the choice and the delimiter again, whose state at that last
    token has read the whole sequence. Too long a sequence loses the start of its question.
    """

    def __init__(self, questions: ChoiceQuestions, tokenizer, max_length: int, delimiter: int | None = None):
        self.questions, self.items = questions, []
        for index, (stem, choices) in enumerate(zip(questions.stems, questions.choices)):
            item: dict[str, Any]
            if delimiter is None:
                encoding = tokenizer([stem] * len(choices), choices, truncation="longest_first", max_length=max_length)
                item = {key: list(encoding[key]) for key in encoding}
            else:
                item = _decoder_sequences(tokenizer, stem, choices, max_length, delimiter)
            if questions.answers is not None:
                item["labels"] = questions.answers[index]
            self.items.append(item)

    @property
    def lengths(self) -> list[int]:
        """The padded size of each question (choices x longest choice): what length grouping sorts by."""
        return [len(item["input_ids"]) * max(len(ids) for ids in item["input_ids"]) for item in self.items]


def _decoder_sequences(tokenizer, stem: str, choices: list[str], max_length: int, delimiter: int) -> dict:
    question = tokenizer(stem, add_special_tokens=False)["input_ids"]
    sequences = []
    for choice in choices:
        answer = tokenizer(" " + choice, add_special_tokens=False)["input_ids"][: max_length // 2]
        room = max(max_length - len(answer) - 2, 0)
        sequences.append((question[-room:] if room else []) + [delimiter] + answer + [delimiter])
    return {"input_ids": sequences, "attention_mask": [[1] * len(ids) for ids in sequences]}


def collate_choices(pad_token_id: int):
    """Questions to tensors of (questions, choices, tokens), padded on the right to the batch's most choices and
    longest sequence, with CHOICE_MASK marking the real choices. A padding choice is one attended pad token, so
    that no attention row is empty."""

    def collate(items: list[dict]) -> dict:
        count = max(len(item["input_ids"]) for item in items)
        length = max(len(ids) for item in items for ids in item["input_ids"])
        batch = {}
        for key in items[0]:
            if key == "labels":
                continue
            fill = pad_token_id if key == "input_ids" else 0
            tensor = torch.full((len(items), count, length), fill, dtype=torch.long)
            for row, item in enumerate(items):
                for column, values in enumerate(item[key]):
                    tensor[row, column, : len(values)] = torch.tensor(values, dtype=torch.long)
            batch[key] = tensor
        batch[CHOICE_MASK] = torch.tensor(
            [[column < len(item["input_ids"]) for column in range(count)] for item in items]
        )
        batch["attention_mask"][:, :, 0][~batch[CHOICE_MASK]] = 1
        if "labels" in items[0]:
            batch["labels"] = torch.tensor([item["labels"] for item in items], dtype=torch.long)
        return batch

    return collate
