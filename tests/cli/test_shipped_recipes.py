"""The shipped recipes from any folder: `finetune recipes` lists them by name, `finetune recipes copy` copies one to
edit, and every command that takes a recipe takes a shipped one by name."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.recipes import load_recipe
from finetune.recipes.shipped import recipe_name, recipes_root, resolve_recipe, shipped_recipe, shipped_recipes
from tests.conftest import REPO_ROOT, one_error_line

runner = CliRunner()


def invoke(*arguments: object):
    return runner.invoke(app, [str(argument) for argument in arguments], env={"COLUMNS": "400"})


@pytest.fixture(autouse=True)
def elsewhere(tmp_path, monkeypatch):
    """Every test runs outside the checkout, where the old `finetune recipes` found no recipes/ folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_checkout_ships_its_top_level_recipes_folder():
    assert recipes_root() == REPO_ROOT / "recipes"
    names = shipped_recipes()
    assert len(names) == len(list((REPO_ROOT / "recipes").rglob("*.yaml")))
    assert names["finetune/minilm-sst2-lora"] == REPO_ROOT / "recipes" / "finetune" / "minilm-sst2-lora.yaml"


@pytest.mark.parametrize(
    "typed", ["finetune/minilm-sst2-lora", "finetune/minilm-sst2-lora.yaml", "recipes/finetune/minilm-sst2-lora.yaml"]
)
def test_a_name_with_or_without_its_folder_and_suffix(typed):
    assert recipe_name(typed) == "finetune/minilm-sst2-lora"
    assert shipped_recipe(typed).name == "minilm-sst2-lora.yaml"


def test_recipes_lists_the_shipped_ones_by_name_from_anywhere():
    result = invoke("recipes")
    assert result.exit_code == 0, result.output
    rows = {line.split("\t")[0]: line.split("\t") for line in result.output.splitlines()}  # piped: tab-separated
    assert rows["recipe"] == ["recipe", "stage", "description"]
    assert set(rows) - {"recipe"} == set(shipped_recipes())
    lora = load_recipe(shipped_recipe("finetune/minilm-sst2-lora"), check_paths=False)
    assert rows["finetune/minilm-sst2-lora"][1:] == ["finetune", " ".join(lora.description.split())]


def test_recipes_dir_still_lists_a_folder_of_the_users(elsewhere):
    (elsewhere / "mine").mkdir()
    (elsewhere / "mine" / "a.yaml").write_text("stage: eval\ndescription: my own\n", encoding="utf-8")
    result = invoke("recipes", "--dir", "mine")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == ["mine/a.yaml\teval\tmy own"]


def test_copy_writes_the_recipe_with_its_own_command_on_the_first_line(elsewhere):
    result = invoke("recipes", "copy", "finetune/minilm-sst2-lora", "my.yaml")
    assert result.exit_code == 0, result.output
    assert "finetune finetune my.yaml" in result.output
    shipped = shipped_recipe("finetune/minilm-sst2-lora").read_text(encoding="utf-8").splitlines()
    copied = (elsewhere / "my.yaml").read_text(encoding="utf-8").splitlines()
    assert copied[0] == "# finetune finetune my.yaml" and copied[1:] == shipped[1:]
    assert load_recipe("my.yaml", check_paths=False).description


def test_copy_into_a_folder_keeps_the_file_name(elsewhere):
    (elsewhere / "mine").mkdir()
    assert invoke("recipes", "copy", "quickstart/eval.yaml", "mine").exit_code == 0
    assert (elsewhere / "mine" / "eval.yaml").read_text(encoding="utf-8").startswith("# finetune eval mine/eval.yaml")


def test_copy_never_overwrites_without_force(elsewhere):
    (elsewhere / "my.yaml").write_text("mine\n", encoding="utf-8")
    line = one_error_line(invoke("recipes", "copy", "quickstart/eval", "my.yaml"))
    assert "my.yaml exists; --force overwrites it" in line
    assert (elsewhere / "my.yaml").read_text(encoding="utf-8") == "mine\n"
    assert invoke("recipes", "copy", "quickstart/eval", "my.yaml", "--force").exit_code == 0
    assert (elsewhere / "my.yaml").read_text(encoding="utf-8").startswith("# finetune eval my.yaml")


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (
            ("finetune/minilm-sst2-lorra", "x.yaml"),
            ["no shipped recipe finetune/minilm-sst2-lorra; did you mean finetune/minilm-sst2-lora", "lists them"],
        ),
        (("minilm-sst2-lora", "x.yaml"), ["did you mean finetune/minilm-sst2-lora?"]),
        (("quickstart/eval", "nowhere/x.yaml"), ["no such folder: nowhere"]),
    ],
)
def test_copy_mistakes_are_one_line(elsewhere, arguments, fragments):
    line = one_error_line(invoke("recipes", "copy", *arguments))
    for fragment in fragments:
        assert fragment in line
    assert not (elsewhere / "x.yaml").exists()


def test_a_stage_runs_a_shipped_recipe_by_name_reading_data_from_the_working_folder():
    """The recipe is found by name; its relative data paths are still the working folder's: here they are missing,
    which is the refusal that proves both (the recipe was read and validated, the data looked for here)."""
    line = one_error_line(invoke("pretrain", "quickstart/pretrain", "training.epochs=1"))
    assert "quickstart/pretrain.yaml: corpus.train_files: no such file: data/quickstart/corpus/train.txt" in line


def test_a_shipped_recipe_by_name_is_validated_with_its_overrides():
    line = one_error_line(invoke("finetune", "finetune/minilm-sst2-lora.yaml", "training.learning_rate=1e-3"))
    assert line.endswith("training.learning_rate: unknown key; did you mean training.lr?")


def test_a_stage_refuses_a_shipped_recipe_of_another_stage():
    line = one_error_line(invoke("pretrain", "recipes/quickstart/finetune.yaml"))
    assert "this is a 'finetune' recipe; run it with `finetune finetune`" in line


def test_an_existing_path_comes_before_a_shipped_name(elsewhere):
    (elsewhere / "quickstart").mkdir()
    mine = elsewhere / "quickstart" / "eval.yaml"
    mine.write_text("stage: eval\n", encoding="utf-8")
    assert resolve_recipe("quickstart/eval.yaml") == mine.relative_to(elsewhere)
    assert resolve_recipe("quickstart/eval") == shipped_recipe("quickstart/eval")


def test_neither_a_file_nor_a_shipped_name_is_one_line():
    line = one_error_line(invoke("eval", "quickstart/evl.yaml"))
    assert "recipe quickstart/evl.yaml: no such file, nor a shipped recipe of that name; did you mean" in line
    assert "quickstart/eval" in line
    with pytest.raises(UserError, match="no such file"):
        resolve_recipe("nothing-like-it.yaml")


@pytest.mark.parametrize("command", ["lr-find", "profile", "ulmfit"])
def test_every_recipe_command_takes_a_name(command):
    recipe = "quickstart/ulmfit" if command == "ulmfit" else "quickstart/finetune"
    line = one_error_line(invoke(command, recipe, "zebra=1"))
    assert "quickstart/" in line and "zebra: unknown key" in line
