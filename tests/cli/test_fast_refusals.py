"""A mistake that needs no model is refused before any deep-learning or data library is imported.

Each case runs the real command in a fresh interpreter with `-X importtime` (every module it imports is listed on
stderr) and asserts: a non-zero exit, one `error:` line naming the culprit, and none of the heavy libraries imported
(torch alone takes seconds: the recipe, the overrides, the input paths and search's space are checked first). No
wall time is asserted: a loaded machine would make that flaky; the import list is what decides it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import eval_recipe, finetune_recipe, pretrain_recipe, write_corpus, write_task, write_yaml

HEAVY = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "evaluate",
    "sklearn",
    "scipy",
    "pandas",
    "matplotlib",
    "optuna",
    "tokenizers",
)
REPO_ROOT = Path(__file__).resolve().parents[2]


class Run(NamedTuple):
    returncode: int
    stdout: str
    messages: list[str]  # stderr without the import-time lines
    imported: set[str]  # top-level names of every module imported


def run_cli(arguments: list[str], cwd: Path) -> Run:
    """`finetune ARGUMENTS` in a fresh interpreter, from the checkout."""
    return run_python(["-m", "finetune", *arguments], cwd)


def run_python(arguments: list[str], cwd: Path) -> Run:
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-X", "importtime", *arguments]
    done = subprocess.run(command, check=False, cwd=cwd, env=environment, capture_output=True, text=True, timeout=120)
    imported, messages = set(), []
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rpartition("|")[2].strip().partition(".")[0])
        elif line.strip():
            messages.append(line)
    return Run(done.returncode, done.stdout, messages, imported)


class Workspace(NamedTuple):
    """Valid inputs (a tiny corpus, a task folder, a model folder), so that each case breaks exactly one thing."""

    root: Path
    pretrain: Path
    finetune: Path
    eval: Path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("refusals")
    corpus, task = write_corpus(root / "corpus"), write_task(root / "task")
    (root / "lm").mkdir()  # only its existence is checked before the stage runs
    (root / "space.yaml").write_text("training.lrr: {low: 1.0e-5, high: 1.0e-3}\n", encoding="utf-8")
    (root / "range.yaml").write_text("training.lr: {low: 1.0e-3, high: 1.0e-5}\n", encoding="utf-8")
    (root / "broken.yaml").write_text("stage: finetune\ntask: [a,\n  b: c\n", encoding="utf-8")
    (root / "empty-task").mkdir()
    (root / "train-only").mkdir()
    (root / "train-only" / "train.tsv").write_bytes((task / "train.tsv").read_bytes())
    return Workspace(
        root,
        write_yaml(root / "pretrain.yaml", pretrain_recipe(corpus, root / "runs" / "pretrain")),
        write_yaml(root / "finetune.yaml", finetune_recipe(root / "lm", task, root / "runs" / "finetune")),
        write_yaml(root / "eval.yaml", eval_recipe(task, root / "runs" / "eval", {"model": str(root / "lm")})),
    )


class Case(NamedTuple):
    arguments: Callable[[Workspace], list[str]]
    named: tuple[str, ...]  # what the error line must say


CASES = {
    "unknown key": Case(lambda w: ["finetune", str(w.finetune), "task.nme=rte"], ("task.nme", "task.name")),
    "unknown key beside a tracker": Case(
        lambda w: ["finetune", str(w.finetune), "training.log_with=[tensorboard]", "task.nme=rte"], ("task.nme",)
    ),
    "wrong type": Case(lambda w: ["finetune", str(w.finetune), "training.epochs=three"], ("training.epochs",)),
    "malformed YAML": Case(lambda w: ["finetune", str(w.root / "broken.yaml")], ("broken.yaml", "line")),
    "missing recipe file": Case(lambda w: ["finetune", str(w.root / "absent.yaml")], ("absent.yaml",)),
    "unknown shipped recipe": Case(lambda w: ["finetune", "finetune/minilm-sst3"], ("finetune/minilm-sst3",)),
    "missing corpus file": Case(
        lambda w: ["pretrain", str(w.pretrain), f"corpus.train_files=[{w.root / 'nope.txt'}]"],
        ("corpus.train_files", "nope.txt"),
    ),
    "missing task folder": Case(
        lambda w: ["finetune", str(w.finetune), f"task.data_dir={w.root / 'nope'}"], ("task.data_dir", "nope")
    ),
    "missing model folder": Case(
        lambda w: ["finetune", str(w.finetune), f"model.checkpoint={w.root / 'no-lm'}"],
        ("model.checkpoint", "no such model folder"),
    ),
    "missing training file": Case(
        lambda w: ["finetune", str(w.finetune), f"task.data_dir={w.root / 'empty-task'}"], ("no train file", "empty")
    ),
    "missing dev file": Case(
        lambda w: ["finetune", str(w.finetune), f"task.data_dir={w.root / 'train-only'}"], ("no dev file", "train-only")
    ),
    "eval: missing split file": Case(
        lambda w: ["eval", str(w.eval), f"task.data_dir={w.root / 'empty-task'}", "split=test"], ("no test file",)
    ),
    "unknown GLUE task": Case(lambda w: ["eval", "eval/glue", "tasks.rtee=runs/x"], ("tasks.rtee",)),
    "bad ulmfit stage key": Case(
        lambda w: ["ulmfit", "ulmfit/sst2", "classifier.trainin.epochs=2"], ("classifier.trainin",)
    ),
    **{
        f"{command}: missing model folder": Case(
            lambda w, command=command, rest=rest: [command, str(w.root / "no-lm"), *rest],
            ("CHECKPOINT", "no such model folder", "no-lm"),
        )
        for command, rest in {
            "predict": ["--input", "in.txt"],
            "generate": ["--prompt", "hi"],
            "score": ["text.txt"],
            "merge": ["merged"],
            "serve": ["--port", "0"],
        }.items()
    },
    "lr-find: unknown key": Case(lambda w: ["lr-find", str(w.finetune), "training.lrr=1"], ("training.lrr",)),
    "profile: unknown key": Case(lambda w: ["profile", str(w.finetune), "training.lrr=1"], ("training.lrr",)),
    "cv: unknown key": Case(lambda w: ["cv", str(w.finetune), "training.lrr=1"], ("training.lrr",)),
    "cv: missing training file": Case(
        lambda w: ["cv", str(w.finetune), f"task.data_dir={w.root / 'empty-task'}"], ("no train file",)
    ),
    "search: missing space file": Case(
        lambda w: ["search", str(w.finetune), "--space", str(w.root / "absent-space.yaml")], ("absent-space.yaml",)
    ),
    "search: unknown key in the space": Case(
        lambda w: ["search", str(w.finetune), "--space", str(w.root / "space.yaml")], ("space.yaml", "training.lrr")
    ),
    "search: bad range in the space": Case(
        lambda w: ["search", str(w.finetune), "--space", str(w.root / "range.yaml")], ("range.yaml", "low < high")
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_mistake_is_refused_before_any_heavy_library_is_imported(case: Case, workspace: Workspace):
    run = run_cli(case.arguments(workspace), workspace.root)
    assert run.returncode == 2, run
    assert len(run.messages) == 1 and run.messages[0].startswith("error: "), run.messages
    for fragment in case.named:
        assert fragment in run.messages[0], (fragment, run.messages[0])
    assert run.stdout == ""
    assert sorted(run.imported.intersection(HEAVY)) == []
    assert not (workspace.root / "runs").exists()  # refused before anything was written


@pytest.mark.parametrize("arguments", [["--help"], ["recipes"]], ids=["--help", "recipes"])
def test_help_and_the_recipe_list_import_no_heavy_library(arguments: list[str], workspace: Workspace):
    run = run_cli(arguments, workspace.root)
    assert run.returncode == 0 and run.stdout, run
    assert sorted(run.imported.intersection(HEAVY)) == []


def test_the_import_list_holds_what_is_imported_indirectly(workspace: Workspace):
    """The check reads the import list right: a module imported by another (pydantic, by the recipes) is in it."""
    run = run_python(["-c", "import finetune.recipes"], workspace.root)
    assert run.returncode == 0 and {"finetune", "pydantic", "yaml"} <= run.imported
    assert "torch" not in run.imported
