"""Task kind choices: the right answer among each question's choices (ARC's JSON Lines layout), the family's own
multiple-choice head scoring each (question, choice), scored by accuracy."""

from __future__ import annotations

from typing import Any

from finetune.errors import recipe_key
from finetune.kinds.base import TaskKind
from finetune.kinds.choices.evaluation import run_choices_eval
from finetune.kinds.choices.fine_tuning import ChoicesFineTuning
from finetune.kinds.choices.model import choice_model_skeleton, choice_registering_import, load_finetuned_choice_model
from finetune.kinds.choices.predictor import ChoicesPredictor
from finetune.kinds.choices.recipe import ChoicesSection
from finetune.models.hub import load_tokenizer
from finetune.reporting.model_card import CardKind, read_length
from finetune.tasks.specs import TaskSpec


class ChoicesKind(TaskKind):
    name = "choices"
    section = ChoicesSection
    fine_tuning_class = ChoicesFineTuning

    def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
        return run_choices_eval(recipe, spec, accelerator)

    def predictor(
        self, folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None
    ) -> ChoicesPredictor:
        trusted = recipe.model.trust_remote_code
        with recipe_key("CHECKPOINT"):  # its labels are each question's own, not the recipe's
            model = load_finetuned_choice_model(folder, trust_remote_code=trusted)
            tokenizer = load_tokenizer(folder, trust_remote_code=trusted)
        return ChoicesPredictor(model, tokenizer, spec, max_length or recipe.task.max_length, batch_size)

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        """Each question's id and chosen label (`finetune predict` writes its probabilities as JSON Lines only)."""
        return rows, ["id", "label"]

    def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
        length = read_length(recipe.task.max_length, model_type) or "all the"
        return CardKind(
            "multiple-choice",
            "multiple-choice model",
            self.section.auto_class_name,
            choice_registering_import(model_type),
            "questions.jsonl",
            ", ".join(spec.text_columns),
            "a probability per choice",
            f"reads at most {length} tokens of a question with one of its choices",
        )

    def profile_model(self, recipe, config) -> Any:
        return choice_model_skeleton(config, recipe.model.checkpoint)

    def profile_description(self, recipe, num_labels: int) -> str:
        return "multiple choice, a score per choice"


CHOICES = ChoicesKind()
