"""A recipe as a command or a Python call gives it: a file, a shipped recipe's name or a dict, with overrides as
`key=value` texts or a mapping of dotted keys; loaded, overridden and checked for the command's stage in one place."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.recipes.loader import (
    Recipe,
    apply_override,
    model_folder_problems,
    path_problems,
    read_yaml,
    recipe_from_data,
    set_key,
)
from finetune.recipes.shipped import resolve_recipe
from finetune.tasks.specs import DATA_DIR

Overrides = Sequence[str] | Mapping[str, Any] | None
DICT_SOURCE = Path("<recipe dict>")  # what messages name for a recipe given as a dict


def load_given_recipe(
    recipe: Path | str | Mapping[str, Any],
    overrides: Overrides = None,
    command: str = "",
    accepted_stages: tuple[str, ...] | None = None,
    data_in_run_dir: bool = False,
) -> Recipe:
    """The recipe, overridden and validated, for `command` (`finetune COMMAND`): its own stage, or one of
    `accepted_stages` where the command takes others (lr-find: pretrain and finetune).

    `data_in_run_dir`: the task reads rows about to be written to RUN_DIR/data (data/run_data.py), whatever its
    data_dir or source said; that folder need not exist yet.
    """
    if isinstance(recipe, Mapping):
        source, data = DICT_SOURCE, copy.deepcopy(dict(recipe))
    else:
        source = resolve_recipe(recipe)
        data = read_yaml(source)
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            set_key(data, str(key), value, source)
    elif isinstance(overrides, str):
        raise UserError(f"overrides: a list of key=value texts or a dict of keys, not one text ({overrides!r})")
    else:
        for override in overrides or ():
            apply_override(data, override, source)
    data = paths_as_text(data)
    if data_in_run_dir and isinstance(data.get("task"), dict):
        data["task"].update(data_dir=str(Path(str(data.get("run_dir", ""))) / DATA_DIR), source="files", hub=None)
    expected_stage = None if accepted_stages or not command else command
    loaded = recipe_from_data(data, source, expected_stage, check_paths=False)
    for key, problem in path_problems(loaded) + model_folder_problems(loaded):
        if not (data_in_run_dir and key == "task.data_dir"):
            raise UserError(f"recipe {source}: {key}: {problem}")
    if accepted_stages and loaded.stage not in accepted_stages:
        raise UserError(
            f"{recipe if source is not DICT_SOURCE else source}: `finetune {command}` takes a "
            f"{' or '.join(accepted_stages)} recipe; this one's stage is '{loaded.stage}'"
        )
    return loaded


def paths_as_text(value: Any) -> Any:
    """`value` with every os.PathLike in it (a pathlib.Path a notebook passes) as its text: a recipe read from YAML
    holds text, and keys such as model.checkpoint take a folder or a hub name alike, so they are typed as text."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {key: paths_as_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [paths_as_text(item) for item in value]
    return value
