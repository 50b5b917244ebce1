"""Task kind spans: extractive question answering from SQuAD JSON files (v1.1, v2.0), the family's own
question-answering head scoring every token as an answer's start and end, scored by SQuAD's exact match and F1."""

from __future__ import annotations

from typing import Any

from finetune.kinds.base import TaskKind
from finetune.kinds.spans.data import DEFAULT_MAX_LENGTH, SpanReading
from finetune.kinds.spans.evaluation import run_spans_eval
from finetune.kinds.spans.fine_tuning import SpansFineTuning
from finetune.kinds.spans.model import qa_skeleton
from finetune.kinds.spans.predictor import SpanPredictor, load_span_predictor
from finetune.kinds.spans.recipe import SpansSection
from finetune.reporting.model_card import CardKind, head_architecture
from finetune.tasks.specs import TaskSpec


class SpansKind(TaskKind):
    name = "spans"
    section = SpansSection
    fine_tuning_class = SpansFineTuning

    def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
        return run_spans_eval(recipe, spec, accelerator)

    def predictor(self, folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None) -> SpanPredictor:
        return load_span_predictor(folder, recipe, spec, batch_size, max_length)

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        """The question, its context, the answer and where it is."""
        return rows, [*spec.text_columns, "answer", "score", "start", "end"]

    def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
        return CardKind(
            "question-answering",
            "question-answering model",
            self.section.auto_class_name,
            head_architecture(recipe, model_type),
            "questions.jsonl",
            "a question and its context",
            "the answer, a span of the context (or none, where trained with unanswerable questions)",
            SpanReading.of(recipe.task, recipe.task.max_length or DEFAULT_MAX_LENGTH).describe(),
        )

    def profile_model(self, recipe, config) -> Any:
        return qa_skeleton(config, recipe.model.checkpoint)

    def profile_window(self, recipe) -> int | None:
        """Windows of question and context: 384 tokens unless the recipe says."""
        return recipe.task.max_length or DEFAULT_MAX_LENGTH

    def profile_description(self, recipe, num_labels: int) -> str:
        return "question answering (a start and an end score per token)"


SPANS = SpansKind()
