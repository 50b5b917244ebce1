"""`finetune eval` of a checkpoint with a file cut short: one line naming the file, before any model is built."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from tests.conftest import eval_recipe, finetune_recipe, one_error_line, write_task, write_yaml

runner = CliRunner()


@pytest.fixture(scope="module")
def finetuned(pretrained, tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny fine-tuned classifier's checkpoint folder, its task folder)."""
    folder = tmp_path_factory.mktemp("finetuned")
    task = write_task(folder / "task")
    data = finetune_recipe(pretrained, task, folder / "run")
    data["training"]["max_steps"] = 2
    run_finetune(load_recipe(write_yaml(folder / "recipe.yaml", data)))
    return folder / "run" / "checkpoint", task


@pytest.mark.parametrize(
    ("broken", "fault"),
    [
        (
            "model.safetensors",
            "not a complete safetensors file (incomplete metadata, file not fully covered); copy or save it again",
        ),
        ("tokenizer.json", "not valid JSON ("),
    ],
)
def test_eval_of_a_cut_checkpoint_file_is_one_line_naming_it(finetuned, tmp_path, broken, fault):
    checkpoint, task = finetuned
    copy = shutil.copytree(checkpoint, tmp_path / "copy")
    path = copy / broken
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    recipe = write_yaml(tmp_path / "eval.yaml", eval_recipe(task, tmp_path / "eval", {"model": str(copy)}))
    result = runner.invoke(app, ["eval", str(recipe)])
    assert one_error_line(result).startswith(f"error: models.model: {path}: {fault}")
    assert not (tmp_path / "eval").exists()


def test_eval_of_the_whole_checkpoint_works(finetuned, tmp_path):
    checkpoint, task = finetuned  # the check passes a checkpoint as finetune saves it
    recipe = write_yaml(tmp_path / "eval.yaml", eval_recipe(task, tmp_path / "eval", {"model": str(checkpoint)}))
    result = runner.invoke(app, ["eval", str(recipe)])
    assert result.exit_code == 0, result.output
