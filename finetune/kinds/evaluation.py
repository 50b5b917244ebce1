"""What the evaluations of the kinds that score their `models` one by one share (kinds/K/evaluation.py: taggers,
multiple-choice and question-answering models, multi-label classifiers): the recipe's task, models and tokenizers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.errors import UserError, recipe_key
from finetune.models.hub import load_tokenizer
from finetune.recipes import EvalRecipe, TaskConfig


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
