"""Checkpoints in Hugging Face format, written atomically."""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune.recipes import recipe_to_yaml

HYPERPARAMETERS_FILE = "finetune_recipe.yaml"  # the recipe that produced the weights, beside them


def save_checkpoint(model, tokenizer, directory: Path, recipe=None) -> Path:
    """Save weights (safetensors), config and tokenizer so `AutoModel*.from_pretrained(directory)` loads them.

    Everything is written to a temporary folder first and renamed into place at the end, so a
    run killed during the save never leaves a folder that looks complete but is not.
    """
    directory = Path(directory)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer.save_pretrained(str(partial))
    if recipe is not None:
        (partial / HYPERPARAMETERS_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")
    if directory.exists():
        previous = directory.with_name(directory.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        directory.rename(previous)
        partial.rename(directory)
        shutil.rmtree(previous)
    else:
        partial.rename(directory)
    return directory
