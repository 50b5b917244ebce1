"""A fine-tuned question-answering model ready to predict: an answer to a question from its context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.data.examples import TaskExamples
from finetune.errors import recipe_key
from finetune.kinds.predictor import TextPredictor
from finetune.kinds.spans.data import Question, SpanReading, SquadQuestions
from finetune.kinds.spans.model import load_finetuned_qa
from finetune.kinds.spans.training import answer_questions, span_max_length
from finetune.models.hub import load_tokenizer
from finetune.tasks.specs import TaskSpec


@dataclass
class SpanPredictor(TextPredictor):
    """A fine-tuned question-answering model ready to predict: an answer to a question from its context."""

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec  # text columns question, context
    reading: SpanReading
    batch_size: int = 64

    def predict(self, texts: Sequence[Sequence[str]]) -> list[dict]:
        """One result per (question, context) pair: {"answer", "score", "start", "end"} (characters of the context;
        answer "" and start, end None for no answer)."""
        return self.predict_examples(
            TaskExamples([tuple(pair) for pair in texts], None, [str(index) for index in range(1, len(texts) + 1)])
        )

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        questions = SquadQuestions(
            [
                Question(identifier, question, context)
                for identifier, (question, context) in zip(examples.ids, examples.texts)
            ],
            Path("input"),
        )
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        answers = answer_questions(self.model, self.tokenizer, questions, self.reading, self.batch_size, device)
        return [answer.as_row() for answer in answers]


def load_span_predictor(folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None) -> SpanPredictor:
    """The question-answering model of a checkpoint folder, read and answering as it was trained."""
    with recipe_key("CHECKPOINT"):
        model = load_finetuned_qa(folder, trust_remote_code=recipe.model.trust_remote_code)
        tokenizer = load_tokenizer(folder, trust_remote_code=recipe.model.trust_remote_code)
    length = span_max_length(max_length or recipe.task.max_length, model)
    return SpanPredictor(model, tokenizer, spec, SpanReading.of(recipe.task, length), batch_size)
