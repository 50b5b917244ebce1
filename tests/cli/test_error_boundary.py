"""Errors at the boundary: the layers below the recipes raise InputErrors with facts (file, line, value); the recipe
and stage layer name the recipe key (`recipe_key`); whatever no caller names is still reported as a UserError."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import CheckpointError, DataFileError, InputError, UserError, recipe_key

PACKAGE = Path(__file__).resolve().parents[2] / "finetune"
# The modules below the recipe layer that report bad input with facts only, never a UserError of their own.
FACT_ONLY_MODULES = sorted(path for folder in ("data", "glue", "models") for path in (PACKAGE / folder).glob("*.py"))
# Texts there that do start with a recipe key and a colon, each with why it stays: (module, text's start, reason).
KEY_FIRST_TEXTS_KEPT = [
    (
        "models/heads.py",
        "model.backward_checkpoint: its vocabulary differs",
        "a console note printed in the middle of the classifier's load, not an error: no caller can add a key to it",
    )
]


def user_error_uses(path: Path) -> list[int]:
    """The lines of `path` that name UserError (a raise, an import, an except)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Name) and node.id == "UserError")
        or (isinstance(node, ast.alias) and node.name == "UserError")
    ]


def test_data_glue_and_models_raise_no_user_error():
    assert len(FACT_ONLY_MODULES) > 35
    used = {str(path.relative_to(PACKAGE)): user_error_uses(path) for path in FACT_ONLY_MODULES}
    assert {name: lines for name, lines in used.items() if lines} == {}


def known_keys() -> set[str]:
    """Every recipe key of every stage, and every section above one (task, task.long_documents, ...)."""
    from finetune.recipes.loader import RECIPE_TYPES, recipe_keys

    keys = {key for stage in RECIPE_TYPES for key in recipe_keys(stage)}
    return keys | {key.rsplit(".", 1)[0] for key in keys if "." in key}


def text_starts(path: Path) -> list[tuple[int, str]]:
    """(line, opening) of every string literal of `path`: a plain one, or an f-string's text before its first {}."""
    nodes = list(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    f_string_parts = {id(part) for node in nodes if isinstance(node, ast.JoinedStr) for part in node.values}
    starts = []
    for node in nodes:
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                starts.append((node.lineno, first.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in f_string_parts:
            starts.append((node.lineno, node.value))
    return sorted(starts)


def key_first_texts(path: Path, keys: set[str]) -> list[tuple[int, str]]:
    """The texts of `path` that open as a message naming a recipe key ("task.max_length: ...") or a command-line
    option ("--document: ..."): the key is the caller's to put there (`recipe_key`)."""
    found = []
    for line, text in text_starts(path):
        head, colon, _ = text.lstrip().partition(":")
        if colon and (head in keys or re.fullmatch(r"--[a-z][a-z-]*|CHECKPOINT", head)):
            found.append((line, text))
    return found


def test_data_glue_and_models_leave_recipe_keys_to_their_callers():
    keys = known_keys()
    assert {"task.max_length", "corpus.document", "model.checkpoint", "pooling", "task.long_documents"} <= keys
    kept = {(module, start) for module, start, _ in KEY_FIRST_TEXTS_KEPT}
    found = {
        (str(path.relative_to(PACKAGE)), text) for path in FACT_ONLY_MODULES for _, text in key_first_texts(path, keys)
    }
    assert {
        (module, text)
        for module, text in found
        if not any(module == kept_module and text.startswith(start) for kept_module, start in kept)
    } == set()


def test_the_key_scan_sees_a_key_first_text(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        'def f(x):\n    raise ValueError(f"task.max_length: {x} is too long")\n\n\n'
        'A = "corpus.document: file"\nB = "the task.max_length"\nC = "--document: page"\n'
    )
    assert [line for line, _ in key_first_texts(module, {"task.max_length", "corpus.document"})] == [2, 5, 7]


def test_the_scan_sees_a_user_error(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from finetune.errors import UserError\n\n\ndef f():\n    raise UserError('x')\n")
    assert user_error_uses(module) == [1, 5]


def test_an_input_error_reads_as_its_facts():
    assert str(DataFileError("not valid UTF-8", source=Path("a/b.tsv"), line=3)) == "a/b.tsv line 3: not valid UTF-8"
    assert str(CheckpointError("not UTF-8 text", source="m/config.json")) == "m/config.json: not UTF-8 text"
    error = InputError("leaves no tokens", value=8)
    assert str(error) == "leaves no tokens" and error.value == 8 and error.source is None and error.line is None
    assert isinstance(error, UserError)  # reported as one (CLI, guarded_stage) when no caller names a key


def test_recipe_key_names_the_key_of_an_input_error():
    with pytest.raises(UserError) as info, recipe_key("task.data_dir"):
        raise DataFileError("no examples", source="dev.tsv")
    assert str(info.value) == "task.data_dir: dev.tsv: no examples"
    assert not isinstance(info.value, InputError)  # named once: an outer recipe_key leaves it as it is
    assert isinstance(info.value.__cause__, DataFileError)  # the facts stay reachable


def test_recipe_key_keeps_the_innermost_key_and_lets_other_errors_through():
    with (
        pytest.raises(UserError, match=r"^models\.x: no such model folder: m$"),
        recipe_key("model.checkpoint"),
        recipe_key("models.x"),
    ):
        raise CheckpointError("no such model folder: m")
    with pytest.raises(UserError, match=r"^already named$"), recipe_key("task"):
        raise UserError("already named")
    with pytest.raises(ValueError), recipe_key("task"):
        raise ValueError("not input")


def test_the_cli_reports_an_uncaught_input_error_on_one_line(tmp_path, monkeypatch):
    import finetune.inference.language_model_validation as validation

    def bad_text(*arguments, **keywords):
        raise DataFileError("not valid UTF-8", source=tmp_path / "text.txt", line=2)

    monkeypatch.setattr(validation, "score_text", bad_text)
    result = CliRunner().invoke(app, ["score", str(tmp_path), str(tmp_path / "text.txt")])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {tmp_path / 'text.txt'} line 2: not valid UTF-8"


def test_stages_name_the_key_data_leaves_out():
    """`--document` and `submission` are named by the stages; the data and glue functions say only what is wrong."""
    from types import SimpleNamespace

    from finetune.commands.generate import prompt_ids
    from finetune.data.corpus import text_documents
    from finetune.glue.submission import write_submission

    with pytest.raises(InputError, match=r"^expected one of line, paragraph, file \(got 'page'\)$"):
        text_documents("x", "page")
    with pytest.raises(UserError, match=r"^--document: expected one of"):
        prompt_ids(SimpleNamespace(eos_token_id=0), "x", "page")
    with pytest.raises(InputError, match=r"^no predictions for "):
        write_submission(Path("unused.zip"), {})
