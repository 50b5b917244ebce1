"""Every key of every stage's recipe, given a value of a YAML type its type does not take, is a one-line UserError that
names the key (issue 44): as a `key=value` override and written inside the recipe file, on a valid recipe of the
key's model family or task kind. The keys are those `finetune recipes --keys` lists (recipes/loader.py's
recipe_key_fields, built on recipes/describe.py's key_fields), so a key added later is covered without editing this."""

from __future__ import annotations

import copy
from pathlib import Path
from types import NoneType
from typing import Any, get_origin

import pytest
import yaml
from pydantic import BaseModel

import finetune.recipes  # noqa: F401  (first: finetune.kinds.recipe alone is imported halfway through it)
from finetune.errors import UserError
from finetune.kinds.recipe import GlueOrCustomSection
from finetune.recipes import TASK_SECTIONS
from finetune.recipes.base import type_members
from finetune.recipes.describe import KeyField
from finetune.recipes.loader import (
    RECIPE_TYPES,
    apply_override,
    load_recipe,
    recipe_from_data,
    recipe_key_fields,
    set_key,
)

SOURCE = Path("recipe.yaml")

# One value of each YAML type, as an override writes it and as the YAML parser reads it.
WRONG_VALUES: dict[str, tuple[str, Any]] = {
    "list": ("[gpt2]", ["gpt2"]),
    "mapping": ("{a: 1}", {"a": 1}),
    "integer": ("7", 7),
    "fraction": ("1.5", 1.5),
    "null": ("null", None),
    "boolean": ("true", True),
    "text": ("hello", "hello"),
}

# A valid task of each kind (paths are not checked here: no file is read); tests/kinds/test_registry.py builds each
# kind's spec from it too.
TASKS: dict[str, dict[str, Any]] = {
    "classification": {"name": "t", "data_dir": "d", "text_columns": ["s"], "label_column": "y", "labels": ["a", "b"]},
    "regression": {"kind": "regression", "name": "t", "data_dir": "d", "text_columns": ["s"], "label_column": "y"},
    "multilabel": {
        "kind": "multilabel",
        "name": "t",
        "data_dir": "d",
        "text_columns": ["s"],
        "label_column": "y",
        "labels": ["a", "b"],
    },
    "tokens": {"kind": "tokens", "name": "t", "data_dir": "d"},
    "choices": {"kind": "choices", "name": "t", "data_dir": "d"},
    "spans": {"kind": "spans", "name": "t", "data_dir": "d"},
}
# The kinds whose rows may come from a hub dataset (source hub): a GLUE task by name or a custom one (and None: a key
# of no task kind).
HUB_KINDS = (None, *(name for name, section in TASK_SECTIONS.items() if issubclass(section, GlueOrCustomSection)))
TRAIN = {"train_files": ["train.txt"]}
BASES: dict[str, dict[str, Any]] = {
    "pretrain": {"stage": "pretrain", "run_dir": "runs/t", "corpus": TRAIN},
    "finetune": {"stage": "finetune", "run_dir": "runs/t", "model": {"checkpoint": "c"}, "task": TASKS["regression"]},
    "eval": {"stage": "eval", "run_dir": "runs/t", "task": TASKS["regression"], "models": {"m": "c"}},
    "ulmfit": {
        "stage": "ulmfit",
        "run_dir": "runs/t",
        "task": TASKS["classification"],
        "general_lm": {"corpus": TRAIN},
        "target_lm": {},
        "classifier": {},
    },
    "intermediate": {
        "stage": "intermediate",
        "run_dir": "runs/t",
        "intermediate": {"model": {"checkpoint": "c"}, "task": TASKS["regression"]},
        "target": {"task": TASKS["regression"]},
    },
    "multitask": {
        "stage": "multitask",
        "run_dir": "runs/t",
        "model": {"checkpoint": "c"},
        "tasks": [TASKS["regression"], {**TASKS["regression"], "name": "t2"}],
    },
}
FLOW_SECTIONS = {"ulmfit": ("general_lm", "target_lm", "classifier"), "intermediate": ("intermediate", "target")}


def _accepted_types(field: Any) -> set[str]:
    """The YAML types a key's declared type takes (before its range is checked). A word that is none of a Literal's
    is refused like a value of the wrong type, so text counts as wrong for those keys too."""
    accepted = set()
    for member in type_members(field.annotation):
        origin = get_origin(member) or member
        if member is NoneType:
            accepted.add("null")
        elif member is bool or member is Any:
            accepted |= set(WRONG_VALUES) if member is Any else {"boolean"}
        elif member is int:
            accepted.add("integer")
        elif member is float:  # an int for a float key: `lr: 1` means 1.0
            accepted |= {"integer", "fraction"}
        elif member is str or (isinstance(origin, type) and issubclass(origin, Path)):
            accepted.add("text")
        elif origin in (list, tuple, set):
            accepted.add("list")
        elif origin is dict or (isinstance(member, type) and issubclass(member, BaseModel)):
            accepted.add("mapping")
    return accepted


def _section(data: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The mapping at a dotted section path, made on the way."""
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data.setdefault(part, {})
    return data


def _base(stage: str, key_field: KeyField) -> dict[str, Any]:
    """A valid recipe of `stage` in which `key_field`'s key is read: its model family or task kind, and the section
    around it where that is optional (an adapter needs a checkpoint, a corpus of a task no text files, ...)."""
    data = copy.deepcopy(BASES[stage])
    key = key_field.key
    for tag, value in key_field.variant:
        section = tag.rpartition(".")[0]
        if tag.endswith(".kind"):  # a task of that kind where the key is read
            set_key(data, section, copy.deepcopy(TASKS[value]), SOURCE)
        else:
            set_key(data, tag, value, SOURCE)
            if stage == "ulmfit":  # stage 2 continues stage 1's model: both of the family
                for other in ("general_lm", "target_lm"):
                    set_key(data, f"{other}.model.family", value, SOURCE)
    section_name = key.split(".")[0]
    prefix = section_name + "." if section_name in FLOW_SECTIONS.get(stage, ()) else ""
    if ".task." in f".{key}" and "corpus.task" in key:  # the corpus is a task's text, not files
        corpus = _section(data, f"{prefix}corpus")
        corpus.pop("train_files", None)
        corpus.setdefault("task", copy.deepcopy(TASKS["classification"]))
    if stage == "ulmfit" and (key.startswith(("classifier.task.", "target_lm.corpus.task."))):
        task = data.pop("task")  # given in the sections instead of at the top level
        _section(data, "classifier").setdefault("task", copy.deepcopy(task))
        _section(data, "target_lm.corpus").setdefault("task", copy.deepcopy(task))
    flow_wired = (stage == "ulmfit" and not key.startswith("general_lm.")) or key.startswith("target.")
    if ".adapter." in key and not flow_wired:  # a flow's later stage starts from the checkpoint the flow wires
        _section(data, f"{prefix}model").setdefault("checkpoint", "c")
    if key == "general_lm.checkpoint":  # the other form of general_lm: no stage 1
        data["general_lm"] = {"checkpoint": "c"}
    if ".hub." in key and dict(key_field.variant).get(key[: key.index(".hub.")] + ".kind") in HUB_KINDS:
        task = _section(data, key[: key.index(".hub.")])
        task.pop("data_dir", None)
        task.update(source="hub", hub={"name": "imdb"})
    return data


def _key_fields(stage: str) -> list[KeyField]:
    """The keys of `stage` with their variants; an ulmfit flow of the ngram family is never valid (stage 2 cannot
    continue a counted model), so its ngram keys are tried in the pretrain stage only."""
    fields = recipe_key_fields(stage)
    if stage == "multitask":  # a task's keys are listed under tasks.N: tried on the first task
        fields = [KeyField(field.key.replace("tasks.N.", "tasks.0."), field.field,
                           tuple((tag.replace("tasks.N", "tasks.0"), value) for tag, value in field.variant))
                  for field in fields]  # fmt: skip
    return [field for field in fields if stage != "ulmfit" or "ngram" not in dict(field.variant).values()]


def _cases(stage: str) -> list[tuple[KeyField, str]]:
    """(key, wrong YAML type) pairs. A flow's section's keys are a pretrain or finetune recipe's, whose classes the
    other stages' runs try with every wrong type; here the flow's wiring is tried with one wrong type per section key
    (every type for the flow's own keys), which keeps the test at seconds."""
    cases = []
    for key_field in _key_fields(stage):
        wrong = [kind for kind in WRONG_VALUES if kind not in _accepted_types(key_field.field)]
        in_a_section = key_field.key.split(".")[0] in FLOW_SECTIONS.get(stage, ())
        cases += [(key_field, kind) for kind in (wrong[:1] if in_a_section else wrong)]
    return cases


def _check(stage: str, key: str, load: Any) -> str | None:
    """None when loading fails with one line naming `key`, else what went wrong instead."""
    try:
        load()
    except UserError as error:
        message = str(error)
        if "\n" in message or "Traceback" in message:
            return f"more than one line: {message!r}"
        if f"{key}:" not in message and f"{key} " not in message:
            return f"does not name {key}: {message}"
        return None
    except Exception as error:  # the crash is what this test reports
        return f"crashed: {type(error).__name__}: {error}"
    return "accepted"


@pytest.mark.parametrize("stage", list(RECIPE_TYPES))
def test_the_bases_are_valid_recipes(stage):
    # Each base and variant loads: a wrong value is then the recipe's only problem.
    bases = {repr(_base(stage, key_field)): _base(stage, key_field) for key_field in _key_fields(stage)}
    problems = []
    for base in bases.values():
        try:
            recipe_from_data(copy.deepcopy(base), SOURCE, check_paths=False)
        except UserError as error:
            problems.append(f"{base}: {error}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stage", list(RECIPE_TYPES))
def test_a_value_of_a_wrong_type_is_one_line_naming_the_key(stage, tmp_path):
    failures = []
    for key_field, kind in _cases(stage):
        text, value = WRONG_VALUES[kind]
        key = key_field.key
        data = _base(stage, key_field)

        def overridden(data=data, key=key, text=text):
            data = copy.deepcopy(data)
            apply_override(data, f"{key}={text}", SOURCE)
            return recipe_from_data(data, SOURCE, check_paths=False)

        written = copy.deepcopy(data)
        set_key(written, key, value, SOURCE)
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(written), encoding="utf-8")

        def from_the_file(path=path):
            return load_recipe(path, check_paths=False)

        for how, load in (("override", overridden), ("in the file", from_the_file)):
            problem = _check(stage, key, load)
            if problem is not None:
                failures.append(f"{key}={text} ({how}, variant {dict(key_field.variant)}): {problem}")
    assert not failures, f"{len(failures)} wrong values not refused as they should be:\n" + "\n".join(failures[:40])
    assert _cases(stage), "no key was tried"


def test_the_issue_case_and_its_message():
    data = copy.deepcopy(BASES["pretrain"])
    apply_override(data, "model.family=[gpt2]", SOURCE)
    with pytest.raises(UserError, match=r"model\.family: unknown model family \['gpt2'\]"):
        recipe_from_data(data, SOURCE, check_paths=False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.epochs=true", "training.epochs: expected a number, not true or false"),
        ("training.lr=yes", "training.lr: expected a number, not true or false"),
        ("training.compile=1", "training.compile: expected true or false (got 1)"),
        ("training.compile='false'", "training.compile: expected true or false (got 'false')"),
        ("training.adam_betas=[0.9, true]", "training.adam_betas: item 2: expected a number, not true or false"),
        ("description=7", "description: Input should be a valid string (got 7); quote a number meant as text"),
        ("run_dir=[runs]", "run_dir: Input should be a path (text)"),
        ("corpus.dataset_files=7", "corpus.dataset_files: Input should be a valid list or a valid dictionary (got 7)"),
    ],
)
def test_lax_conversions_are_refused(override, message):
    # pydantic alone would read true as 1, 1 as true and "false" as false; a number for text is refused with a hint;
    # a path and a key of alternative types say what they take in the words of a recipe
    data = copy.deepcopy(BASES["pretrain"])
    apply_override(data, override, SOURCE)
    with pytest.raises(UserError) as error:
        recipe_from_data(data, SOURCE, check_paths=False)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("override", "read"), [("training.lr=1", 1.0), ("training.lr=1e-3", 1e-3), ("training.mixed_precision=no", "no")]
)
def test_what_a_user_means_is_still_read(override, read):
    # an int for a float key, PyYAML's text `1e-3`, and YAML's `no` (false) for the word no of mixed_precision
    data = copy.deepcopy(BASES["pretrain"])
    apply_override(data, override, SOURCE)
    recipe = recipe_from_data(data, SOURCE, check_paths=False)
    key = override.split("=")[0].split(".")[1]
    assert getattr(recipe.training, key) == read
