"""Checkpoints in Hugging Face format, written atomically, and the training state that `--resume` reads.

A periodic checkpoint is a Hugging Face model folder (loadable with `from_pretrained`) that also
holds `training_state/`: accelerate's saved state (model, optimizer, random number generators)
and `progress.json` (the step, epoch and batch to continue from).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file

from finetune.recipes import recipe_to_yaml

HYPERPARAMETERS_FILE = "finetune_recipe.yaml"  # the recipe that produced the weights, beside them
TRAINING_STATE_DIR = "training_state"  # inside a periodic checkpoint
PROGRESS_FILE = "progress.json"  # inside training_state/
_STEP_FOLDER = re.compile(r"^step-(\d+)$")


def partial_path(directory: Path) -> Path:
    """Where a checkpoint is assembled before it is renamed into place."""
    return directory.with_name(directory.name + ".partial")


def write_model(model, tokenizer, folder: Path, recipe=None) -> None:
    """Weights (safetensors), config and tokenizer, so `AutoModel*.from_pretrained(folder)` loads them."""
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    if recipe is not None:
        (folder / HYPERPARAMETERS_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")


def commit_checkpoint(partial: Path, directory: Path) -> Path:
    """Rename a fully written folder into place, replacing an older one of the same name.

    Everything is written under the temporary name first, so a run killed during a save never
    leaves a folder that looks complete but is not.
    """
    if directory.exists():
        previous = directory.with_name(directory.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        directory.rename(previous)
        partial.rename(directory)
        shutil.rmtree(previous)
    else:
        partial.rename(directory)
    return directory


def save_checkpoint(model, tokenizer, directory: Path, recipe=None) -> Path:
    """Save a Hugging Face checkpoint atomically (see `commit_checkpoint`)."""
    directory = Path(directory)
    partial = partial_path(directory)
    shutil.rmtree(partial, ignore_errors=True)
    write_model(model, tokenizer, partial, recipe)
    return commit_checkpoint(partial, directory)


def step_checkpoint_dir(run_dir: Path, step: int) -> Path:
    """The folder of the periodic checkpoint taken after `step` optimizer steps."""
    return Path(run_dir) / "checkpoints" / f"step-{step:08d}"


def save_training_checkpoint(accelerator, model, tokenizer, directory: Path, recipe, progress: dict[str, Any],
                             keep: int, process_tensors: Optional[dict[str, torch.Tensor]] = None) -> None:
    """A Hugging Face checkpoint plus everything needed to resume; call on every process.

    Every process saves its own random-number state through accelerate, and its `process_tensors`
    (e.g. the LSTM state carried between batches); the main process writes the model folder and
    `progress.json`, renames the folder into place and prunes old checkpoints.
    """
    directory = Path(directory)
    partial = partial_path(directory)
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial / TRAINING_STATE_DIR), safe_serialization=True)
    if process_tensors:
        tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in process_tensors.items()}
        save_file(tensors, str(partial / TRAINING_STATE_DIR / _process_tensors_file(accelerator)))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_model(model, tokenizer, partial, recipe)
        (partial / TRAINING_STATE_DIR / PROGRESS_FILE).write_text(json.dumps(progress), encoding="utf-8")
        commit_checkpoint(partial, directory)
        for old in training_checkpoints(directory.parent)[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def training_checkpoints(folder: Path) -> list[Path]:
    """Complete periodic checkpoints in `folder`, oldest first (folders still being written are skipped)."""
    if not Path(folder).is_dir():
        return []
    found = []
    for path in Path(folder).iterdir():
        match = _STEP_FOLDER.match(path.name)
        if match and (path / TRAINING_STATE_DIR / PROGRESS_FILE).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_training_checkpoint(run_dir: Path) -> Optional[Path]:
    """The newest complete periodic checkpoint of a run, or None."""
    checkpoints = training_checkpoints(Path(run_dir) / "checkpoints")
    return checkpoints[-1] if checkpoints else None


def load_training_state(accelerator, checkpoint: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore model, optimizer and random states saved by `save_training_checkpoint`.

    Returns the progress and this process's saved tensors (empty when none were saved).
    """
    state = Path(checkpoint) / TRAINING_STATE_DIR
    accelerator.load_state(str(state))
    progress = json.loads((state / PROGRESS_FILE).read_text(encoding="utf-8"))
    tensors_file = state / _process_tensors_file(accelerator)
    tensors = load_file(str(tensors_file), device=str(accelerator.device)) if tensors_file.is_file() else {}
    return progress, tensors


def _process_tensors_file(accelerator) -> str:
    return f"process_tensors_{accelerator.process_index}.safetensors"
