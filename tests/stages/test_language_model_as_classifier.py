"""A pretraining run's checkpoint (a language model) given to `finetune eval` is refused in one line: evaluating it
would read a classifier head initialised at random."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from tests.conftest import eval_recipe, pretrain_recipe, write_yaml
from tests.models.test_ngram import assert_one_error_line

runner = CliRunner()


@pytest.mark.parametrize(
    "model",
    [
        {"family": "gpt2", "layers": 1, "hidden": 16, "heads": 2},
        {"family": "bert", "layers": 1, "hidden": 16, "heads": 2, "intermediate": 32},
    ],
    ids=["gpt2", "bert"],
)
def test_evaluating_a_language_model_is_one_line_exit_2(tmp_path, corpus_file, task_dir, model):
    data = pretrain_recipe(corpus_file, tmp_path / "lm")
    data["model"] = model
    data["training"]["max_steps"] = 2
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "pretrain.yaml", data))])
    assert result.exit_code == 0, result.output
    recipe = eval_recipe(task_dir, tmp_path / "eval", {"lm": str(tmp_path / "lm" / "checkpoint")})
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", recipe))])
    assert_one_error_line(result, ("models.lm", "is a language model", "not a fine-tuned classifier"))
    assert not (tmp_path / "eval").exists()
