"""The run directory: one folder holding everything a run produces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

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


class MetricsLog:
    """Appends JSON lines to metrics.jsonl; silent on every process but the main one."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.enabled = path, enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
