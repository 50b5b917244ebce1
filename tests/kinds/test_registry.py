"""The task kinds' table: every kind answers the contract, the recipes' sections (and the union mypy reads) and the
kinds' objects agree, an unknown kind and a key of another kind are one line naming the key. The kinds are the
table's: no list of them is written here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_type_hints

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.kinds.base import TaskKind
from finetune.kinds.fine_tuning import TaskFineTuning
from finetune.kinds.predictor import TaskPredictor
from finetune.kinds.recipe import GlueOrCustomSection
from finetune.kinds.registry import KINDS, kind_named, kind_of
from finetune.models.task_heads import kinds_with_a_head
from finetune.recipes import TASK_SECTIONS, describe_keys, load_recipe, task_config
from finetune.recipes.finetune import FinetuneRecipe
from finetune.tasks.specs import TaskSpec
from tests.conftest import one_error_line, write_yaml
from tests.recipes.test_wrong_types import TASKS

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
CONTRACT = ("evaluate", "predictor", "output_table", "card", "profile_model", "profile_description")


def test_every_kind_answers_the_contract():
    assert KINDS and list(KINDS) == list(TASK_SECTIONS)
    for name, kind in KINDS.items():
        assert isinstance(kind, TaskKind) and kind.name == name
        assert issubclass(kind.fine_tuning_class, TaskFineTuning)
        # Every hook the base leaves to a kind is the kind's own (the base's raise NotImplementedError).
        hooks = CONTRACT + (("class_probabilities",) if kind.section.self_trains else ())
        for hook in hooks:
            assert getattr(type(kind), hook) is not getattr(TaskKind, hook), f"{name} lacks {hook}"
        # Its predictor's type is the predictors' base: `finetune predict` asks it, never which kind it is.
        assert issubclass(get_type_hints(type(kind).predictor)["return"], TaskPredictor)


def test_the_recipes_sections_are_the_kinds_sections():
    assert {name: kind.section for name, kind in KINDS.items()} == TASK_SECTIONS
    for name, section in TASK_SECTIONS.items():
        assert section.kind_name == name and section.model_fields["kind"].default == name


def test_the_union_mypy_reads_is_the_recipes_sections():
    """recipes/task.py writes the sections' union out for mypy (it cannot read one built at run time): the same
    sections, in the table's order."""
    tree = ast.parse((ROOT / "finetune" / "recipes" / "task.py").read_text(encoding="utf-8"))
    checked = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    union = next(node.value for node in checked.body if isinstance(node, ast.Assign))
    assert ast.unparse(union) == " | ".join(section.__name__ for section in TASK_SECTIONS.values())


def test_each_kind_s_auto_class_is_its_sections_and_names_its_head():
    for name, kind in KINDS.items():
        assert kind.auto_class.__name__ == kind.section.auto_class_name
        # A config its Auto class has a model for can be fine-tuned for the kind (the refusals' list of kinds).
        config_class = next(iter(kind.auto_class._model_mapping.keys()))
        assert name in kinds_with_a_head(config_class())


def test_each_kind_builds_a_spec_of_its_own_kind(tmp_path):
    specs = {}
    for name, section in TASK_SECTIONS.items():
        specs[name] = spec = section(**{**TASKS[name], "kind": name, "data_dir": tmp_path}).spec()
        assert isinstance(spec, TaskSpec) and spec.kind == name and kind_of(spec) is KINDS[name]
    # What the lower layers ask of a spec instead of its kind's name: set by the kind.
    flags = {name: (spec.is_regression, spec.label_sets) for name, spec in specs.items()}
    assert flags["regression"] == (True, False) and flags["multilabel"] == (False, True)
    assert flags["classification"] == (False, False) and specs["spans"].problem_type is None


def test_an_unknown_kind_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(UserError, match=rf"^task.kind: unknown task kind 'ranking' \(expected {', '.join(KINDS)}\)$"):
        kind_named("ranking")
    recipe = write_yaml(
        tmp_path / "r.yaml",
        {"stage": "finetune", "run_dir": str(tmp_path / "run"), "model": {"checkpoint": "x"}, "task": {"name": "t"}},
    )
    text = recipe.read_text().replace("name: t", "name: t\n  kind: ranking")
    recipe.write_text(text)
    message = one_error_line(runner.invoke(app, ["finetune", str(recipe)]))
    assert f"task.kind: unknown task kind ranking (expected {', '.join(KINDS)})" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "kind, key, value, expected",
    [
        ("classification", "doc_stride", 16, "task.doc_stride: not for kind classification (a key of kind spans)"),
        ("tokens", "threshold", 0.3, "task.threshold: not for kind tokens (a key of kind multilabel)"),
        ("spans", "tag_column", 1, "task.tag_column: not for kind spans (a key of kind tokens)"),
        ("regression", "labels", ["a", "b"], "task.labels: not for kind regression (a key of kind classification"),
        ("choices", "max_lenght", 9, "task.max_lenght: unknown key; did you mean task.max_length?"),
    ],
)
def test_a_key_of_another_kind_is_one_line_naming_it(tmp_path, kind, key, value, expected):
    task = {"name": "mine", "kind": kind, "data_dir": str(tmp_path), key: value}
    if issubclass(TASK_SECTIONS[kind], GlueOrCustomSection):  # a custom task: its text and label columns
        task |= {"text_columns": ["a"], "label_column": "y"} | ({"labels": ["0", "1"]} if kind != "regression" else {})
    recipe = {"stage": "finetune", "run_dir": str(tmp_path / "run"), "model": {"checkpoint": "x"}, "task": task}
    with pytest.raises(UserError) as raised:
        load_recipe(write_yaml(tmp_path / "r.yaml", recipe), check_paths=False)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_the_keys_are_listed_by_kind_each_explained_once():
    rows = [row for row in describe_keys(FinetuneRecipe) if row[0].startswith("task.")]
    keys = {(key, meaning) for key, _, _, meaning in rows}
    assert len(keys) == len(rows)  # a key with one meaning is one row, marked with the kinds it is for
    by_key = {key: meaning for key, _, _, meaning in rows}
    assert by_key["task.doc_stride"].startswith("(spans) ")
    assert by_key["task.name"].startswith(f"({', '.join(KINDS)}) ")
    pair_readers = [name for name, section in TASK_SECTIONS.items() if "both_orders" in section.model_fields]
    assert len(pair_readers) > 1 and by_key["task.both_orders"].startswith(f"({', '.join(pair_readers)}) ")
    kinds = next(row for row in rows if row[0] == "task.kind")
    assert kinds[1] == "|".join(KINDS)
    # Each section says what its own kind is; task.kind's row joins them (a new kind's shows up with it).
    assert kinds[3] == "; ".join(section.model_fields["kind"].description for section in TASK_SECTIONS.values())


def test_finetune_recipes_keys_lists_the_task_keys_by_kind():
    result = runner.invoke(app, ["recipes", "--keys", "finetune"])
    assert result.exit_code == 0, result.output
    assert "(spans) kind spans: tokens two windows" in " ".join(result.output.split())


def test_the_registry_is_one_line_per_kind():
    source = (Path(__file__).resolve().parents[2] / "finetune" / "kinds" / "registry.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("KINDS"))
    table = lines[start : lines.index("}", start)]
    assert table[1:] == [f"    {kind.upper()}.name: {kind.upper()}," for kind in KINDS]


# The kinds that are no GLUE task (test_regression.py loads the old keys as classification and regression).
@pytest.mark.parametrize(
    "kind", [name for name, section in TASK_SECTIONS.items() if not issubclass(section, GlueOrCustomSection)]
)
def test_a_section_saved_with_every_kind_s_keys_loads_as_its_kind(tmp_path, kind):
    """Recipes saved before the kinds had sections of their own hold every task key, at its default where unused."""
    from tests.kinds.test_regression import OLD_TASK_KEYS

    task = {**OLD_TASK_KEYS, "name": "mine", "kind": kind, "data_dir": tmp_path, "max_length": 64}
    if kind == "multilabel":
        task |= {"text_columns": ["a"], "label_column": "y", "labels": ["p", "q"]}
    section = task_config(**task)
    assert type(section) is TASK_SECTIONS[kind] and section.spec().kind == kind
    # Saved again, it holds its own keys only.
    assert set(section.model_dump()) == set(TASK_SECTIONS[kind].model_fields)
