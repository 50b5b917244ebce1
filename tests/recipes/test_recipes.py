"""Recipes: every shipped recipe validates; every user mistake is a one-line UserError naming key and file."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

from finetune.data.tokenizers import train_byte_level_bpe
from finetune.errors import UserError
from finetune.models.language_models import build_language_model
from finetune.recipes import (
    RECIPE_TYPES,
    FinetuneRecipe,
    PretrainRecipe,
    apply_override,
    describe_keys,
    input_path_problems,
    load_recipe,
    recipe_to_yaml,
)
from tests.conftest import REPO_ROOT, write_yaml

SHIPPED_RECIPES = sorted((REPO_ROOT / "recipes").glob("**/*.yaml"))


def _id(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


# ---------------------------------------------------------------------------------------------
# Shipped recipes
# ---------------------------------------------------------------------------------------------


def test_recipes_are_shipped():
    assert SHIPPED_RECIPES, "no recipes found under recipes/"
    stages = {load_recipe(path, check_paths=False).stage for path in SHIPPED_RECIPES}
    assert stages == set(RECIPE_TYPES), "every stage should have at least one shipped recipe"


@pytest.mark.parametrize("path", SHIPPED_RECIPES, ids=_id)
def test_shipped_recipe_validates(path: Path):
    recipe = load_recipe(path, check_paths=False)
    assert isinstance(recipe, RECIPE_TYPES[recipe.stage])


@pytest.mark.parametrize("path", SHIPPED_RECIPES, ids=_id)
def test_shipped_recipe_opens_with_its_command(path: Path):
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    words = first_line.split()
    assert words[:2] == ["#", "finetune"] and len(words) == 4, f"first line is {first_line!r}"
    stage, command_path = words[2], words[3]
    assert stage == load_recipe(path, check_paths=False).stage
    assert command_path == path.relative_to(REPO_ROOT).as_posix()


@pytest.mark.parametrize("path", SHIPPED_RECIPES, ids=_id)
def test_shipped_recipe_data_inputs_exist(path: Path, monkeypatch):
    # Recipes use paths relative to the project root, where the commands are meant to run.
    monkeypatch.chdir(REPO_ROOT)
    recipe = load_recipe(path, check_paths=False)
    missing = [
        (key, problem)
        for key, missing_path, problem in input_path_problems(recipe)
        if Path(missing_path).resolve().is_relative_to(REPO_ROOT / "data")
    ]
    assert missing == []


def test_missing_paths_sees_the_shipped_data_folder_paths(monkeypatch, tmp_path):
    """The check above must be able to fail: a moved data folder is reported."""
    monkeypatch.chdir(tmp_path)  # from here, data/quickstart/... does not exist
    recipe = load_recipe(REPO_ROOT / "recipes" / "quickstart" / "pretrain.yaml", check_paths=False)
    keys = {key for key, _, _ in input_path_problems(recipe)}
    assert {"corpus.train_files", "corpus.validation_files"} <= keys


# ---------------------------------------------------------------------------------------------
# Valid recipes and the checks on them
# ---------------------------------------------------------------------------------------------


def test_valid_recipe_loads_with_values(pretrain_recipe_data, write_recipe, corpus_file):
    recipe = load_recipe(write_recipe(pretrain_recipe_data))
    assert isinstance(recipe, PretrainRecipe)
    assert recipe.model.hidden == 32 and recipe.model.heads == 2
    assert recipe.corpus.train_files == [corpus_file]
    assert recipe.training.max_steps == 10
    assert recipe.masking.probability == 0.15  # a default filled in


def _error_for(data, write_recipe, overrides=(), **kwargs) -> tuple[str, Path]:
    path = write_recipe(data)
    with pytest.raises(UserError) as info:
        load_recipe(path, list(overrides), **kwargs)
    message = str(info.value)
    assert "\n" not in message, f"error message is not a single line: {message!r}"
    assert str(path) in message, f"error message does not name the file: {message!r}"
    return message, path


def test_unknown_top_level_key(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["epochs"] = 3
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "epochs: unknown key" in message


def test_unknown_nested_key(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["training"]["lrr"] = 1e-3
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "training.lrr" in message and "unknown key" in message


def test_unknown_key_through_override(pretrain_recipe_data, write_recipe):
    message, _ = _error_for(pretrain_recipe_data, write_recipe, ["masking.probabilty=0.2"])
    assert "masking.probabilty" in message


@pytest.mark.parametrize(
    ("section", "key", "value", "named"),
    [
        ("training", "batch_size", "abc", "training.batch_size"),
        ("training", "lr", -1, "training.lr"),
        ("training", "epochs", 0, "training.epochs"),
        ("masking", "probability", 0, "masking.probability"),
        ("masking", "probability", 1.5, "masking.probability"),
        ("corpus", "block_size", 4, "corpus.block_size"),
        ("training", "device", "tpu", "training.device"),
        ("training", "group_chunk_batches", 0, "training.group_chunk_batches"),
        ("training", "group_chunk_batches", 2.5, "training.group_chunk_batches"),
        ("training", "split_by_length", "sometimes", "training.split_by_length"),
    ],
)
def test_bad_values_name_the_key(pretrain_recipe_data, write_recipe, section, key, value, named):
    pretrain_recipe_data.setdefault(section, {})[key] = value
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert named in message
    assert repr(value) in message or str(value) in message


def test_masking_fractions_past_one(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["masking"] = {"mask_fraction": 0.8, "random_fraction": 0.3}
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "masking" in message and "exceeds 1" in message


def test_masking_fractions_summing_to_one_are_fine(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["masking"] = {"mask_fraction": 0.5, "random_fraction": 0.5}
    recipe = load_recipe(write_recipe(pretrain_recipe_data))
    assert recipe.masking.random_fraction == 0.5


def test_heads_must_divide_hidden(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["model"]["heads"] = 3
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "model" in message and "heads (3) must divide hidden (32)" in message


def test_missing_file(pretrain_recipe_data, write_recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pretrain_recipe_data["corpus"]["train_files"] = ["nope.txt"]
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "corpus.train_files" in message and "nope.txt" in message


def test_missing_file_not_checked_when_asked(pretrain_recipe_data, write_recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pretrain_recipe_data["corpus"]["train_files"] = ["nope.txt"]
    recipe = load_recipe(write_recipe(pretrain_recipe_data), check_paths=False)
    assert recipe.corpus.train_files == [Path("nope.txt")]


def test_missing_task_folder(finetune_recipe_data, write_recipe, tmp_path):
    finetune_recipe_data["task"]["data_dir"] = str(tmp_path / "no-such-task")
    message, _ = _error_for(finetune_recipe_data, write_recipe)
    assert "task.data_dir" in message and "no-such-task" in message


def test_unknown_task_name(finetune_recipe_data, write_recipe, task_dir):
    finetune_recipe_data["task"] = {"name": "sst3", "data_dir": str(task_dir)}
    message, _ = _error_for(finetune_recipe_data, write_recipe)
    assert "task" in message and "unknown task 'sst3'" in message


def test_glue_task_rejects_custom_columns(finetune_recipe_data, write_recipe, task_dir):
    finetune_recipe_data["task"] = {"name": "sst2", "data_dir": str(task_dir), "text_columns": ["sentence"]}
    message, _ = _error_for(finetune_recipe_data, write_recipe)
    assert "task" in message and "text_columns" in message


def test_glue_task_by_name_loads(finetune_recipe_data, write_recipe, task_dir):
    finetune_recipe_data["task"] = {"name": "sst2", "data_dir": str(task_dir)}
    recipe = load_recipe(write_recipe(finetune_recipe_data))
    assert recipe.task.name == "sst2" and recipe.task.text_columns is None


def test_missing_required_key(finetune_recipe_data, write_recipe):
    del finetune_recipe_data["model"]
    message, _ = _error_for(finetune_recipe_data, write_recipe)
    assert "model: required key is missing" in message


def test_stage_mismatch(pretrain_recipe_data, write_recipe):
    message, _ = _error_for(pretrain_recipe_data, write_recipe, expected_stage="finetune")
    assert "stage" in message and "pretrain" in message


def test_unknown_stage(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["stage"] = "distill"
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "stage" in message and "distill" in message


def test_several_problems_on_one_line(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["training"]["lr"] = -1
    pretrain_recipe_data["training"]["batch_size"] = "abc"
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert "training.lr" in message and "training.batch_size" in message


def test_invalid_yaml_is_one_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("stage: pretrain\ntraining: [unclosed\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_recipe(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_recipe_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_recipe(tmp_path / "absent.yaml")


def test_top_level_must_be_a_mapping(tmp_path):
    path = write_yaml(tmp_path / "list.yaml", {"x": 1})
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(UserError, match="mapping"):
        load_recipe(path)


# ---------------------------------------------------------------------------------------------
# Overrides
# ---------------------------------------------------------------------------------------------


def test_override_sets_a_float(pretrain_recipe_data, write_recipe):
    recipe = load_recipe(write_recipe(pretrain_recipe_data), ["training.lr=1e-3"])
    assert isinstance(recipe.training.lr, float) and recipe.training.lr == pytest.approx(1e-3)
    recipe = load_recipe(write_recipe(pretrain_recipe_data), ["training.lr=0.25"])
    assert recipe.training.lr == 0.25


def test_override_sets_a_list(pretrain_recipe_data, write_recipe):
    recipe = load_recipe(write_recipe(pretrain_recipe_data), ["corpus.train_files=[a,b]"], check_paths=False)
    assert recipe.corpus.train_files == [Path("a"), Path("b")]


def test_override_creates_a_missing_section(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data.pop("masking", None)
    recipe = load_recipe(write_recipe(pretrain_recipe_data), ["masking.probability=0.3", "overwrite=true"])
    assert recipe.masking.probability == 0.3 and recipe.overwrite is True


def test_later_override_wins(pretrain_recipe_data, write_recipe):
    recipe = load_recipe(write_recipe(pretrain_recipe_data), ["training.batch_size=4", "training.batch_size=2"])
    assert recipe.training.batch_size == 2


def test_override_keeps_the_file_untouched(pretrain_recipe_data, write_recipe):
    path = write_recipe(pretrain_recipe_data)
    before = path.read_text(encoding="utf-8")
    load_recipe(path, ["training.lr=0.5"])
    assert path.read_text(encoding="utf-8") == before


def test_override_of_a_top_level_string_with_spaces(pretrain_recipe_data, write_recipe):
    recipe = load_recipe(write_recipe(pretrain_recipe_data), ["description=a b = c"])
    assert recipe.description == "a b = c"


@pytest.mark.parametrize("override", ["training.lr", "=3", "training..lr=1", ".lr=1"])
def test_malformed_override(pretrain_recipe_data, write_recipe, override):
    with pytest.raises(UserError) as info:
        load_recipe(write_recipe(pretrain_recipe_data), [override])
    assert "override" in str(info.value) and "\n" not in str(info.value)


def test_override_through_a_non_section(pretrain_recipe_data, write_recipe):
    message, _ = _error_for(pretrain_recipe_data, write_recipe, ["training.lr.value=1"])
    assert "training.lr" in message and "not a section" in message


def test_override_through_a_top_level_scalar(pretrain_recipe_data, write_recipe):
    message, _ = _error_for(pretrain_recipe_data, write_recipe, ["run_dir.name=x"])
    assert "run_dir" in message and "not a section" in message


def test_apply_override_on_raw_data():
    data = {"training": {"lr": 1.0}}
    apply_override(data, "training.epochs=3", Path("r.yaml"))
    apply_override(data, "corpus.train_files=[a, b]", Path("r.yaml"))
    apply_override(data, "overwrite=true", Path("r.yaml"))
    assert data == {"training": {"lr": 1.0, "epochs": 3}, "corpus": {"train_files": ["a", "b"]}, "overwrite": True}


# ---------------------------------------------------------------------------------------------
# Saving and describing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["pretrain_recipe_data", "finetune_recipe_data", "eval_recipe_data"])
def test_recipe_to_yaml_round_trips(fixture, request, write_recipe, tmp_path):
    data = copy.deepcopy(request.getfixturevalue(fixture))
    if data["stage"] == "eval":
        data["models"] = {"a": "somewhere/checkpoint"}
    recipe = load_recipe(write_recipe(data), ["training.lr=0.5"] if data["stage"] != "eval" else [], check_paths=False)
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(recipe_to_yaml(recipe), encoding="utf-8")
    reloaded = load_recipe(resolved, check_paths=False)
    assert reloaded == recipe
    assert reloaded.model_dump() == recipe.model_dump()
    # Defaults are written out, not left implicit.
    assert "weight_decay" in resolved.read_text(encoding="utf-8") or data["stage"] == "eval"


def test_describe_keys_for_pretrain():
    rows = describe_keys(PretrainRecipe)
    keys = {row[0]: row for row in rows}
    assert {"training.lr", "masking.probability", "corpus.train_files", "model.hidden", "run_dir"} <= set(keys)
    assert keys["training.lr"][1] == "float"
    assert keys["training.lr"][2] == repr(5e-4)
    assert "peak learning rate" in keys["training.lr"][3]
    assert keys["run_dir"][2] == "(required)"
    assert keys["model.family"][1] == "bert|gpt2|awd_lstm|ngram"
    # A key the families share with one meaning is listed once, marked with the families that have it.
    assert [row[3] for row in rows if row[0] == "model.heads"] == ["(bert, gpt2) attention heads; must divide hidden"]
    # The same key with a different meaning per family is listed once per meaning.
    hidden = [row for row in rows if row[0] == "model.hidden"]
    assert [(row[2], row[3].split(")")[0]) for row in hidden] == [("128", "(bert, gpt2"), ("1152", "(awd_lstm")]
    assert keys["model.weight_dropout"][3].startswith("(awd_lstm) ")
    # Sections themselves are not keys.
    assert "training" not in keys and "model" not in keys and "masking" not in keys


@pytest.mark.parametrize(
    ("model", "extra", "named"),
    [
        ({"family": "gpt2", "layerz": 2}, {}, "model.layerz: unknown key"),
        ({"family": "lstm"}, {}, "model.family: unknown model family lstm"),
        ({"family": "gpt2"}, {"masking": {"probability": 0.2}}, "masking applies to masked LMs"),
        ({"family": "awd_lstm", "heads": 2}, {}, "model.heads: unknown key"),
        ({"family": "awd_lstm", "checkpoint": "x", "layers": 2}, {}, "the architecture comes from model.checkpoint"),
        (
            {"family": "awd_lstm", "checkpoint": "x", "embedding_init_range": 0.5},
            {},
            "the architecture comes from model.checkpoint; remove embedding_init_range",
        ),
        ({"family": "awd_lstm", "embedding_init_range": 0}, {}, "model.embedding_init_range"),
        ({"family": "gpt2"}, {"tokenizer": {"new_vocabulary": True}}, "tokenizer.new_vocabulary needs"),
    ],
)
def test_model_family_problems_name_the_key(pretrain_recipe_data, write_recipe, model, extra, named):
    pretrain_recipe_data["model"] = model
    pretrain_recipe_data.update(extra)
    with pytest.raises(UserError, match=re.escape(named)):
        load_recipe(write_recipe(pretrain_recipe_data))


def test_family_defaults_are_filled_in(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["model"] = {"family": "gpt2", "layers": 1, "hidden": 32, "heads": 2}
    recipe = load_recipe(write_recipe(pretrain_recipe_data))
    assert recipe.masking is None and recipe.tokenizer.lowercase is False  # causal LMs: cased byte-level BPE
    pretrain_recipe_data["model"] = {"layers": 1, "hidden": 32, "heads": 2}  # no family: bert
    recipe = load_recipe(write_recipe(pretrain_recipe_data))
    assert recipe.model.family == "bert" and recipe.masking.probability == 0.15 and recipe.tokenizer.lowercase


def test_corpus_needs_exactly_one_source(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["corpus"]["dataset"] = "wikitext"
    with pytest.raises(UserError, match="corpus: give exactly one of train_files, dataset and task"):
        load_recipe(write_recipe(pretrain_recipe_data))
    del pretrain_recipe_data["corpus"]["dataset"]
    pretrain_recipe_data["corpus"]["train_files"] = []
    with pytest.raises(UserError, match="corpus: give exactly one of train_files, dataset and task"):
        load_recipe(write_recipe(pretrain_recipe_data))


def test_describe_keys_for_finetune():
    keys = {row[0] for row in describe_keys(FinetuneRecipe)}
    assert {"discriminative.factor", "unfreezing.mode", "schedule.cut_frac", "model.checkpoint"} <= keys


def test_group_chunk_batches_defaults_to_todays_50_and_takes_any_count_from_1(finetune_recipe_data, write_recipe):
    recipe = load_recipe(write_recipe(finetune_recipe_data))
    # group_by_length null: grouped where the model pads, shuffled where it skips padding (tests/kinds).
    assert recipe.training.group_by_length is None and recipe.training.group_chunk_batches == 50
    assert recipe.training.skip_padding
    assert (
        load_recipe(write_recipe(finetune_recipe_data), ["training.group_chunk_batches=1"]).training.group_chunk_batches
        == 1
    )
    keys = {row[0]: row for row in describe_keys(FinetuneRecipe)}
    assert keys["training.group_chunk_batches"][1:3] == ("int", "50")
    assert "group_by_length" in keys["training.group_chunk_batches"][3]


def test_split_by_length_is_off_unless_asked(finetune_recipe_data, write_recipe):
    assert not load_recipe(write_recipe(finetune_recipe_data)).training.split_by_length
    recipe = load_recipe(write_recipe(finetune_recipe_data), ["training.split_by_length=true"])
    assert recipe.training.split_by_length
    keys = {row[0]: row for row in describe_keys(FinetuneRecipe)}
    assert keys["training.split_by_length"][1:3] == ("bool", "False")


@pytest.mark.parametrize(
    ("key", "value"),
    [("group_by_length", False), ("group_chunk_batches", 8), ("split_by_length", True), ("skip_padding", False)],
)
def test_batching_keys_of_a_pretrain_recipe_are_refused_not_ignored(pretrain_recipe_data, write_recipe, key, value):
    """Set to anything but their defaults (which a saved recipe holds, and which change nothing)."""
    pretrain_recipe_data["training"][key] = value
    message, _ = _error_for(pretrain_recipe_data, write_recipe)
    assert f"training.{key}: for finetune recipes" in message


def test_awd_lstm_embedding_init_range_reaches_the_built_model(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["model"] = {
        "family": "awd_lstm",
        "embedding_size": 16,
        "hidden": 24,
        "layers": 2,
        "embedding_init_range": 0.5,
    }
    recipe = load_recipe(write_recipe(pretrain_recipe_data))
    tokenizer = train_byte_level_bpe(["a few words of text to learn pieces from"] * 4, 300)
    torch.manual_seed(0)
    model = build_language_model(recipe.model, tokenizer, max_positions=64)
    embedding = model.awd_lstm.embedding.weight
    assert model.config.embedding_init_range == 0.5
    assert 0.45 < embedding.abs().max() <= 0.5  # uniform in [-0.5, 0.5], not fastai's [-0.1, 0.1]
    assert model.decoder.weight is embedding  # tied: the decoder starts from the same draw
