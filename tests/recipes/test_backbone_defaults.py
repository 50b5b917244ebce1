"""A minimal finetune recipe gets the techniques measured best for its backbone: the plain recipe for a pretrained
transformer (mean pooling for a sentence-embedding checkpoint), ULMFiT's for the AWD-LSTM; each run says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.training.techniques import Backbone, backbone_defaults, describe_backbone, resolve_techniques
from tests.commands.test_profile import save_tiny_awd_lstm
from tests.conftest import custom_task_section, save_tiny_masked_lm, write_yaml

runner = CliRunner()


def minimal_recipe(checkpoint: Path, task: Path, run_dir: Path, **extra) -> dict:
    """What a newcomer writes: a checkpoint, the data, the columns and labels; nothing about the techniques."""
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "model": {"checkpoint": str(checkpoint)},
        "task": custom_task_section(task),
        "training": {"epochs": 1, "batch_size": 8, "device": "cpu"},
        **extra,
    }


def resolved(data: dict, tmp_path: Path, *overrides: str):
    recipe = load_recipe(write_yaml(tmp_path / "recipe.yaml", data), list(overrides))
    return resolve_techniques(recipe, describe_backbone(recipe.model.checkpoint))


def with_sentence_transformers_pooling(checkpoint: Path, mode: str = "mean") -> Path:
    """The files sentence-transformers saves beside a model: modules.json and the Pooling module's config."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (checkpoint / "modules.json").write_text(json.dumps(modules))
    (checkpoint / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{name}": name.startswith(mode) for name in ("cls_token", "mean_tokens", "max_tokens")}
    (checkpoint / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))
    return checkpoint


def test_a_pretrained_transformer_gets_the_plain_recipe(pretrained, task_dir, tmp_path):
    techniques = resolved(minimal_recipe(pretrained, task_dir, tmp_path / "run"), tmp_path)
    recipe = techniques.recipe
    assert (
        recipe.training.lr,
        recipe.discriminative.factor,
        recipe.unfreezing.mode,
        recipe.schedule.kind,
        recipe.pooling,
    ) == (1e-4, 1.0, "none", "linear", "model")
    assert set(techniques.sources.values()) == {"default for a bert transformer"}


def test_a_sentence_embedding_checkpoint_is_read_by_mean_pooling(tmp_path, task_dir):
    checkpoint = with_sentence_transformers_pooling(save_tiny_masked_lm(tmp_path / "st"))
    techniques = resolved(minimal_recipe(checkpoint, task_dir, tmp_path / "run"), tmp_path)
    assert techniques.recipe.pooling == "mean"
    assert "sentence-embedding" in techniques.sources["pooling"]
    cls_checkpoint = with_sentence_transformers_pooling(save_tiny_masked_lm(tmp_path / "st-cls"), "cls")
    assert resolved(minimal_recipe(cls_checkpoint, task_dir, tmp_path / "run"), tmp_path).recipe.pooling == "model"


def test_the_awd_lstm_keeps_ulmfits_techniques(tmp_path, task_dir):
    checkpoint = save_tiny_awd_lstm(tmp_path / "lstm")
    recipe = resolved(minimal_recipe(checkpoint, task_dir, tmp_path / "run"), tmp_path).recipe
    assert (
        recipe.training.lr,
        recipe.discriminative.factor,
        recipe.unfreezing.mode,
        recipe.schedule.kind,
        recipe.pooling,
    ) == (1e-2, 2.6, "gradual", "stlr", "model")


def test_base_sized_transformers_get_a_smaller_lr():
    assert backbone_defaults(Backbone("roberta", 768, None))["training.lr"][0] == 3e-5
    assert backbone_defaults(Backbone("bert", 384, "mean"))["training.lr"][0] == 1e-4


def test_what_the_recipe_sets_is_kept_and_said(pretrained, task_dir, tmp_path):
    techniques = resolved(
        minimal_recipe(pretrained, task_dir, tmp_path / "run"),
        tmp_path,
        "discriminative.factor=2.6",
        "pooling=mean",
        "training.lr=3e-3",
    )
    recipe = techniques.recipe
    assert (recipe.discriminative.factor, recipe.pooling, recipe.training.lr) == (2.6, "mean", 3e-3)
    assert techniques.sources["discriminative.factor"] == techniques.sources["pooling"] == "set"
    assert recipe.unfreezing.mode == "none"


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("schedule.cut_frac=0.2", "schedule.kind", "stlr"),
        ("schedule.pct_start=0.3", "schedule.kind", "one_cycle"),
        ("unfreezing.every_fraction=0.1", "unfreezing.mode", "gradual"),
        ("unfreezing.schedule=[1, 2]", "unfreezing.mode", "gradual"),
        ("unfreezing.groups_per_epoch=2", "unfreezing.mode", "gradual"),
    ],
)
def test_an_open_kind_is_read_from_the_keys_the_section_changes(pretrained, task_dir, tmp_path, override, key, value):
    techniques = resolved(minimal_recipe(pretrained, task_dir, tmp_path / "run"), tmp_path, override)
    section, name = key.split(".")
    assert getattr(getattr(techniques.recipe, section), name) == value
    assert techniques.sources[key] == f"from {override.split('=')[0]}"


def test_keys_of_two_schedule_kinds_are_refused(pretrained, task_dir, tmp_path):
    with pytest.raises(UserError, match=r"schedule\.cut_frac, schedule\.warmup_fraction belong to different"):
        resolved(
            minimal_recipe(pretrained, task_dir, tmp_path / "run"),
            tmp_path,
            "schedule.cut_frac=0.2",
            "schedule.warmup_fraction=0.2",
        )


def test_a_run_prints_its_techniques_and_saves_them_resolved(pretrained, task_dir, tmp_path):
    recipe_path = write_yaml(tmp_path / "recipe.yaml", minimal_recipe(pretrained, task_dir, tmp_path / "run"))
    result = runner.invoke(app, ["finetune", str(recipe_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.split("techniques:\n", 1)[1].splitlines()[:5]
    assert lines[0].split() == ["peak", "lr", "0.0001", "default", "for", "a", "bert", "transformer"]
    assert lines[2].split()[:3] == ["unfreezing:", "none", "(every"]
    saved = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert (saved["schedule"]["kind"], saved["unfreezing"]["mode"], saved["pooling"]) == ("linear", "none", "model")
    # Every group trained from the first step, with one LR.
    unfreeze = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "unfreeze"]
    assert unfreeze[0]["trainable_groups"] == unfreeze[0]["total_groups"]
    train = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "train"]
    assert len(set(train[-1]["lr"].values())) == 1
    # The same minimal recipe is the run's recipe: --resume of the finished run finds nothing changed.
    again = runner.invoke(app, ["finetune", str(recipe_path), "--resume"])
    assert again.exit_code == 0, again.output
    assert "finished before: nothing to resume" in " ".join(again.output.split())


def test_profile_decides_the_techniques_as_the_run_does(pretrained, task_dir, tmp_path):
    recipe_path = write_yaml(tmp_path / "recipe.yaml", minimal_recipe(pretrained, task_dir, tmp_path / "run"))
    result = runner.invoke(app, ["profile", str(recipe_path), "--matmul-gflops", "100", "--json"])
    assert result.exit_code == 0, result.output
    parameters = json.loads(result.stdout)["parameters"]
    assert parameters["trainable_groups_at_start"] == parameters["layer_groups"]


def test_a_gradual_unfreezing_that_cannot_thaw_every_group_says_so(pretrained, task_dir, tmp_path):
    data = minimal_recipe(pretrained, task_dir, tmp_path / "run", unfreezing={"mode": "gradual"})
    data["training"]["max_steps"] = 7  # 2 epochs of 5 steps: 2 of the 4 groups ever train
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    assert (
        "note: gradual unfreezing thaws one more group per epoch; in 2 epoch(s) 2 of the 4 layer groups train "
        "and the lowest 2 never do"
    ) in " ".join(result.output.split())
    data["training"]["max_steps"] = 20  # 4 epochs: every group thaws, nothing to say
    data["run_dir"] = str(tmp_path / "long")
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "long.yaml", data))])
    assert result.exit_code == 0 and "note: gradual unfreezing" not in result.output
