"""The recipes that come with finetune, found wherever it runs, and a command's recipe argument: a path or a name.

A shipped recipe is named by its path under recipes/ without `.yaml`: `finetune/minilm-sst2-lora`. The repository
keeps one copy of them, the top-level recipes/; a wheel carries them as finetune/shipped_recipes/ (setup.py copies
them there). Only where the file is read from changes: the relative paths inside a recipe (data/quickstart/...,
../shared/data/...) are still read from the folder the command runs in, as for any recipe.
"""

from __future__ import annotations

import difflib
import shlex
from pathlib import Path

from finetune.errors import UserError

PACKAGED_FOLDER = Path(__file__).resolve().parent.parent / "shipped_recipes"  # an installed wheel's copy
CHECKOUT_FOLDER = Path(__file__).resolve().parent.parent.parent / "recipes"  # a checkout's (and an editable install's)
SUFFIXES = (".yaml", ".yml")


def recipes_root() -> Path:
    """The folder of the shipped recipes: the wheel's copy inside the package, else the checkout's recipes/."""
    for folder in (PACKAGED_FOLDER, CHECKOUT_FOLDER):
        if folder.is_dir():
            return folder
    # Only a broken install gets here (a wheel built without setup.py's hook, a checkout without recipes/).
    raise UserError(f"no shipped recipes: neither {PACKAGED_FOLDER} nor {CHECKOUT_FOLDER} exists; reinstall finetune")


def shipped_recipes() -> dict[str, Path]:
    """Every shipped recipe by name (`finetune/minilm-sst2-lora`), in name order."""
    root = recipes_root()
    return {path.relative_to(root).with_suffix("").as_posix(): path for path in sorted(root.rglob("*.yaml"))}


def recipe_name(text: str) -> str:
    """The shipped name `text` means: a leading recipes/ and a .yaml suffix are optional, as in the docs' paths."""
    name = text.replace("\\", "/").strip().removeprefix("./").removeprefix("recipes/")
    return next((name.removesuffix(suffix) for suffix in SUFFIXES if name.endswith(suffix)), name)


def shipped_recipe(text: str) -> Path:
    """The file of the shipped recipe named `text`; an unknown name is a UserError naming the closest ones."""
    recipes = shipped_recipes()
    name = recipe_name(text)
    if name in recipes:
        return recipes[name]
    raise UserError(f"no shipped recipe {text}{_closest(name, list(recipes))} (`finetune recipes` lists them)")


def resolve_recipe(argument: Path | str) -> Path:
    """A command's recipe argument as a file: a path that exists is that path (a folder too: the loader says it is
    one); otherwise the shipped recipe of that name. Neither is a UserError that names the closest shipped names."""
    path = Path(argument)
    if path.exists():
        return path
    recipes = shipped_recipes()
    name = recipe_name(str(argument))
    if name in recipes:
        return recipes[name]
    raise UserError(
        f"recipe {argument}: no such file, nor a shipped recipe of that name{_closest(name, list(recipes))} "
        "(`finetune recipes` lists them)"
    )


def _closest(name: str, names: list[str]) -> str:
    """'; did you mean A, B?' for the names nearest `name`: those that end in its last part (minilm-sst2-lora for
    finetune/minilm-sst2-lora), then close spellings; empty when none is near."""
    last = name.rpartition("/")[2]
    same_file = [candidate for candidate in names if candidate.rpartition("/")[2] == last]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    nearest = list(dict.fromkeys([*same_file, *close]))[:3]
    return f"; did you mean {', '.join(nearest)}?" if nearest else ""


def copy_recipe(text: str, destination: Path, force: bool = False) -> Path:
    """Copy the shipped recipe named `text` to `destination` (a file, or a folder to put it in) for the user to edit;
    return the file written. An existing file is kept unless `force`."""
    source = shipped_recipe(text)
    target = destination / source.name if destination.is_dir() else destination
    if target.is_dir():
        raise UserError(f"{target} is a folder")
    if target.exists() and not force:
        raise UserError(f"{target} exists; --force overwrites it")
    if not target.parent.is_dir():
        raise UserError(f"no such folder: {target.parent}")
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    # The first line is the command that runs the file (`# finetune finetune recipes/NAME.yaml`): in the copy, the
    # command that runs the copy.
    words = lines[0].split() if lines else []
    if len(words) == 4 and words[:2] == ["#", "finetune"]:
        lines[0] = f"# finetune {words[2]} {shlex.quote(str(target))}\n"
    target.write_text("".join(lines), encoding="utf-8")
    return target
