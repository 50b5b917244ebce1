"""What the evaluations of the kinds that score their `models` one by one share (kinds/K/evaluation.py: taggers,
multiple-choice and question-answering models, multi-label classifiers): the recipe's task, models and tokenizers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.data.examples import TaskExamples
from finetune.data.task_files import split_source
from finetune.errors import UserError, recipe_key
from finetune.kinds.dev_split import split_to_score
from finetune.models.hub import load_tokenizer
from finetune.recipes import EvalRecipe, TaskConfig


def examples_to_score(spec, task, recipe: EvalRecipe) -> TaskExamples:
    """The rows `finetune eval` scores (task.dev_split: those the runs held out), refused in one line when they hold no
    labels and the recipe does not ask for predictions alone (write_predictions)."""
    examples = split_to_score(spec, task, recipe)
    if examples.labels is None and not recipe.write_predictions:
        raise UserError(
            f"task '{spec.name}': {split_source(spec, task.data_dir, recipe.split)} has no "
            f"'{spec.label_column}' column: no labels to score against (set write_predictions=true to "
            "predict it)"
        )
    return examples


def refuse_ensembles(recipe: EvalRecipe, models: str) -> None:
    """These kinds score their models one by one: an ensemble is refused in one line."""
    if recipe.ensembles:
        raise UserError(f"ensembles: {models} are scored one by one; list them under models")


def one_task(recipe: EvalRecipe) -> TaskConfig:
    """The `task` of a one-task recipe (EvalRecipe's validator: task or tasks; run_eval sends a recipe with tasks to
    the GLUE evaluation)."""
    assert recipe.task is not None
    return recipe.task


def task_folder(recipe: EvalRecipe) -> Path:
    """The task's data_dir, which TaskConfig's validator requires of the kinds scored here."""
    data_dir = one_task(recipe).data_dir
    assert data_dir is not None
    return data_dir


def models_of(recipe: EvalRecipe) -> dict[str, str]:
    """`models`: report name -> checkpoint. EvalRecipe's validator requires models or ensembles with a task, and
    these kinds refuse ensembles first (refuse_ensembles)."""
    assert recipe.models is not None
    return recipe.models


def load_each(recipe: EvalRecipe, load: Callable) -> dict[str, Any]:
    """Every checkpoint of `models` by its report name, loaded with `load(path, trust_remote_code=...)`; a failure
    names its key (models.NAME)."""
    loaded = {}
    for name, path in models_of(recipe).items():
        with recipe_key(f"models.{name}"):
            loaded[name] = load(path, trust_remote_code=recipe.trust_remote_code)
    return loaded


def tokenizer_of(recipe: EvalRecipe, name: str):
    """The tokenizer saved with the checkpoint of models.NAME."""
    with recipe_key(f"models.{name}"):
        return load_tokenizer(models_of(recipe)[name], trust_remote_code=recipe.trust_remote_code)
