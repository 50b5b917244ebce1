"""Gradual unfreezing by optimizer steps (`unfreezing.every_steps`) or by fraction of the run (`every_fraction`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification
from typer.testing import CliRunner

from finetune.cli import app
from finetune.models.backbones import layer_groups
from finetune.recipes import load_recipe, recipe_to_yaml
from finetune.reporting.plots import (
    PLOTS_DIR,
    UNFREEZE_MARK,
    is_trainable,
    learning_rate_figure,
    unfreezing_marks,
    write_plots,
)
from finetune.run_dir import read_metrics
from finetune.stages.finetune import run_finetune
from finetune.training import loop as loop_module
from finetune.training.checkpoints import PROGRESS_FILE, TRAINING_STATE_DIR, latest_training_checkpoint
from finetune.training.unfreezing import GradualUnfreezing, thaw_interval, trainable_group_count_at_step
from tests.cli.test_distributed import check_two_processes, torchrun
from tests.conftest import REPO_ROOT, custom_task_section, finetune_recipe, save_tiny_masked_lm, write_task, write_yaml
from tests.training.test_resume_finetune import Stopped, assert_same_run, resumable_recipe, stop_after_checkpoint
from tests.training.test_resume_logs import metrics_text_without_throughput

runner = CliRunner()
QUICKSTART_TASK = REPO_ROOT / "data" / "quickstart" / "task"


def unfreeze_records(run_dir: Path) -> list[dict]:
    return [record for record in read_metrics(run_dir / "metrics.jsonl") if record["phase"] == "unfreeze"]


def stepwise_recipe(checkpoint: Path, task: Path, run_dir: Path, unfreezing: dict) -> dict:
    data = finetune_recipe(checkpoint, task, run_dir)
    data["unfreezing"] = {"mode": "gradual", "initial_groups": 1, **unfreezing}
    return data


# ---------------------------------------------------------------------------------------------
# The pure functions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "groups, initial, interval, counts",
    [
        (4, 1, 2, [1, 1, 2, 2, 3, 3, 4, 4, 4, 4]),  # steps 1-2 train the head, 3-4 two groups, ...
        (5, 2, 3, [2, 2, 2, 3, 3, 3, 4, 4, 4, 5]),
        (3, 1, 1, [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]),
        (4, 4, 2, [4] * 10),  # everything trainable from the start: nothing to thaw
    ],
)
def test_trainable_count_is_a_function_of_the_steps_taken(groups, initial, interval, counts):
    assert [trainable_group_count_at_step(step, groups, initial, interval) for step in range(10)] == counts


@pytest.mark.parametrize(
    "total_steps, every_steps, every_fraction, interval",
    [
        (100, 7, None, 7),
        (100, None, 0.1, 10),
        (40, None, 0.3, 12),
        (7, None, 0.3, 2),  # 2.1 steps, rounded
        (10, None, 0.01, 1),  # never below one step
        (10, None, 1.0, 10),  # one thaw, after the whole run: only initial_groups ever train
        (10, None, None, None),  # per epoch
    ],
)
def test_thaw_interval(total_steps, every_steps, every_fraction, interval):
    assert thaw_interval(total_steps, every_steps, every_fraction) == interval


def test_a_fraction_of_a_tenth_thaws_four_groups_by_30_percent_of_the_run():
    interval = thaw_interval(200, every_fraction=0.1)
    counts = [trainable_group_count_at_step(step, 4, 1, interval) for step in range(200)]
    assert counts.index(4) == 60  # the first step with all groups is step 61 (60 steps taken)


# ---------------------------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------------------------


def group_names(checkpoint: Path) -> list[list[str]]:
    """The safetensors names of each layer group (bottom to top) of a saved classifier."""
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return [[names[id(parameter)] for parameter in group] for group in layer_groups(model)]


@pytest.mark.usefixtures("plots_drawn")
def test_every_2_steps_on_the_quickstart_task_thaws_at_those_steps_and_frozen_weights_stay(pretrained, tmp_path):
    """8 steps, 4 groups, a checkpoint after every step: group g trains from step 2 x (3 - g) + 1 on, not before."""
    data = stepwise_recipe(pretrained, QUICKSTART_TASK, tmp_path / "run", {"every_steps": 2})
    data["task"] = {**custom_task_section(QUICKSTART_TASK), "name": "quickstart-sentiment"}
    data["training"].update(epochs=1, max_steps=8, log_every=1)
    data.update(checkpoint_every=1, keep_checkpoints=8)
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    records = unfreeze_records(run)
    assert [(record["step"], record["trainable_groups"]) for record in records] == [(0, 1), (2, 2), (4, 3), (6, 4)]
    assert all(record["epoch"] == 0 and record["total_groups"] == 4 for record in records)

    names = group_names(run / "checkpoint")
    weights = {step: load_file(run / "checkpoints" / f"step-{step:08d}" / "model.safetensors") for step in range(1, 9)}
    for group, group_names_ in enumerate(names):
        first_trained = 2 * (3 - group) + 1
        for step in range(2, 9):  # did the weights change in optimizer step `step`?
            changed = any(not torch.equal(weights[step][name], weights[step - 1][name]) for name in group_names_)
            assert changed == (step >= first_trained), (group, step)
            # The plots read the same story from metrics.jsonl alone.
            assert is_trainable(group, step, records) == (step >= first_trained), (group, step)

    all_records = read_metrics(run / "metrics.jsonl")
    assert unfreezing_marks(all_records) == [(2, 2, 4), (4, 3, 4), (6, 4, 4)]
    figure = learning_rate_figure(all_records)
    assert [line.get_xdata()[0] for line in figure.axes[0].get_lines() if line.get_gid() == UNFREEZE_MARK] == [2, 4, 6]
    assert (run / PLOTS_DIR / "learning_rates.png").is_file()  # the run drew its plots; `finetune plot` redraws
    assert sorted(path.name for path in write_plots(run)) == sorted(path.name for path in (run / PLOTS_DIR).iterdir())


def test_a_fraction_of_the_run_and_the_epoch_mode_records(pretrained, task_dir, tmp_path):
    """10 steps (2 epochs of 5), every_fraction 0.3: a thaw every 3 steps, the records' epochs those of the steps."""
    data = stepwise_recipe(pretrained, task_dir, tmp_path / "run", {"every_fraction": 0.3})
    run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    records = unfreeze_records(tmp_path / "run")
    assert [(record["step"], record["epoch"], record["trainable_groups"]) for record in records] == [
        (0, 0, 1),
        (3, 0, 2),
        (6, 1, 3),
        (9, 1, 4),
    ]


@pytest.mark.parametrize(
    "every_steps, checkpoint_every, stop",
    [(4, 4, 8), (5, 5, 10)],
    ids=["thaw-at-the-checkpoint-mid-epoch", "thaw-at-the-checkpoint-at-an-epoch-end"],
)
def test_resume_reproduces_the_run_and_its_unfreeze_records(
    pretrained, task_dir, tmp_path, monkeypatch, every_steps, checkpoint_every, stop
):
    """Stopped right after the checkpoint of a step that thaws a group (its record comes after the checkpoint):
    the resumed run logs that record, freezes what the stopped run froze, and ends bit for bit the same."""

    def recipe(run_dir: Path) -> dict:
        data = resumable_recipe(
            pretrained, task_dir, run_dir, checkpoint_every=checkpoint_every, early_stopping_patience=None
        )  # all 15 steps
        data["unfreezing"] = {"mode": "gradual", "initial_groups": 1, "every_steps": every_steps}
        data["training"]["log_every"] = 3
        return data

    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", recipe(tmp_path / "full"))))
    path = write_yaml(tmp_path / "resumed.yaml", recipe(tmp_path / "resumed"))
    stop_after_checkpoint(monkeypatch, stop)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(path))
    monkeypatch.undo()
    progress = json.loads(
        (latest_training_checkpoint(tmp_path / "resumed") / TRAINING_STATE_DIR / PROGRESS_FILE).read_text(
            encoding="utf-8"
        )
    )
    assert progress["step"] == stop
    assert stop not in [record["step"] for record in unfreeze_records(tmp_path / "resumed")]  # not yet written
    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert [record["step"] for record in unfreeze_records(tmp_path / "full")] == list(range(0, 15, every_steps))[:4]
    assert unfreeze_records(tmp_path / "full") == unfreeze_records(tmp_path / "resumed")
    assert metrics_text_without_throughput(tmp_path / "full") == metrics_text_without_throughput(tmp_path / "resumed")
    assert_same_run(tmp_path / "full", tmp_path / "resumed")


def watch_the_loop(monkeypatch) -> list[str]:
    """What the loop runs, in order: "step N" for each step-wise thaw (on_step_begin), "batch" for each
    micro-batch."""
    events = []
    train_epoch = loop_module.TrainingLoop.train_epoch
    thaw = GradualUnfreezing.on_step_begin

    def watched(self, loader, epoch, compute_loss, *arguments, **keywords):
        def counting_loss(model, batch):
            events.append("batch")
            return compute_loss(model, batch)

        return train_epoch(self, loader, epoch, counting_loss, *arguments, **keywords)

    def recorded_thaw(self, loop, control, epoch):
        if self.thaw_every is not None:
            events.append(f"step {loop.step}")
        thaw(self, loop, control, epoch)

    monkeypatch.setattr(loop_module.TrainingLoop, "train_epoch", watched)
    monkeypatch.setattr(GradualUnfreezing, "on_step_begin", recorded_thaw)
    return events


def test_thawing_waits_for_the_end_of_an_accumulation_cycle(
    pretrained_without_dropout, task_dir, tmp_path, monkeypatch
):
    """Batches of 8, or 2 accumulated micro-batches of 4, thawing every 2 steps: the hook runs once per optimizer
    step, before its first micro-batch, and both runs end with the same weights (a thaw inside a cycle would
    leave the micro-batches before it without a gradient for the newly thawed group)."""
    weights = {}
    events = watch_the_loop(monkeypatch)
    for batch_size, accumulation in ((8, 1), (4, 2)):
        events.clear()
        data = stepwise_recipe(
            pretrained_without_dropout, task_dir, tmp_path / f"run-{accumulation}", {"every_steps": 2}
        )
        data.update({"classifier_dropout": 0.0, "keep_best": False})
        data["training"].update(
            {
                "batch_size": batch_size,
                "gradient_accumulation_steps": accumulation,
                "max_grad_norm": None,
                "group_by_length": False,
            }
        )
        checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / f"run-{accumulation}.yaml", data)))
        weights[accumulation] = load_file(checkpoint / "model.safetensors")
        assert [record["step"] for record in unfreeze_records(tmp_path / f"run-{accumulation}")] == [0, 2, 4, 6]
        # 2 epochs of 5 steps; each step's micro-batches follow its hook call.
        assert events == [event for step in range(10) for event in [f"step {step}"] + ["batch"] * accumulation]
    for name, tensor in weights[1].items():
        assert torch.allclose(tensor, weights[2][name], atol=1e-5), name


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
@pytest.mark.slow
def test_every_steps_on_two_processes(tmp_path):
    """torchrun, 2 CPU processes: 3 steps per epoch, 6 in all; every process freezes the same groups (DDP would
    hang or fail otherwise) and the main process logs one record per change."""
    checkpoint = save_tiny_masked_lm(tmp_path / "pretrained")
    data = stepwise_recipe(checkpoint, write_task(tmp_path / "task"), tmp_path / "run", {"every_steps": 2})
    result = torchrun(tmp_path, "finetune", str(write_yaml(tmp_path / "finetune.yaml", data)))
    check_two_processes(result)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    records = unfreeze_records(tmp_path / "run")
    assert [(record["step"], record["trainable_groups"]) for record in records] == [(0, 1), (2, 2), (4, 3)]


def test_the_quickstart_recipe_switches_to_steps_with_two_overrides():
    """Its per-epoch groups_per_epoch must go (null) for every_steps; the saved recipe reloads for --resume."""
    path = REPO_ROOT / "recipes" / "quickstart" / "finetune.yaml"
    recipe = load_recipe(path, ["unfreezing.groups_per_epoch=null", "unfreezing.every_steps=20"], check_paths=False)
    assert (recipe.unfreezing.every_steps, recipe.unfreezing.groups_per_epoch) == (20, None)
    saved = yaml.safe_load(recipe_to_yaml(recipe))
    assert type(recipe).model_validate(saved) == recipe
    assert load_recipe(path, check_paths=False).unfreezing.groups_per_epoch == 1  # per epoch, as before
