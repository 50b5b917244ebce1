"""Issue 44's cases through the real CLI: a value of the wrong YAML type on the command line exits 2 with one line
naming the key, no traceback (tests/recipes/test_wrong_types.py tries every key at the recipe-loading level)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from tests.conftest import REPO_ROOT, pretrain_recipe, write_corpus, write_yaml


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "recipe.yaml", pretrain_recipe(write_corpus(tmp_path / "corpus"), tmp_path / "run"))


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.family=[gpt2]", "model.family: unknown model family ['gpt2']"),
        ("model.family={name: gpt2}", "model.family: unknown model family {'name': 'gpt2'}"),
        ("training.epochs=true", "training.epochs: expected a number, not true or false"),
        ("training.compile=1", "training.compile: expected true or false"),
        ("stage=[pretrain]", "stage: expected one of pretrain, finetune, eval, ulmfit"),
    ],
)
def test_a_wrong_type_on_the_command_line_is_one_line(recipe, override, named):
    result = CliRunner().invoke(app, ["pretrain", str(recipe), override])
    output = result.output.strip()
    assert result.exit_code == 2, output[-2000:]
    assert "Traceback" not in result.output
    assert output.startswith("error: ") and "\n" not in output, output[-2000:]
    assert named in output


def test_the_issue_command_exits_2_without_a_traceback(recipe):
    # the issue's exact command, as a user types it: a new process, its real exit code and standard error
    finished = subprocess.run(
        [sys.executable, "-m", "finetune", "pretrain", str(recipe), "model.family=[gpt2]"],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    output = (finished.stdout + finished.stderr).strip()
    assert finished.returncode == 2, output[-2000:]
    assert "Traceback" not in output and len(output.splitlines()) == 1, output[-2000:]
    assert "model.family: unknown model family ['gpt2']" in output
