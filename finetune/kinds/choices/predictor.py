"""A fine-tuned multiple-choice model ready to predict: the right choice of a question."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TextIO

import torch

from finetune.errors import UserError
from finetune.kinds.choices.data import ChoiceQuestions, parse_choices, read_choices
from finetune.kinds.choices.training import choose
from finetune.kinds.predictor import STDIO, TaskPredictor
from finetune.tasks.specs import TaskSpec


@dataclass
class ChoicesPredictor(TaskPredictor):
    """A fine-tuned multiple-choice model (task kind choices) ready to predict: the right choice of a question."""

    json_lines_only: ClassVar[str | None] = (
        "multiple-choice predictions (a probability per choice label) are written as JSON Lines (.jsonl)"
    )

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec
    max_length: int | None
    batch_size: int = 64

    def predict(self, questions: Sequence[dict]) -> list[dict]:
        """One result per question in ARC's layout ({"id", "question": {"stem", "choices": [{"text", "label"}]}},
        answerKey not needed): {"id", "label", "probabilities"}."""
        lines = [json.dumps(question) for question in questions]
        return self.predict_questions(parse_choices(lines, Path("questions"), with_answers=False)) if lines else []

    def predict_questions(self, questions: ChoiceQuestions) -> list[dict]:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        probabilities = choose(self.model, self.tokenizer, questions, self.max_length, self.batch_size, device)
        return [
            {
                "id": question_id,
                "label": labels[int(row.argmax())],
                "probabilities": {label: float(p) for label, p in zip(labels, row)},
            }
            for question_id, labels, row in zip(questions.ids, questions.labels, probabilities)
        ]

    def predict_source(self, source: str, stdin: TextIO) -> list[dict]:
        """Questions in ARC's layout (a .jsonl file, or `-`: standard input), answerKey not needed."""
        if source == STDIO:
            questions = parse_choices(stdin.read().splitlines(), Path("<stdin>"), with_answers=False)
        elif not Path(source).is_file():
            raise UserError(f"--input: no such file: {source}")
        else:
            questions = read_choices(Path(source), with_answers=False)
        return self.predict_questions(questions)
