"""`finetune multitask`: several tasks fine-tuned at once on one shared encoder (kinds/multitask.py's job, run by the
driver like any finetune run: keep-best, early stopping, periodic checkpoints and an exact --resume)."""

from __future__ import annotations

from pathlib import Path

from finetune.kinds.multitask import MultiTaskFineTuning
from finetune.recipes.multitask import MultiTaskRecipe
from finetune.run_dir import guarded_stage
from finetune.training.driver import run_training
from finetune.training.techniques import describe_backbone, resolve_techniques


@guarded_stage
def run_multitask(recipe: MultiTaskRecipe, resume: bool = False) -> Path:
    """Run the stage (or, `resume`, the rest of a stopped run); returns the checkpoint folder (one folder per task
    inside it). The techniques the recipe leaves open are decided by the backbone, per task (pooling: a tagger's
    head is its family's own), before anything is read."""
    backbone = describe_backbone(recipe.model.checkpoint, recipe.model.trust_remote_code)
    tasks = [resolve_techniques(task, backbone).recipe for task in recipe.tasks]
    recipe = recipe.model_copy(update={"tasks": tasks})
    return run_training(MultiTaskFineTuning(recipe), resume)
