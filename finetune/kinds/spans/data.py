"""Extractive question answering data (task kind spans): SQuAD JSON files read into questions with their context
and answers, every answer checked against its context, and their encoding into overlapping windows.

SQuAD's layout (v1.1 and v2.0): {"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}; v2.0's unanswerable questions have
`is_impossible: true` and no answers. A context longer than the window is read in windows of max_length tokens
that share `doc_stride` tokens (each window: the question, then a part of the context): each window is one
training example, labelled with the answer's first and last token, or with the [CLS] token when the answer is not
wholly inside it or the question has none (BERT's and Hugging Face's run_qa's way).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from finetune.data.examples import EncodedItems
from finetune.errors import DataFileError, InputError

DEFAULT_MAX_LENGTH = 384  # tokens of a window (question and context): SQuAD's usual, fitted to the model's positions


@dataclass
class Question:
    """One question of a SQuAD file: `answers` as (text, character start in the context) pairs, none for an
    unanswerable one (v2.0) or a file without answers (a test file)."""

    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)
    unanswerable: bool = False
    title: str = ""


@dataclass
class SquadQuestions:
    """The questions of one SQuAD file, in file order."""

    questions: list[Question]
    source: Path
    version: str = ""

    @property
    def has_unanswerable(self) -> bool:
        return any(question.unanswerable for question in self.questions)


def read_squad(path: Path, with_answers: bool = True) -> SquadQuestions:
    """The questions of a SQuAD JSON file; `with_answers`: every question must have its answers or be marked
    is_impossible. A wrong structure, or an answer whose text is not at its answer_start, names the file, the
    question id and its line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataFileError("not valid UTF-8", source=path) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataFileError(f"not JSON ({error.msg})", source=path, line=error.lineno) from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise DataFileError('not a SQuAD file: expected {"version": ..., "data": [articles]}', source=path)
    questions, seen = [], set()
    for article_number, article in enumerate(document["data"], start=1):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataFileError(f"article {article_number}: no list of paragraphs", source=path)
        title = str(article.get("title", ""))
        for paragraph in paragraphs:
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not isinstance(paragraph.get("qas"), list):
                raise DataFileError(f"article '{title}': a paragraph without its context and qas list", source=path)
            for qa in paragraph["qas"]:
                question = _question(qa, context, title, path, text, with_answers)
                if question.id in seen:
                    raise DataFileError(
                        f"question id '{question.id}' appears twice",
                        source=path,
                        line=line_of(text, question.id),
                        value=question.id,
                    )
                seen.add(question.id)
                questions.append(question)
    if not questions:
        raise DataFileError("no questions", source=path)
    return SquadQuestions(questions, path, str(document.get("version", "")))


def _question(qa, context: str, title: str, path: Path, text: str, with_answers: bool) -> Question:
    """One checked question of a paragraph."""
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), (str, int)) or not isinstance(qa.get("question"), str):
        raise DataFileError(f"article '{title}': a question without its id and question text", source=path)
    identifier = str(qa["id"])

    def error(reason: str) -> DataFileError:
        return DataFileError(
            f"question {identifier}: {reason}", source=path, line=line_of(text, identifier), value=identifier
        )

    unanswerable = bool(qa.get("is_impossible", False))
    answers = []
    for answer in qa.get("answers") or []:
        if (
            not isinstance(answer, dict)
            or not isinstance(answer.get("text"), str)
            or not isinstance(answer.get("answer_start"), int)
            or isinstance(answer.get("answer_start"), bool)
        ):
            raise error('an answer without its "text" and integer "answer_start"')
        start, answer_text = answer["answer_start"], answer["text"]
        if not answer_text or context[start : start + len(answer_text)] != answer_text or start < 0:
            found = context[max(start, 0) : max(start, 0) + len(answer_text)]
            raise error(
                f"the answer {json.dumps(answer_text, ensure_ascii=False)} is not at answer_start {start} "
                f"of its context (found there: {json.dumps(found, ensure_ascii=False)})"
            )
        answers.append((answer_text, start))
    if unanswerable and answers:
        raise error("is_impossible, yet it has answers")
    if with_answers and not unanswerable and not answers:
        raise error("no answers (an unanswerable question of SQuAD 2.0 says is_impossible: true)")
    return Question(identifier, qa["question"], context, answers, unanswerable, title)


def line_of(text: str, identifier: str) -> int | None:
    """The line of a question's id in the file's text (JSON keeps no line numbers), None if not found."""
    position = text.find(json.dumps(identifier))
    return text.count("\n", 0, position) + 1 if position >= 0 else None


@dataclass
class SpanReading:
    """How questions are read and answered: windows of `max_length` tokens sharing `doc_stride`, the `n_best`
    starts and ends tried per window, answers of at most `max_answer_length` tokens, and the margin by which the
    no-answer score must beat the best span (`null_threshold`, SQuAD 2.0)."""

    max_length: int = DEFAULT_MAX_LENGTH
    doc_stride: int | None = None  # None: a third of max_length (128 of 384)
    n_best: int = 20
    max_answer_length: int = 30
    null_threshold: float = 0.0

    def __post_init__(self):
        if self.doc_stride is None:
            self.doc_stride = self.max_length // 3

    @classmethod
    def of(cls, task, max_length: int, saved: dict | None = None) -> SpanReading:
        """The reading of a recipe's `task` section (max_length already fitted to the model); keys it leaves out
        come from `saved` (a checkpoint's saved task section), else the defaults."""
        saved = saved or {}
        keys = {}
        for key in ("doc_stride", "n_best", "max_answer_length", "null_threshold"):
            value = getattr(task, key, None)
            value = saved.get(key) if value is None else value
            if value is not None:
                keys[key] = value
        return cls(max_length=max_length, **keys)

    def describe(self) -> str:
        return (
            f"reads windows of {self.max_length} tokens (question and context) sharing {self.doc_stride} tokens; "
            f"answers of at most {self.max_answer_length} tokens from the {self.n_best} best starts and ends"
        )


class EncodedSpans(EncodedItems):
    """Questions encoded into windows (features): each an item for the model (with `start_positions` and
    `end_positions` where the answers are known) and what post-processing needs: the question it belongs to, the
    character offsets of its context tokens (None elsewhere) and the position of its [CLS] token."""

    def __init__(self, questions: SquadQuestions, tokenizer, reading: SpanReading, with_labels: bool = True):
        if not getattr(tokenizer, "is_fast", False):
            raise InputError(
                "question answering needs a fast tokenizer (one with character offsets: tokenizer.json)",
                source=getattr(tokenizer, "name_or_path", None),
            )
        self.questions, self.reading = questions, reading
        texts = [question.question.lstrip() for question in questions.questions]  # leading spaces waste a window
        check_question_lengths(questions, tokenizer, texts, reading)
        encoding = tokenizer(
            texts,
            [question.context for question in questions.questions],
            truncation="only_second",
            max_length=reading.max_length,
            stride=reading.doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        self.items, self.question_of, self.offsets, self.cls_positions = [], [], [], []
        model_keys = [key for key in encoding if key not in ("offset_mapping", "overflow_to_sample_mapping")]
        for row, question_index in enumerate(encoding["overflow_to_sample_mapping"]):
            sequence = encoding.sequence_ids(row)
            offsets = [
                tuple(offset) if part == 1 else None for offset, part in zip(encoding["offset_mapping"][row], sequence)
            ]
            input_ids = encoding["input_ids"][row]
            cls = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
            item = {key: encoding[key][row] for key in model_keys}
            question = questions.questions[question_index]
            if with_labels and (question.answers or question.unanswerable):
                item["start_positions"], item["end_positions"] = answer_positions(question, offsets, cls)
            self.items.append(item)
            self.question_of.append(question_index)
            self.offsets.append(offsets)
            self.cls_positions.append(cls)


def check_question_lengths(questions: SquadQuestions, tokenizer, texts: Sequence[str], reading: SpanReading) -> None:
    """A question so long that a window holds no more context than doc_stride is one line naming it (the tokenizer
    would fail with a traceback)."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    for question, length in zip(questions.questions, lengths):
        room = reading.max_length - specials - length
        if room <= reading.doc_stride:
            raise DataFileError(
                f"question {question.id}: its {length} tokens leave {max(room, 0)} of the window's "
                f"{reading.max_length} for the context, not more than task.doc_stride "
                f"{reading.doc_stride} (raise task.max_length or lower task.doc_stride)",
                source=questions.source,
                line=line_of(questions.source.read_text(encoding="utf-8-sig"), question.id)
                if questions.source.is_file()
                else None,
                value=question.id,
            )


def answer_positions(question: Question, offsets: Sequence[tuple[int, int] | None], cls: int) -> tuple[int, int]:
    """The first and last token of the (first) answer in a window, or (cls, cls) when the question has no answer
    or the answer is not wholly inside the window's part of the context."""
    if question.unanswerable or not question.answers:
        return cls, cls
    text, start = question.answers[0]
    end = start + len(text)
    # (position, (start, end) in the context) of each context token
    context_tokens = [(position, offset) for position, offset in enumerate(offsets) if offset is not None]
    if not context_tokens or context_tokens[0][1][0] > start or context_tokens[-1][1][1] < end:
        return cls, cls
    first = next(position for position, (_, token_end) in context_tokens if token_end > start)
    last = next(position for position, (token_start, _) in reversed(context_tokens) if token_start < end)
    return first, last
