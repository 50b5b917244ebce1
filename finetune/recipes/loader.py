"""Reading a recipe: YAML, dotted `key=value` overrides, validation, input and output path checks, and the one-line
errors that name the key and the file."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from finetune.console import console
from finetune.errors import UserError
from finetune.kinds.multilabel.recipe import FORMER_NAMES
from finetune.recipes.base import ECHO, MustExist, RunRecipe
from finetune.recipes.describe import KeyField, key_fields
from finetune.recipes.evaluation import EvalRecipe
from finetune.recipes.finetune import FinetuneRecipe
from finetune.recipes.flow_sections import FLOW_SET_KEYS
from finetune.recipes.intermediate import IntermediateRecipe
from finetune.recipes.language_models import MODEL_FAMILIES
from finetune.recipes.multitask import MultiTaskRecipe, multitask_key_fields, multitask_location
from finetune.recipes.other_names import OTHER_TOOLS_NAMES
from finetune.recipes.pretrain import PretrainRecipe
from finetune.recipes.task import TASK_KINDS, TASK_SECTIONS, task_kind
from finetune.recipes.ulmfit import UlmfitRecipe
from finetune.safe_yaml import YAMLProblem, load_yaml

Recipe = PretrainRecipe | FinetuneRecipe | EvalRecipe | UlmfitRecipe | IntermediateRecipe | MultiTaskRecipe
RECIPE_TYPES: dict[str, type[Recipe]] = {
    "pretrain": PretrainRecipe,
    "finetune": FinetuneRecipe,
    "eval": EvalRecipe,
    "ulmfit": UlmfitRecipe,
    "intermediate": IntermediateRecipe,
    "multitask": MultiTaskRecipe,
}


_OVERRIDE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)=(.*)$", re.DOTALL)


def load_yaml_file(path: Path, what: str) -> Any:
    """A YAML file of the user's (`what`: recipe, space, ...) through the strict safe loader; a missing file, a YAML
    problem or text that is not UTF-8 is a one-line UserError naming `what`, the file and the line."""
    if not path.is_file():
        raise UserError(f"{what} {path}: no such file")
    try:
        return load_yaml(path.read_text(encoding="utf-8"))
    except YAMLProblem as problem:
        where = f" line {problem.line}" if problem.line is not None else ""
        raise UserError(f"{what} {path}{where}: {problem.problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {path}: not UTF-8 text") from None


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a recipe file with the strict safe loader (finetune/safe_yaml.py); any problem is a one-line UserError."""
    if path.is_dir():
        raise UserError(f"recipe {path}: a folder, not a file")
    data = load_yaml_file(path, "recipe")
    if not isinstance(data, dict):
        raise UserError(f"recipe {path}: expected a mapping of keys at the top level")
    return data


def apply_override(data: dict[str, Any], override: str, source: Path) -> None:
    """Set one dotted `key=value` in the raw recipe; the value is parsed as YAML (`[1, 2]`, `true`, `1e-3`)."""
    match = _OVERRIDE.match(override)
    if not match:
        raise UserError(f"override '{_shortened(override)}': expected key=value, e.g. training.lr=1e-3")
    key, raw_value = match.groups()
    try:
        value = load_yaml(raw_value) if raw_value.strip() else ""
    except YAMLProblem as problem:
        # Never fall back to the raw text: `run_dir=x/[oops` would quietly name a folder `[oops`.
        raise UserError(
            f"override '{_shortened(override)}': the value is not valid YAML ({problem.problem}); "
            f"quote it to mean the text itself: {key}='{_shortened(raw_value)}'"
        ) from None
    set_key(data, key, value, source)


def set_key(data: dict[str, Any], key: str, value: Any, source: Path) -> None:
    """Set one dotted key of the raw recipe to `value` (sections made on the way), as an override does."""
    node: Any = data
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        child = _item(node, part) if isinstance(node, list) else node.setdefault(part, {})
        if not isinstance(child, (dict, list)) or (isinstance(child, list) and not parts[depth + 1].isdigit()):
            raise UserError(f"recipe {source}: override '{key}': '{'.'.join(parts[: depth + 1])}' is not a section")
        node = child
    if isinstance(node, list):  # a list's item by its place (tasks.0.name)
        node[_place(node, parts[-1], key, source)] = value
    else:
        node[parts[-1]] = value


def _item(items: list, part: str) -> Any:
    """A list's item by its place in a dotted key (tasks.1), or None where there is none."""
    return items[int(part)] if part.isdigit() and int(part) < len(items) else None


def _place(items: list, part: str, key: str, source: Path) -> int:
    if not (part.isdigit() and int(part) < len(items)):
        raise UserError(f"recipe {source}: override '{key}': the list has {len(items)} item(s), counted from 0")
    return int(part)


def recipe_key_fields(stage: str) -> list[KeyField]:
    """Every dotted key a recipe of `stage` may hold with its field, once per model family or task kind it belongs to
    (a flow's sections, ulmfit's and intermediate's: their stage's keys; what `finetune recipes --keys` lists)."""
    from finetune.recipes.intermediate import INTERMEDIATE_SECTIONS
    from finetune.recipes.ulmfit import ULMFIT_STAGE_FOLDERS, PretrainedLanguageModel

    if stage == "intermediate":  # its own keys, and each section's: a finetune recipe's
        fields = [KeyField(name, field, ()) for name, field in IntermediateRecipe.model_fields.items()
                  if name not in INTERMEDIATE_SECTIONS]  # fmt: skip
        for section in INTERMEDIATE_SECTIONS:
            fields += _section_fields(section, "finetune", ("model.checkpoint",) if section == "target" else ())
        return fields
    if stage == "multitask":
        return multitask_key_fields(recipe_key_fields("finetune"))
    if stage != "ulmfit":
        return key_fields(RECIPE_TYPES[stage])
    fields = [
        KeyField(name, field, ())
        for name, field in UlmfitRecipe.model_fields.items()
        if name not in ULMFIT_STAGE_FOLDERS
    ]
    fields += [field for field in recipe_key_fields("finetune") if field.key.startswith("task.")]  # stage 3's task
    fields.append(KeyField("general_lm.checkpoint", PretrainedLanguageModel.model_fields["checkpoint"], ()))
    for section in ULMFIT_STAGE_FOLDERS:
        fields += _section_fields(section, "finetune" if section == "classifier" else "pretrain")
    return fields


def _section_fields(section: str, stage: str, wired: tuple[str, ...] = ()) -> list[KeyField]:
    """The keys of a flow's section, the body of a `stage` recipe, without those the flow sets (FLOW_SET_KEYS and
    `wired`), each under `section.`."""
    return [
        KeyField(f"{section}.{key}", field, tuple((f"{section}.{tag}", value) for tag, value in variant))
        for key, field, variant in recipe_key_fields(stage)
        if key not in FLOW_SET_KEYS + wired
    ]


def recipe_keys(stage: str) -> list[str]:
    """Every dotted key a recipe of `stage` may hold, each once."""
    return list(dict.fromkeys(field.key for field in recipe_key_fields(stage)))


def suggested_key(key: str, stage: str) -> str | None:
    """The known key an unknown `key` most likely meant: another tool's name for a key of the same section, a close
    spelling in the same section, or the same name in another section (the nearest one); None when nothing is near."""
    if stage not in RECIPE_TYPES:
        return None
    known = recipe_keys(stage)
    parent, _, name = key.rpartition(".")
    siblings = {
        candidate.rpartition(".")[2]: candidate for candidate in known if candidate.rpartition(".")[0] == parent
    }
    meant = OTHER_TOOLS_NAMES.get(name.lower(), name)
    if meant in siblings:
        return siblings[meant]
    close = difflib.get_close_matches(name, list(siblings), n=1, cutoff=0.7)
    if close:
        return siblings[close[0]]
    elsewhere = [candidate for candidate in known if candidate.rpartition(".")[2] in (name, meant)]
    if not elsewhere:
        return None
    # commonprefix of two lists of key parts: the parts they share from the start, compared whole (not by character)
    shared = [len(os.path.commonprefix([candidate.split("."), key.split(".")])) for candidate in elsewhere]  # noqa: RUF071
    nearest = [candidate for candidate, count in zip(elsewhere, shared) if count == max(shared)]
    return nearest[0] if len(nearest) == 1 else None


def _format_validation_error(error: ValidationError, source: Path, stage: str = "") -> str:
    """All problems of a recipe on one line, each naming its dotted key; a value that none of a key's alternative
    types takes (`list[str] | dict[...]`, `float | Literal['dev']`) is one problem listing them."""
    problems: dict[object, tuple[str, list[str], str]] = {}  # -> (key, what each alternative wanted, what was got)
    for number, item in enumerate(error.errors()):
        key, message, got, alternative = _problem(item, stage)
        copied = next((key.removeprefix(prefix) for prefix in FLOW_TASK_COPIES if key.startswith(prefix)), None)
        if copied is not None and any(known == copied for known, _, _ in problems.values()):
            continue  # an ulmfit flow's top-level task, reported once rather than again in each section it fills
        if (key, [message], got) in problems.values():
            continue  # a shared key of a multitask recipe, reported once rather than once per task
        if alternative and (key, "alternatives") in problems:
            problems[key, "alternatives"][1].append(message.removeprefix("Input should be "))
        else:
            problems[(key, "alternatives") if alternative else number] = (key, [message], got)
    lines = [
        f"{key}: {' or '.join(wanted)}{got}" if key else " or ".join(wanted) for key, wanted, got in problems.values()
    ]
    return _shortened(f"recipe {source}: " + "; ".join(lines), MAX_ERROR_LENGTH)


# How pydantic names the member of a union (`int | None`, `list[str] | dict[...]`) an error is about in its location:
# never a recipe key (keys are names; a mapping's own keys, e.g. eval's model names, may hold "-" but no "[").
_TYPE_TAG = re.compile(
    r"^(str|int|float|bool|none|(constrained|function|lax-or-strict|json-or-python|is-instance)-.*|.*\[.*)$"
)


def _problem(item: Any, stage: str) -> tuple[str, str, str, bool]:
    """One pydantic error as (dotted key, message, " (got VALUE)" or "", whether it is one alternative of a union)."""
    # A model section is validated as its family's type, a task section as its kind's; pydantic puts that tag in
    # the location, and the member type of any other union too.
    loc = item["loc"]
    tags = {index: loc[index] for index in range(1, len(loc)) if _is_union_tag(loc[index - 1], loc[index])}
    members = {index for index, part in enumerate(loc) if isinstance(part, str) and _TYPE_TAG.match(part)}
    location = [part for index, part in enumerate(loc) if index not in tags and index not in members]
    if stage == "multitask":  # each task is a finetune recipe of the shared keys: named as the user wrote them
        location = multitask_location(location)
    key = ".".join(str(part) for part in location)  # empty for checks of the whole recipe: they name their keys
    message, got = item["msg"].removeprefix("Value error, "), ""
    if item["type"] == "union_tag_invalid":
        key, message = _unknown_tag(key, item["ctx"]["tag"])
    elif item["type"] == "extra_forbidden" and (kind := _owned_elsewhere(location, tags)) is not None:
        message = kind
    elif item["type"] == "extra_forbidden":
        nearest = suggested_key(key, stage)
        message = "unknown key" + (f"; did you mean {nearest}?" if nearest else "")
    elif item["type"] == "missing":
        message = "required key is missing"
    elif "input" in item and not isinstance(item["input"], (dict, list)):
        got = f" (got {ECHO.repr(item['input'])})" + _quote_hint(item)
    if item["type"] == "path_type":  # pydantic's own words name a Python class: "not a valid path for <class ...>"
        message = "Input should be a path (text)"
    return key, message, got, bool(members)


def _quote_hint(item: Any) -> str:
    """For a number where text is read: how to give it as text (YAML reads `name: 1.10` as the number 1.1, so a number
    is never taken for text silently)."""
    value = item["input"]
    if item["type"] == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return "; quote a number meant as text"
    return ""


def _say_when_the_kind_is_another(task: Any, path: Path) -> None:
    """A task written as kind classification without labels (what recipes, and the recipes saved with checkpoints,
    wrote for a score task before kind regression) is read as regression: said, not done silently."""
    written = task.get("kind") if isinstance(task, dict) else None
    if written is not None and task_kind(task) != written:
        console.print(
            f"recipe {path}: task.kind: {written} without labels is read as kind {task_kind(task)}, a score per "
            f"example (how recipes, and those saved with checkpoints, wrote it before kind {task_kind(task)}); "
            f"a recipe of yours may say kind: {task_kind(task)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _say_when_a_metric_is_respelled(metric: Any, path: Path) -> None:
    """metric_for_best: micro_f1 (a multi-label score's name before 0.2.0) is read as f1_micro: said."""
    if isinstance(metric, str) and metric in FORMER_NAMES:
        console.print(
            f"recipe {path}: metric_for_best: {metric} is read as {FORMER_NAMES[metric]} (every kind spells its "
            "scores as scikit-learn does since 0.2.0); a recipe of yours may say the new name",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _is_union_tag(section: object, part: object) -> bool:
    """Whether `part` of an error's location is the tag of a section validated as one of several (model, task)."""
    return (section == "model" and part in MODEL_FAMILIES) or (section == "task" and part in TASK_SECTIONS)


def _unknown_tag(key: str, tag: str) -> tuple[str, str]:
    """The key and message of a section whose family (model) or kind (task) is none of those there are."""
    if key.rpartition(".")[2] == "task" or re.fullmatch(r"tasks\.\d+", key):  # a multitask recipe's tasks.N
        return f"{key}.kind", f"unknown task kind {tag} (expected {', '.join(TASK_KINDS)})"
    return f"{key}.family", f"unknown model family {tag} (expected {', '.join(MODEL_FAMILIES)})"


def _owned_elsewhere(location: list, tags: dict) -> str | None:
    """For a task key its kind lacks but another kind has: which kinds it belongs to; else None (an unknown key)."""
    kind = next((str(tag) for tag in tags.values() if tag in TASK_SECTIONS), None)
    owners = [other for other, section in TASK_SECTIONS.items() if location[-1] in section.model_fields]
    return f"not for kind {kind} (a key of kind {', '.join(owners)})" if kind and owners else None


FLOW_TASK_COPIES = ("target_lm.corpus.", "classifier.")  # where an ulmfit flow's top-level `task` is copied to


MAX_ERROR_LENGTH = 600  # characters of a whole error line


def _shortened(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters with an ellipsis: errors echo what the user gave, never without bound."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def input_path_problems(section: BaseModel, prefix: str = "") -> list[tuple[str, Path, str]]:
    """(dotted key, path, problem) for every input path field (also inside lists and sub-sections) that is missing or of
    the wrong kind: a folder where a file is read, or a file where a folder is."""
    problems = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            problems += input_path_problems(value, key + ".")
            continue
        kind = _input_path_kind(field)
        if value is None or kind is None:
            continue
        for path in value if isinstance(value, list) else [value]:
            path = Path(path)
            if not path.exists():
                problems.append((key, path, f"no such {kind}: {path}"))
            elif kind == "file" and not path.is_file():
                problems.append(
                    (key, path, f"{path} is a folder, not a file" if path.is_dir() else f"{path}: not a regular file")
                )
            elif kind == "folder" and not path.is_dir():
                problems.append((key, path, f"{path} is a file, not a folder"))
    return problems


def _input_path_kind(field: Any) -> str | None:
    """ "file" or "folder" for `InputFile`/`InputFolder` fields (also optional or in a list), else None."""
    metadata = list(field.metadata)
    for argument in getattr(field.annotation, "__args__", ()):
        metadata += getattr(argument, "__metadata__", ())
    return next((meta.kind for meta in metadata if isinstance(meta, MustExist)), None)


def output_folder_problem(path: Path) -> str | None:
    """Why a folder a run writes into (run_dir, a cache) cannot be used, or None: it is a file, lies inside a
    file, or it (or the folder it would be created in) cannot be written."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    existing = next(folder for folder in (path, *path.absolute().parents) if folder.exists())
    if not existing.is_dir():
        return f"{path} would be inside {existing}, which is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable" + ("" if existing == path else f" (needed to create {path})")
    return None


def run_dir_location_problem(run_dir: Path) -> str | None:
    """Why `run_dir` may never be a run directory, or None: the working folder, a folder above it, the home folder
    (or one above it) or the root would put a run's files, and what `overwrite` removes, among the user's own."""
    if str(run_dir).strip() in ("", "."):
        return "empty or '.': give a folder of its own, e.g. runs/NAME"
    resolved = Path(run_dir).expanduser().resolve()
    working, home = Path.cwd().resolve(), Path.home().resolve()
    if resolved == working or resolved in working.parents:
        return f"{run_dir} is the working folder or a folder above it: give a folder of its own, e.g. runs/NAME"
    if resolved == home or resolved in home.parents:
        return f"{run_dir} is the home folder or a folder above it: give a folder of its own"
    return None


HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # a hub model's name: `model` or `org/model`
MODEL_FOLDER_KEYS = ("checkpoint", "backward_checkpoint")  # the model section's keys that name a model to read


def missing_model_folder(name: str) -> bool:
    """Whether checkpoint `name` is no folder here and cannot be a hub name either (a path: `./lm`, `runs/a/b`)."""
    path = Path(name)
    return not path.is_dir() and (path.exists() or not HUB_NAME.match(name))


def model_folder_problems(recipe: RunRecipe) -> list[tuple[str, str]]:
    """(key, problem) for each model.checkpoint (or backward_checkpoint) that names a local folder that is not there:
    known from the recipe alone, before the model libraries load. Not for the stages of a ulmfit flow, whose
    checkpoints the flow writes (their recipes are checked with `path_problems` only)."""
    model = getattr(recipe, "model", None)
    names = [(f"model.{key}", getattr(model, key, None)) for key in MODEL_FOLDER_KEYS]
    return [(key, f"no such model folder: {name}") for key, name in names if name and missing_model_folder(name)]


def path_problems(recipe: RunRecipe) -> list[tuple[str, str]]:
    """(key, problem) for every path of a recipe that cannot be used: inputs missing or of the wrong kind, output
    folders that cannot be written, a run_dir that would mix a run into the user's own folders."""
    problems = [(key, problem) for key, _, problem in input_path_problems(recipe)]
    outputs = [("run_dir", recipe.run_dir)]
    corpus = getattr(recipe, "corpus", None)
    if corpus is not None and corpus.cache_dir is not None:
        outputs.append(("corpus.cache_dir", corpus.cache_dir))
    location = run_dir_location_problem(recipe.run_dir)
    if location is not None:
        problems.append(("run_dir", location))
    problems += [(key, problem) for key, path in outputs if (problem := output_folder_problem(path)) is not None]
    return problems


def load_recipe(
    path: Path | str, overrides: Sequence[str] = (), expected_stage: str | None = None, check_paths: bool = True
) -> Recipe:
    """Load, override and validate a recipe; raise UserError naming the key and file on any problem."""
    path = Path(path)
    data = read_yaml(path)
    for override in overrides:
        apply_override(data, override, path)
    return recipe_from_data(data, path, expected_stage, check_paths)


def recipe_from_data(
    data: dict[str, Any], path: Path, expected_stage: str | None = None, check_paths: bool = True
) -> Recipe:
    """Validate a raw recipe (read from `path`, overrides applied); raise UserError naming the key and `path`."""
    stage = data.get("stage")
    if not isinstance(stage, str) or stage not in RECIPE_TYPES:  # a list or mapping cannot even be looked up
        raise UserError(f"recipe {path}: stage: expected one of {', '.join(RECIPE_TYPES)} (got {ECHO.repr(stage)})")
    if expected_stage is not None and stage != expected_stage:
        raise UserError(f"recipe {path}: stage: this is a '{stage}' recipe; run it with `finetune {stage}`")
    try:
        recipe = RECIPE_TYPES[stage].model_validate(data)
    except ValidationError as error:
        raise UserError(_format_validation_error(error, path, stage)) from None
    _say_when_the_kind_is_another(data.get("task"), path)
    _say_when_a_metric_is_respelled(data.get("metric_for_best"), path)
    if check_paths:
        for key, problem in path_problems(recipe):
            raise UserError(f"recipe {path}: {key}: {problem}")
    return recipe


def recipe_to_yaml(recipe: BaseModel) -> str:
    """The fully resolved recipe (defaults filled in) as YAML, as saved in the run directory."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
