"""The run directory: one folder holding everything a run produces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from finetune.errors import UserError
from finetune.recipes import recipe_to_yaml

RECIPE_FILE = "recipe.yaml"  # the resolved recipe, defaults filled in
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step or evaluation


def check_run_dir_free(recipe) -> None:
    """Refuse to mix a new run into the folder of an earlier one unless the recipe says `overwrite`."""
    path = Path(recipe.run_dir)
    if not recipe.overwrite and path.exists() and any(path.iterdir()):
        raise UserError(f"run_dir {path} already holds a run; set overwrite=true or choose another run_dir")


def prepare_run_dir(recipe, is_main_process: bool = True) -> Path:
    """Create the run directory (emptying it when `overwrite`) and save the resolved recipe.

    Stages call it once their inputs have been read, so a bad input leaves no folder behind.
    """
    path = Path(recipe.run_dir)
    if is_main_process:
        check_run_dir_free(recipe)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / RECIPE_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")
    return path


def check_resumable(recipe, latest_checkpoint) -> Path:
    """The checkpoint a `--resume` run continues from; the recipe must be the one the run started with."""
    path = check_same_recipe(recipe)
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise UserError(f"--resume: {path} has no complete periodic checkpoint yet (they are written every "
                        "checkpoint_every steps)")
    return checkpoint


def check_same_recipe(recipe) -> Path:
    """For `--resume`: the run directory, once its saved recipe equals `recipe` (else an error naming the keys)."""
    from finetune.recipes import load_recipe  # late import: recipes imports nothing from here

    path = Path(recipe.run_dir)
    if not (path / RECIPE_FILE).is_file():
        raise UserError(f"--resume: run_dir {path} holds no run to resume (no {RECIPE_FILE})")
    started = flatten_keys(load_recipe(path / RECIPE_FILE, check_paths=False).model_dump(mode="json"))
    given = flatten_keys(recipe.model_dump(mode="json"))
    changed = sorted(key for key in given.keys() | started.keys()
                     if key != "overwrite" and given.get(key) != started.get(key))
    if changed:
        raise UserError(f"--resume: the recipe differs from the one {path} was started with in: {', '.join(changed)}")
    return path


def flatten_keys(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested recipe dump as dotted keys: {"training.lr": 0.001, ...}."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class MetricsLog:
    """Appends JSON lines to metrics.jsonl; silent on every process but the main one."""

    def __init__(self, path: Path, enabled: bool = True, forward_to: Optional[Callable[[dict[str, Any]], None]] = None):
        self.path, self.enabled = path, enabled
        self.forward_to = forward_to  # also given every record: the experiment trackers (reporting/trackers.py)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            if self.forward_to is not None:
                self.forward_to(record)

    def line_count(self) -> int:
        """Records written so far (0 before the first)."""
        if not self.path.is_file():
            return 0
        with open(self.path, encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())

    def truncate(self, lines: int) -> None:
        """Keep the first `lines` records: a resumed run drops what was logged after its checkpoint."""
        if self.enabled and self.path.is_file():
            with open(self.path, encoding="utf-8") as handle:
                kept = [line for line in handle if line.strip()][:lines]
            self.path.write_text("".join(kept), encoding="utf-8")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
