"""A fine-tuned multiple-choice model ready to predict: the right choice of a question."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.kinds.choices.data import ChoiceQuestions, parse_choices
from finetune.kinds.choices.training import choose
from finetune.tasks.specs import TaskSpec


@dataclass
class ChoicesPredictor:
    """A fine-tuned multiple-choice model (task kind choices) ready to predict: the right choice of a question."""

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
