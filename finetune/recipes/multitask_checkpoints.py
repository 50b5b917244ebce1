"""A multi-task checkpoint folder (`finetune multitask`'s RUN_DIR/checkpoint): one Hugging Face checkpoint per task
(TASK/, the shared encoder with that task's head) and multitask.json, which lists them. Each task's folder is a
fine-tuned checkpoint like any `finetune finetune` writes, so every command takes it as it is; the folder above
it is resolved to a task's by `task_checkpoint` wherever a command knows which task it means."""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_FILE = "multitask.json"


def multitask_tasks(folder: str | Path) -> dict[str, dict] | None:
    """Task name -> its entry (kind, folder) of a multi-task checkpoint folder; None for any other folder."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        tasks = json.loads(path.read_text(encoding="utf-8")).get("tasks")
    except (OSError, ValueError, AttributeError):
        return None
    return {entry["name"]: entry for entry in tasks} if isinstance(tasks, list) else None


def task_checkpoint(folder: str, task: str) -> str:
    """`folder` itself, or where it is a multi-task checkpoint, its task `task`'s checkpoint; a ValueError naming the
    tasks it has where it has no head for `task`."""
    tasks = multitask_tasks(folder)
    if tasks is None:
        return folder
    if task not in tasks:
        raise ValueError(
            f"{folder} is a multi-task checkpoint without a head for task '{task}' (it has {', '.join(tasks)})"
        )
    return str(Path(folder) / tasks[task]["folder"])
