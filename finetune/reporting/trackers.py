"""Experiment trackers through accelerate's own integrations (tensorboard, wandb, mlflow, ...).

`training.log_with` names them; accelerate creates them (`Accelerator(log_with=..., project_dir=run_dir)`),
and every record written to metrics.jsonl is also sent to them (`MetricsLog(forward_to=...)`). No
tracker needs code here: whatever accelerate supports is reachable by its name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.run_dir import flatten_keys

TRACKER_PROJECT = "trackers"  # accelerate's project name: tensorboard writes to RUN_DIR/trackers/


def check_trackers_installed(requested: list[str]) -> None:
    """accelerate drops a tracker whose package is missing with a mere warning; a recipe that names one is an error."""
    from accelerate.tracking import get_available_trackers

    installed = {getattr(tracker, "value", str(tracker)) for tracker in get_available_trackers()}
    missing = [name for name in requested if name != "all" and name not in installed]
    if missing:
        raise UserError(
            f"training.log_with: {', '.join(missing)} is not installed in this environment "
            f"(pip install {' '.join(missing)})"
        )


def tracker_config(recipe) -> dict[str, Any]:
    """The resolved recipe as flat dotted keys with scalar values, as trackers store hyperparameters."""
    flat = flatten_keys(recipe.model_dump(mode="json"))
    return {
        key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value) for key, value in flat.items()
    }


def tracker_values(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record as tracker scalars: `train/loss`, `train/lr/group_0`, `eval/dev_accuracy`, ..."""
    phase = record.get("phase", "record")
    values = {}
    for key, value in record.items():
        if key in ("phase", "step"):  # the step is the x axis; the phase is the name's prefix
            continue
        if isinstance(value, dict):
            values.update(
                {
                    f"{phase}/{key}/{name}": float(inner)
                    for name, inner in value.items()
                    if isinstance(inner, (int, float))
                }
            )
        elif isinstance(value, (int, float)):  # bools (best_so_far) become 0/1
            values[f"{phase}/{key}"] = float(value)
    return values


def start_trackers(accelerator, recipe, run_dir: Path) -> Callable[[dict[str, Any]], None] | None:
    """Start the recipe's trackers with its hyperparameters; returns what sends a record to them (None: none)."""
    if not accelerator.log_with:
        return None
    accelerator.init_trackers(TRACKER_PROJECT, config=tracker_config(recipe))

    def send(record: dict[str, Any]) -> None:
        accelerator.log(tracker_values(record), step=record.get("step"))

    return send


def finish_trackers(accelerator) -> None:
    """Close the trackers (flushes their files).

    Not `accelerator.end_training()`: that also destroys the process group, which the next seed of a
    multi-seed run under `torchrun` still needs.
    """
    if accelerator.is_main_process:
        for tracker in accelerator.trackers:
            tracker.finish()
    accelerator.trackers = []
