"""The task-kind contract: everything the toolkit does differently per kind of task, asked of one object per kind.

A kind (kinds/K/kind.py) brings its recipe section (kinds/K/recipe.py: its keys, their checks, the TaskSpec it
builds, the name of its Auto class), its fine-tuning stage (reading and checking its files, encoding, the model head,
loss and dev metrics), its `finetune eval`, its predictor (kinds/predictor.py: what it reads and predicts) and output
columns for `finetune predict`, its model-card text and its figures for `finetune profile`. The stages and commands
ask these objects (kinds/registry.py: `kind_of(spec)`, `kind_named(name)`) instead of comparing kind names, so adding
a kind is adding its package and one line to each of the two tables (docs/contributing.md, "Add a task kind").

The sequence-classification kinds (classification, regression, multilabel) share transformers' sequence classifier,
its pooling and classification's evaluation (kinds/classification/evaluation.py: ensembles); the others have heads of
their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from finetune.data.examples import TaskExamples
from finetune.kinds.fine_tuning import TaskFineTuning
from finetune.kinds.predictor import TaskPredictor
from finetune.models.task_heads import auto_class_of
from finetune.reporting.model_card import CardKind
from finetune.tasks.specs import TaskSpec

if TYPE_CHECKING:  # finetune.kinds.recipe loads through finetune.recipes, whose package imports every section
    from finetune.kinds.recipe import TaskSection


class TaskKind:
    """One task kind; subclasses fill in what their kind does. Methods left to a subclass raise NotImplementedError,
    which tests/kinds/test_registry.py checks no registered kind does."""

    name: str  # the recipe's task.kind, the registry's key
    section: type[TaskSection]  # its recipe section (kinds/K/recipe.py): the keys of task, checked, `.spec()`
    fine_tuning_class: type[
        TaskFineTuning
    ]  # its `finetune finetune` stage (read, encode, head, loss, dev metrics, save)

    @property
    def auto_class(self) -> Any:
        """transformers' Auto class that loads a checkpoint of this kind (its section's auto_class_name)."""
        return auto_class_of(self.section)

    def fine_tuning(self, recipe) -> TaskFineTuning:
        """The fine-tuning job of a recipe of this kind (what `finetune finetune` hands the run driver)."""
        return self.fine_tuning_class(recipe, self)

    def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
        """`finetune eval` of a one-task recipe (a GLUE map is commands/evaluate.py's): the report written."""
        raise NotImplementedError

    def predictor(self, folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None) -> TaskPredictor:
        """The fine-tuned checkpoint in `folder` (its saved `recipe`), ready to predict (`finetune predict`)."""
        raise NotImplementedError

    def class_probabilities(
        self, folder: str, recipe, spec: TaskSpec, examples: TaskExamples, batch_size: int
    ) -> np.ndarray:
        """Each example's probability of each class (rows in order, columns in label order) by the fine-tuned
        checkpoint in `folder`: self-training's teacher (stages/self_training.py), for a kind whose section
        self_trains."""
        raise NotImplementedError

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        """Prediction rows for a TSV/CSV file, and its columns (probabilities: `probability_LABEL`)."""
        raise NotImplementedError

    def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
        """What the model card of a fine-tuned checkpoint says of the kind (`result`: the run's result.json)."""
        raise NotImplementedError

    def profile_model(self, recipe, config) -> Any:
        """The model `finetune profile` sizes, built on the meta device from the backbone's `config`."""
        raise NotImplementedError

    def profile_window(self, recipe) -> int | None:
        """The tokens per example `finetune profile` counts before the model fits them (task.max_length)."""
        return recipe.task.max_length

    def profile_description(self, recipe, num_labels: int) -> str:
        """What `finetune profile` calls the model (`num_labels`: its head's outputs)."""
        raise NotImplementedError
