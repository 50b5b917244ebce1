"""Checkpoints in Hugging Face format, written atomically, and the training state that `--resume` reads.

A periodic checkpoint is a Hugging Face model folder (loadable with `from_pretrained`) that also
holds `training_state/`: accelerate's saved state (model, optimizer, random number generators),
the run's TrainingState (training/state.py: progress.json and each process's tensors) and
copies of folders the stage attaches (finetune: the best evaluation's weights).

Every checkpoint is assembled under `NAME.partial` and renamed into place when complete, and renamed out of
place (`NAME.previous`, `NAME.deleting`) before it is deleted: a run killed or out of disk space during a save
or a pruning leaves complete checkpoints and leftovers under those names, never something that
`latest_training_checkpoint` (or a user) would take for a complete checkpoint. `sweep_incomplete_checkpoints`
clears the leftovers when the run resumes.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from peft import PeftModel
from pydantic import ValidationError

from finetune.console import console
from finetune.data.corpus import DOCUMENT_KINDS
from finetune.data.long_documents import DocumentReading
from finetune.errors import CheckpointError, RunFailed, UserError
from finetune.models.adapters import save_adapter
from finetune.models.checkpoint_files import check_checkpoint_files
from finetune.models.loading import ADAPTER_WEIGHTS_FILE
from finetune.recipes import recipe_to_yaml
from finetune.recipes.base import LongDocumentsConfig
from finetune.recipes.multitask_checkpoints import multitask_tasks
from finetune.run_dir import CHECKPOINT_DIR, round_folders
from finetune.training.state import PROGRESS_FILE, TRAIN_PHASE, TrainingState, read_training_state

HYPERPARAMETERS_FILE = "finetune_recipe.yaml"  # the recipe that produced the weights, beside them
TRAINING_STATE_DIR = "training_state"  # inside a periodic checkpoint
WEIGHTS_FILE = "model.safetensors"  # or, for a model too large for one file, shards named by WEIGHTS_INDEX_FILE
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
# step-N of the run's own training; PHASE-step-N of a phase before it (head_warmup-step-N), older than any step-N.
_STEP_FOLDER = re.compile(r"^(?:([a-z_]+)-)?step-(\d+)$")
# Folders being written, replaced or deleted: nothing takes them for a checkpoint; a resumed run sweeps them.
PARTIAL, PREVIOUS, DELETING = ".partial", ".previous", ".deleting"


def partial_path(directory: Path) -> Path:
    """Where a checkpoint is assembled before it is renamed into place."""
    return directory.with_name(directory.name + PARTIAL)


def remove_checkpoint(directory: Path) -> None:
    """Delete a checkpoint folder, renamed to `NAME.deleting` first: a kill meanwhile leaves no half-deleted one."""
    doomed = directory.with_name(directory.name + DELETING)
    shutil.rmtree(doomed, ignore_errors=True)  # a leftover of an earlier kill (the rename needs the name free)
    if directory.exists():
        directory.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)  # what stays is no checkpoint, and the next sweep's


def write_model(model, tokenizer, folder: Path, recipe=None) -> None:
    """Weights (safetensors), config and tokenizer, so `AutoModel*.from_pretrained(folder)` loads them; for a model
    with a LoRA adapter (a PeftModel) the adapter in peft's format instead of the weights (models/adapters.py)."""
    if isinstance(model, PeftModel):
        save_adapter(model, folder)
    else:
        model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    if recipe is not None:
        (folder / HYPERPARAMETERS_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")


def commit_checkpoint(partial: Path, directory: Path) -> Path:
    """Rename a fully written folder into place, replacing an older one of the same name.

    Everything is written under the temporary name first, so a run killed during a save never
    leaves a folder that looks complete but is not. A kill between the two renames leaves the old folder
    as `NAME.previous` and no `NAME`: `sweep_incomplete_checkpoints` puts it back.
    """
    if directory.exists():
        previous = directory.with_name(directory.name + PREVIOUS)
        remove_checkpoint(previous)  # a leftover beside a complete folder
        directory.rename(previous)
        partial.rename(directory)
        remove_checkpoint(previous)
    else:
        partial.rename(directory)
    return directory


def set_config_entry(folder: Path, key: str, value) -> None:
    """Set one entry of a saved checkpoint's config.json, written anew and renamed into place: the folder's files
    may be hard links shared with the periodic checkpoints' copies (save_training_checkpoint), which keep theirs."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config[key] = value
    partial = path.with_name(path.name + PARTIAL)
    partial.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")  # transformers' layout
    os.replace(partial, path)


def save_checkpoint(model, tokenizer, directory: Path, recipe=None) -> Path:
    """Save a Hugging Face checkpoint atomically (see `commit_checkpoint`); a failed write is a one-line RunFailed."""
    directory = Path(directory)
    partial = partial_path(directory)
    try:
        shutil.rmtree(partial, ignore_errors=True)
        write_model(model, tokenizer, partial, recipe)
    except Exception as error:
        shutil.rmtree(partial, ignore_errors=True)  # frees what the failed write took
        if not is_write_failure(error):
            raise
        raise save_failed(directory, error) from None
    return commit_checkpoint(partial, directory)


def saved_recipe(folder: str | Path) -> dict:
    """The recipe saved beside a checkpoint's weights, as plain YAML (no paths checked); {} for a checkpoint without
    a readable one (older ones, other tools', hub names)."""
    path = Path(folder) / HYPERPARAMETERS_FILE
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        recipe = None
    return recipe if isinstance(recipe, dict) else {}


def trained_document_kind(folder: str | Path) -> str:
    """What a document was for the language model of a checkpoint folder (its saved recipe's corpus.document):
    line for a checkpoint without one (older ones, other tools', hub names), which read text a line at a time."""
    corpus = saved_recipe(folder).get("corpus")
    document = corpus.get("document") if isinstance(corpus, dict) else None
    return document if document in DOCUMENT_KINDS else "line"


def checkpoint_reading(
    folder: str | Path, max_length: int | None = None, long_documents: LongDocumentsConfig | None = None
) -> DocumentReading:
    """How to read task examples for a fine-tuned checkpoint folder: `max_length` and `long_documents` (a
    LongDocumentsConfig) where given, else as its saved recipe trained it (task.max_length, task.long_documents;
    task.both_orders always as trained: the model learned the sum of both orders' logits);
    a checkpoint without one (another tool's, a hub name) gets the defaults (fitted to the model later)."""
    task = saved_recipe(folder).get("task")
    task = task if isinstance(task, dict) else {}
    if max_length is None and isinstance(task.get("max_length"), int):
        max_length = task["max_length"]
    if long_documents is None and isinstance(task.get("long_documents"), dict):
        try:
            long_documents = LongDocumentsConfig.model_validate(task["long_documents"])
        except ValidationError as error:  # written by finetune: only an edited file gets here
            raise UserError(
                f"{Path(folder) / HYPERPARAMETERS_FILE}: task.long_documents: {error.errors()[0]['msg']}"
            ) from None
    return DocumentReading.of(max_length, long_documents, task.get("both_orders") is True)


def step_checkpoint_dir(run_dir: Path, step: int, phase: str = TRAIN_PHASE) -> Path:
    """The folder of the periodic checkpoint taken after `step` optimizer steps of `phase` (the run's own training,
    or a phase before it, whose name the folder's starts with)."""
    prefix = "" if phase == TRAIN_PHASE else f"{phase}-"
    return Path(run_dir) / "checkpoints" / f"{prefix}step-{step:08d}"


def save_training_checkpoint(
    accelerator,
    model,
    tokenizer,
    directory: Path,
    recipe,
    state: TrainingState,
    keep: int,
    attachments: dict[str, Path] | None = None,
) -> Path:
    """A Hugging Face checkpoint plus everything needed to resume; call on every process. Returns its folder.

    Every process saves its own random-number state through accelerate and its share of `state` (see
    training/state.py); the main process writes the model folder, progress.json and a copy of each existing
    `attachments` folder (hard links where the file system allows: saved folders are only ever replaced, never
    changed in place), renames the folder into place and prunes old checkpoints. A failed write on any process
    (a full disk) removes the partial folder and raises RunFailed on every process; the older checkpoints stay.
    """
    directory = Path(directory)
    partial, state_dir = partial_path(directory), partial_path(directory) / TRAINING_STATE_DIR
    main = accelerator.is_main_process

    def start() -> None:
        if main:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)

    def save_process_state() -> None:
        accelerator.save_state(str(state_dir), safe_serialization=True)
        state.write(state_dir, accelerator.process_index, main_process=False)

    def finish() -> None:
        if main:
            write_model(model, tokenizer, partial, recipe)
            for name, folder in (attachments or {}).items():
                if Path(folder).is_dir():
                    shutil.copytree(folder, state_dir / name, copy_function=_link_or_copy)
            state.write(state_dir, accelerator.process_index, main_process=True)
            commit_checkpoint(partial, directory)

    for phase in (start, save_process_state, finish):
        _run_on_every_process(accelerator, phase, directory, partial)
    if main:
        for old in training_checkpoints(directory.parent)[:-keep]:
            remove_checkpoint(old)
    return directory


def _run_on_every_process(accelerator, phase: Callable[[], None], directory: Path, partial: Path) -> None:
    """Run one phase of a save, then learn whether it failed on any process (a barrier that cannot hang)."""
    failure = None
    try:
        phase()
    except Exception as error:
        failure = error
    failed = failure is not None
    if accelerator.num_processes > 1:
        failed = accelerator.reduce(torch.tensor(float(failed), device=accelerator.device), reduction="sum").item() > 0
    if not failed:
        return
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    if failure is not None and not is_write_failure(failure):
        raise failure  # a bug, not the disk: keep its traceback
    raise save_failed(directory, failure) from None


def is_write_failure(error: BaseException) -> bool:
    """An error of the file system: OSError, or what safetensors and torch raise for a failed write."""
    return isinstance(error, OSError) or _is_disk_full(error)


def _is_disk_full(error: BaseException) -> bool:
    """A full disk or quota: by errno for OSError, by message for safetensors' and torch's own error types."""
    text = str(error)
    return (
        getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        or "No space left on device" in text
        or "StorageFull" in text
    )


def save_failed(directory: Path, error: BaseException | None) -> RunFailed:
    """One line for a failed save: the checkpoint, why, and the last complete checkpoint that was kept."""
    disk_full = error is not None and _is_disk_full(error)
    if error is None:
        reason = "the save failed on another process"
    elif disk_full:
        reason = "no space left on the device"
    else:
        reason = getattr(error, "strerror", None) or str(error)
    where = getattr(error, "filename", None)
    message = f"could not save the checkpoint {directory}: {reason}" + (f" (writing {where})" if where else "")
    # A periodic checkpoint's siblings, or the periodic checkpoints beside a run's final or best checkpoint.
    kept = training_checkpoints(directory.parent) or training_checkpoints(directory.parent / "checkpoints")
    if kept:
        message += f"; the last complete checkpoint, {kept[-1]}, is kept"
        if disk_full:
            message += " - free some space (or lower keep_checkpoints) and continue with --resume"
    elif disk_full:
        message += " - free some space and run again"
    return RunFailed(" ".join(message.split()))  # one line, whatever the library's message held


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def training_checkpoints(folder: Path) -> list[Path]:
    """Complete periodic checkpoints in `folder`, oldest first (a phase before the training's, then the training's):
    progress.json and all the weights are there."""
    if not Path(folder).is_dir():
        return []
    found = []
    for path in Path(folder).iterdir():
        match = _STEP_FOLDER.match(path.name)
        # The weights too: older versions deleted checkpoints in place, and a kill could leave progress.json alone.
        if match and (path / TRAINING_STATE_DIR / PROGRESS_FILE).is_file() and _has_weights(path):
            found.append((match.group(1) is None, int(match.group(2)), path))
    return [path for *_, path in sorted(found)]


def _has_weights(folder: Path) -> bool:
    """Whether all the weights of a model folder are there: model.safetensors (a LoRA adapter's file), or every
    shard its index names; of a multi-task checkpoint, every task's folder's."""
    if (folder / WEIGHTS_FILE).is_file() or (folder / ADAPTER_WEIGHTS_FILE).is_file():
        return True
    tasks = multitask_tasks(folder)
    if tasks is not None:
        return all(_has_weights(folder / entry["folder"]) for entry in tasks.values())
    index = folder / WEIGHTS_INDEX_FILE
    if not index.is_file():
        return False
    shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    return all((folder / shard).is_file() for shard in shards)


def latest_training_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete periodic checkpoint of a run, or None."""
    checkpoints = training_checkpoints(Path(run_dir) / "checkpoints")
    return checkpoints[-1] if checkpoints else None


def latest_run_checkpoint(run_dir: Path) -> Path | None:
    """What `--resume` of a stopped run folder goes on from: its newest periodic checkpoint, or of a self-training
    run the last round's (a finished round's checkpoint too: the next round starts from it); None: nothing."""
    found = latest_training_checkpoint(run_dir)
    for folder in reversed(round_folders(run_dir)):
        if found is not None:
            break
        found = latest_training_checkpoint(folder)
        if found is None and (folder / CHECKPOINT_DIR).is_dir():
            found = folder / CHECKPOINT_DIR
    return found


def copy_checkpoint(source: Path, directory: Path) -> Path:
    """A finished checkpoint folder copied to `directory` (hard links where the file system allows: checkpoint files
    are only ever replaced, never changed in place), put in place as every checkpoint is."""
    partial = partial_path(directory)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, copy_function=_link_or_copy)
    return commit_checkpoint(partial, directory)


def latest_sound_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `--resume` continues from: the newest complete periodic checkpoint whose files are whole.

    A newer one with a broken file (cut short, or not parsing: models/checkpoint_files.py) is skipped with one line
    naming the file and the checkpoint used instead; when every one is broken, a UserError names the newest's file.
    None when there is no complete checkpoint at all (the caller says why).
    """
    checkpoints = training_checkpoints(Path(run_dir) / "checkpoints")
    skipped: list[CheckpointError] = []
    for checkpoint in reversed(checkpoints):
        try:
            check_checkpoint_files(checkpoint, recursive=True)
        except CheckpointError as error:
            skipped.append(error)
            continue
        if skipped:
            more = f" (and {len(skipped) - 1} newer broken one(s))" if len(skipped) > 1 else ""
            console.print(
                f"--resume: skipping a broken checkpoint, {skipped[0]}{more}; resuming from the older {checkpoint}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return checkpoint
    if skipped:
        raise UserError(
            f"--resume: {skipped[0]}; no older complete checkpoint to resume from: start the run again with "
            "overwrite=true"
        )
    return None


def sweep_incomplete_checkpoints(run_dir: Path) -> None:
    """Clear what kills during saves and prunings left in RUN_DIR/checkpoints and beside RUN_DIR/checkpoint.

    `.partial` and `.deleting` folders go, and so do `step-N` folders that are no complete checkpoint (half
    deleted by older versions). A `.previous` folder goes if its replacement is in place, else it is the only
    complete copy (a kill between the renames of `commit_checkpoint`) and is put back. Call on the main process
    of a resuming run, while nothing else writes there.
    """
    run_dir, periodic = Path(run_dir), Path(run_dir) / "checkpoints"
    paths = list(periodic.iterdir()) if periodic.is_dir() else []
    paths += [run_dir / f"checkpoint{suffix}" for suffix in (PARTIAL, PREVIOUS, DELETING)]
    for path in paths:
        if path.suffix == PREVIOUS and path.is_dir():
            target = path.with_name(path.stem)
            if target.exists():
                remove_checkpoint(path)  # renamed first: never a half-deleted folder that could be put back
            else:
                path.rename(target)
        elif path.suffix in (PARTIAL, DELETING):
            shutil.rmtree(path, ignore_errors=True)  # no checkpoint's name: deleting them in place is safe
    complete = training_checkpoints(periodic)
    for path in list(periodic.iterdir()) if periodic.is_dir() else []:
        if _STEP_FOLDER.match(path.name) and path not in complete:
            remove_checkpoint(path)


def read_checkpoint_state(accelerator, checkpoint: Path) -> TrainingState:
    """This process's TrainingState of a periodic checkpoint (one of a newer format refused); nothing is restored:
    the caller learns the phase and position first, then `load_training_state` restores the rest."""
    return read_training_state(Path(checkpoint) / TRAINING_STATE_DIR, accelerator.process_index, accelerator.device)


def load_training_state(accelerator, checkpoint: Path, attachments: dict[str, Path] | None = None) -> None:
    """Restore model, optimizer and random states saved by `save_training_checkpoint` (its TrainingState read first,
    `read_checkpoint_state`): every optimizer prepared so far, in the order they were when it was saved.

    `attachments`: name -> folder to put back as it was at the checkpoint (removed if it did not exist then).
    """
    state_dir = Path(checkpoint) / TRAINING_STATE_DIR
    accelerator.load_state(str(state_dir))
    if accelerator.is_main_process:
        for name, folder in (attachments or {}).items():
            folder = Path(folder)
            if (state_dir / name).is_dir():
                partial = partial_path(folder)
                shutil.rmtree(partial, ignore_errors=True)
                shutil.copytree(state_dir / name, partial, copy_function=_link_or_copy)
                commit_checkpoint(partial, folder)
            else:
                remove_checkpoint(folder)
    accelerator.wait_for_everyone()
