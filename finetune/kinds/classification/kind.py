"""Task kind classification: a class per example from its text or sentence pair, transformers' sequence classifier
on the backbone (pooled as `pooling` says), scored by the task's metrics (accuracy, F1, MCC). Regression and
multilabel are this kind's machinery with another problem_type (kinds/regression/kind.py, kinds/multilabel/kind.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from finetune.data.examples import TaskExamples
from finetune.data.long_documents import DocumentReading
from finetune.errors import recipe_key
from finetune.kinds.base import TaskKind
from finetune.kinds.classification.evaluation import run_classification_eval
from finetune.kinds.classification.fine_tuning import ClassificationFineTuning
from finetune.kinds.classification.predictor import Predictor
from finetune.kinds.classification.recipe import ClassificationSection
from finetune.kinds.classifier_keys import classifier_keys
from finetune.models.heads import classifier_skeleton, fitted_max_length, load_finetuned
from finetune.models.hub import load_tokenizer
from finetune.reporting.model_card import CardKind, classifier_reading, head_architecture
from finetune.tasks.specs import TaskSpec, task_spec

if TYPE_CHECKING:  # finetune.kinds.recipe loads through finetune.recipes, whose package imports every section
    from finetune.kinds.recipe import TaskSection

POOLING_NOTES = {"mean": ", mean pooling", "scalar_mix": ", scalar mix of every layer"}  # `finetune profile`'s words


class ClassificationKind(TaskKind):
    name = "classification"
    section: type[TaskSection] = ClassificationSection  # regression's and multilabel's are theirs
    fine_tuning_class = ClassificationFineTuning

    def load_model(self, folder: str, spec: TaskSpec, trust_remote_code: bool) -> Any:
        """The fine-tuned classifier of a checkpoint folder, checked against the task's labels."""
        return load_finetuned(folder, spec, trust_remote_code=trust_remote_code)

    def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
        return run_classification_eval(recipe, spec, accelerator)

    def make_predictor(self, model, tokenizer, spec: TaskSpec, reading: DocumentReading, batch_size: int) -> Predictor:
        return Predictor(model, tokenizer, spec, reading, batch_size)

    def predictor(self, folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None) -> Predictor:
        trusted = recipe.model.trust_remote_code
        with recipe_key("CHECKPOINT"):
            model = self.load_model(folder, spec, trusted)
            tokenizer = load_tokenizer(folder, trust_remote_code=trusted)
        task = recipe.task
        length = fitted_max_length(max_length or task.max_length, model)
        reading = DocumentReading.of(length, task.long_documents, task.both_orders)
        return self.make_predictor(model, tokenizer, spec, reading, batch_size)

    def class_probabilities(
        self, folder: str, recipe, spec: TaskSpec, examples: TaskExamples, batch_size: int
    ) -> np.ndarray:
        return self.predictor(folder, recipe, spec, batch_size, None).class_probabilities(examples, name="unlabelled")

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        assert spec.labels is not None  # a classification spec has its classes (kinds/classification/recipe.py)
        return rows, [*spec.text_columns, "label", *(f"probability_{label}" for label in spec.labels)]

    def outputs(self, spec: TaskSpec) -> str:
        """What the model card says the model gives."""
        assert spec.labels is not None
        return ", ".join(spec.labels)

    def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
        return CardKind(
            "text-classification",
            "classifier",
            self.section.auto_class_name,
            head_architecture(recipe, model_type),
            "texts.txt",
            f"`{spec.text_template}`" if spec.text_template else ", ".join(spec.text_columns),
            self.outputs(spec),
            classifier_reading(recipe, model_type),
        )

    def profile_model(self, recipe, config) -> Any:
        assert recipe.pooling is not None  # decided by with_techniques, as the finetune stage decides it
        with classifier_keys():
            return classifier_skeleton(recipe.model, config, task_spec(recipe.task), recipe.pooling)

    def profile_description(self, recipe, num_labels: int) -> str:
        return f"{num_labels}-label classifier" + POOLING_NOTES.get(recipe.pooling, "")


CLASSIFICATION = ClassificationKind()
