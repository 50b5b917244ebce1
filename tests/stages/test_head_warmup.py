"""`head_warmup`: a continued checkpoint's fresh language-model head trains alone before the rest of the model
(stages/head_warmup.py, run as the driver's WarmupPhase): the decision, what trains when, --resume inside and after
the phase, the refusals and the printed line, on tiny BERTs saved with and without their masked-LM head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
from typer.testing import CliRunner

from finetune.cli import app
from finetune.models.language_models import own_head_parameters
from finetune.recipes import load_recipe
from finetune.stages.head_warmup import AUTO_STEPS, may_warm_up, planned_steps
from finetune.stages.pretrain import run_pretrain
from finetune.training.schedules import linear_warmup_decay
from tests.conftest import interrupted_at_step, one_error_line, pretrain_recipe, write_yaml
from tests.stages.test_continued_pretraining import base_checkpoint
from tests.stages.test_pretrain_families import comparable_metrics
from tests.tiny_families import save_tiny_checkpoint

runner = CliRunner()
AUTO_LINE = (
    "head_warmup: 100 steps of the fresh masked-LM head alone at lr 0.001 before the encoder trains (auto: the "
    "checkpoint holds no language-model head; a random head's first gradients move the encoder's embeddings, "
    "bench/stage2_drift.py)"
)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    """Tiny BERTs (hidden 32, 2 layers, dropout 0.1) saved once: `encoder` without a masked-LM head (as
    all-MiniLM-L6-v2 ships), `masked_lm` with one, beside the corpus they were trained on (`corpus`)."""
    folder = tmp_path_factory.mktemp("head_warmup")
    encoder = base_checkpoint(folder / "without", with_head=False)
    return {
        "encoder": encoder,
        "masked_lm": base_checkpoint(folder / "with", with_head=True),
        "corpus": folder / "without" / "corpus" / "train.txt",
    }


def recipe_file(bases: dict[str, Path], folder: Path, base: str | None = "encoder", **keys) -> Path:
    """A pretrain recipe continuing `bases[base]` (None: from scratch) for 4 steps, logged every step, into
    folder/run; `keys` set top-level sections (a dict updates the recipe's own)."""
    data = pretrain_recipe(bases["corpus"], folder / "run")
    if base is not None:
        data["model"] = {"family": "bert", "checkpoint": str(bases[base])}
    data["training"].update(max_steps=4, log_every=1)
    for key, value in keys.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return write_yaml(folder / "recipe.yaml", data)


def records(run_dir: Path, phase: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record["phase"] == phase]


def test_auto_warms_up_a_fresh_head_for_100_steps_and_says_so(bases, tmp_path):
    result = runner.invoke(app, ["pretrain", str(recipe_file(bases, tmp_path, training={"max_steps": 2}))])
    assert result.exit_code == 0, result.output
    assert AUTO_LINE in result.output.splitlines()
    warmup = records(tmp_path / "run", "head_warmup")
    assert [record["step"] for record in warmup] == list(range(1, AUTO_STEPS + 1))
    assert [record["step"] for record in records(tmp_path / "run", "train")] == [1, 2]
    card = (tmp_path / "run" / "checkpoint" / "README.md").read_text(encoding="utf-8")
    assert "first trained alone for 100 steps at lr 0.001 (`head_warmup`)" in card


def test_auto_leaves_a_checkpoint_with_its_head_as_it_was(bases, tmp_path):
    result = runner.invoke(app, ["pretrain", str(recipe_file(bases, tmp_path, "masked_lm", training={"max_steps": 1}))])
    assert result.exit_code == 0, result.output
    assert "head_warmup: none (auto: the checkpoint holds its language-model head)" in result.output.splitlines()
    assert records(tmp_path / "run", "head_warmup") == []
    assert "(`head_warmup`)" not in (tmp_path / "run" / "checkpoint" / "README.md").read_text(encoding="utf-8")


def test_the_decision_for_each_kind_of_start(bases, tmp_path):
    """auto: 100 for a head-less checkpoint whose head has weights of its own (a masked LM's transform and bias; an
    untied decoder's output layer), 0 with the head, from scratch (AWD-LSTM too) and for a head that is only the tied
    input embedding (GPT-2's); a set number stays; DDP is warned of frozen parameters only where a warm-up may run."""
    encoder, masked_lm = (load_recipe(recipe_file(bases, tmp_path / name, name)) for name in ("encoder", "masked_lm"))
    scratch = load_recipe(recipe_file(bases, tmp_path / "scratch", None))
    bert_head = own_head_parameters(AutoModelForMaskedLM.from_pretrained(bases["encoder"]))
    assert len(bert_head) == 5  # transform dense weight and bias, its LayerNorm's two, the output bias
    assert planned_steps(encoder, bert_head)[0] == AUTO_STEPS and may_warm_up(encoder)
    assert planned_steps(masked_lm, bert_head)[0] == 0 and not may_warm_up(masked_lm)
    assert planned_steps(scratch, bert_head)[0] == 0 and not may_warm_up(scratch)
    awd_lstm = pretrain_recipe(bases["corpus"], tmp_path / "awd")
    awd_lstm["model"] = {"family": "awd_lstm", "embedding_size": 16, "hidden": 16, "layers": 2}
    awd_lstm_recipe = load_recipe(write_yaml(tmp_path / "awd.yaml", awd_lstm))
    assert planned_steps(awd_lstm_recipe, [])[0] == 0 and not may_warm_up(awd_lstm_recipe)
    set_steps = load_recipe(recipe_file(bases, tmp_path / "set", "masked_lm", head_warmup={"steps": 7}))
    assert planned_steps(set_steps, bert_head) == (7, "set in the recipe") and may_warm_up(set_steps)
    off = load_recipe(recipe_file(bases, tmp_path / "off", head_warmup={"steps": 0}))
    assert planned_steps(off, bert_head)[0] == 0 and not may_warm_up(off)
    for model_type, steps in (("llama", AUTO_STEPS), ("gpt2", 0)):  # llama unties its output layer, gpt2 ties it
        folder = save_tiny_checkpoint(tmp_path / model_type, model_type, head="base")
        data = pretrain_recipe(bases["corpus"], tmp_path / f"run-{model_type}")
        data["model"] = {"family": "gpt2", "checkpoint": str(folder)}
        recipe = load_recipe(write_yaml(tmp_path / f"{model_type}.yaml", data))
        head = own_head_parameters(AutoModelForCausalLM.from_pretrained(folder))
        assert planned_steps(recipe, head)[0] == steps, model_type


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_the_encoder_is_frozen_while_the_head_warms_up_then_every_weight_trains(bases, tmp_path):
    """Checkpoints every 2 steps of 4 warm-up steps, then 2 training steps: every encoder weight at the warm-up's
    checkpoints is the shipped one and the head moved between them; the training moves every weight, under its own
    schedule from its own step 0."""
    path = recipe_file(
        bases, tmp_path, head_warmup={"steps": 4}, training={"max_steps": 2}, checkpoint_every=2, keep_checkpoints=10
    )
    result = runner.invoke(app, ["pretrain", str(path)])
    assert result.exit_code == 0, result.output
    shipped = load_file(bases["encoder"] / "model.safetensors")  # a BertModel's: no "bert." prefix
    checkpoints = tmp_path / "run" / "checkpoints"
    middle, end = weights(checkpoints / "head_warmup-step-00000002"), weights(checkpoints / "head_warmup-step-00000004")
    trained = weights(checkpoints / "step-00000002")
    encoder = [name for name in end if name.startswith("bert.")]
    head = [name for name in end if name.startswith("cls.")]
    assert encoder and head
    for name in encoder:
        assert torch.equal(middle[name], shipped[name.removeprefix("bert.")]), name
        assert torch.equal(end[name], shipped[name.removeprefix("bert.")]), name
    for name in head:
        assert not torch.equal(middle[name], end[name]), name
    for name in encoder + head:
        assert not torch.equal(end[name], trained[name]), name
    train = records(tmp_path / "run", "train")
    assert [record["epoch"] for record in train] == [0, 0]
    top_lrs = [record["lr"]["group_3"] for record in train]  # the top group's: the recipe's lr 1e-3 scheduled
    assert top_lrs == [pytest.approx(1e-3 * linear_warmup_decay(step, 2, 0.1)) for step in (0, 1)]
    assert set(records(tmp_path / "run", "head_warmup")[0]["lr"]) == {"group_3"}  # the head's group alone


class Stopped(Exception):
    """Stands for the run being killed right after a periodic checkpoint."""


@pytest.mark.parametrize(
    "phase, step", [("head_warmup", 4), ("head_warmup", 6), ("train", 2)], ids=["inside", "at-its-end", "after"]
)
def test_a_run_stopped_inside_or_after_the_warmup_resumes_bit_for_bit(bases, tmp_path, phase, step):
    """6 warm-up steps, 4 training steps, a checkpoint every 2 (2 kept), dropout on: stopped after the warm-up's
    step 4, its last step, or the training's step 2, then resumed: the unbroken run's weights and metrics."""

    def recipe(name: str):
        keys = {"head_warmup": {"steps": 6}, "checkpoint_every": 2, "eval_every": 2}
        return load_recipe(recipe_file(bases, tmp_path / name, **keys))

    run_pretrain(recipe("full"))
    stopped = recipe("stopped")
    with interrupted_at_step(step, Stopped, phase):
        run_pretrain(stopped)
    run_pretrain(stopped, resume=True)
    full, resumed = (
        weights(tmp_path / "full" / "run" / "checkpoint"),
        weights(tmp_path / "stopped" / "run" / "checkpoint"),
    )
    assert full.keys() == resumed.keys() and all(torch.equal(full[name], resumed[name]) for name in full)
    assert comparable_metrics(tmp_path / "full" / "run") == comparable_metrics(tmp_path / "stopped" / "run")


def test_a_lora_run_warms_up_the_heads_copy_with_its_matrices_frozen(bases, tmp_path):
    """With model.adapter the head's trained copy warms up alone: LoRA's B matrices, zero at the start, are still zero
    at the warm-up's end, and move once the training starts."""
    path = recipe_file(
        bases,
        tmp_path,
        head_warmup={"steps": 2},
        training={"max_steps": 2},
        model={"adapter": "lora"},
        checkpoint_every=2,
        keep_checkpoints=10,
    )
    result = runner.invoke(app, ["pretrain", str(path)])
    assert result.exit_code == 0, result.output
    checkpoints = tmp_path / "run" / "checkpoints"
    warmed = load_file(checkpoints / "head_warmup-step-00000002" / "adapter_model.safetensors")
    trained = load_file(checkpoints / "step-00000002" / "adapter_model.safetensors")
    lora_b = [name for name in warmed if "lora_B" in name]
    head = [name for name in warmed if "cls.predictions.transform" in name]
    assert lora_b and head
    assert all(not warmed[name].any() for name in lora_b) and all(trained[name].any() for name in lora_b)
    assert all(not torch.equal(warmed[name], trained[name]) for name in head)


@pytest.mark.parametrize(
    "base, override, expected",
    [
        ("encoder", "head_warmup.steps=-1", "head_warmup.steps: Input should be greater than or equal to 0"),
        ("encoder", "head_warmup.lr=0", "head_warmup.lr: Input should be greater than 0"),
        (None, "head_warmup.steps=5", "head_warmup.steps: 5 steps of the head alone protect a pretrained model"),
    ],
    ids=["negative-steps", "zero-lr", "from-scratch"],
)
def test_bad_head_warmup_keys_are_one_line_naming_the_key_and_leave_no_run_folder(
    bases, tmp_path, base, override, expected
):
    line = one_error_line(runner.invoke(app, ["pretrain", str(recipe_file(bases, tmp_path, base)), override]))
    assert expected in line
    assert not (tmp_path / "run").exists()


def test_a_head_that_is_only_the_tied_embedding_has_nothing_to_warm_up(bases, tmp_path):
    """A GPT-2 saved without its LM head: the head is the input embedding (tied), so steps > 0 would train nothing."""
    folder = save_tiny_checkpoint(tmp_path / "gpt2", "gpt2", head="base")
    data = pretrain_recipe(bases["corpus"], tmp_path / "run")
    data["model"] = {"family": "gpt2", "checkpoint": str(folder)}
    data["head_warmup"] = {"steps": 3}
    line = one_error_line(runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "gpt2.yaml", data))]))
    assert "head_warmup.steps: the language-model head of" in line and "has no parameters of its own" in line
    assert not (tmp_path / "run").exists()
