"""Ensembles of fine-tuned classifiers: ULMFiT's bidirectional model, a forward and a backward classifier whose
predictions are averaged (Howard & Ruder 2018, section 3.3), or any other set of classifiers of one task.

Classes: the mean of the members' class probabilities (softmax of each member's logits, which `finetune eval` divides
by the member's calibration temperature when it has one), so a confident member weighs more than an unsure one, and
no member's logit scale dominates; the ensemble predicts the most probable class. Regression (STS-B): the mean of the
members' scores. `finetune eval` scores the ensemble and each member.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from finetune.errors import UserError
from finetune.recipes import read_yaml
from finetune.tasks.specs import TaskSpec
from finetune.training.checkpoints import HYPERPARAMETERS_FILE


def ensemble_outputs(spec: TaskSpec, member_outputs: list[np.ndarray]) -> np.ndarray:
    """The ensemble's outputs from its members' logits (examples x classes) or scores (examples x 1): the mean
    class probabilities, or the mean score; `logits_to_predictions` reads either."""
    if spec.is_regression:
        return np.mean(np.stack(member_outputs), axis=0)
    probabilities = [torch.softmax(torch.from_numpy(outputs).double(), dim=-1).numpy() for outputs in member_outputs]
    return np.mean(np.stack(probabilities), axis=0).astype(np.float32)


def fine_tuned_task(checkpoint: str) -> str | None:
    """The task a checkpoint was fine-tuned on, from the recipe saved beside its weights (None: not recorded)."""
    recipe = Path(checkpoint) / HYPERPARAMETERS_FILE
    if not recipe.is_file():  # a hub model, or a classifier trained elsewhere
        return None
    task = read_yaml(recipe).get("task")
    return task.get("name") if isinstance(task, dict) else None


def check_one_task(key: str, members: list[str]) -> None:
    """Members fine-tuned on different tasks are refused: the same labels (0/1 for SST-2 and CoLA) can mean other
    things. Their label mappings are checked against the task when they load (models/heads.py, load_finetuned)."""
    tasks = {member: fine_tuned_task(member) for member in members}
    named = {task for task in tasks.values() if task is not None}
    if len(named) > 1:
        listed = ", ".join(f"{member} ({task})" for member, task in tasks.items() if task is not None)
        raise UserError(
            f"{key}: the members were fine-tuned on different tasks: {listed}; an ensemble averages "
            "classifiers of one task"
        )
