"""bench/stage2_drift.py: its stage-2 runs are the shipped recipe with valid keys, and it probes every saved step."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

from finetune.recipes import load_recipe
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import stage2_drift  # bench/ scripts are top-level modules, imported as they import each other


def test_both_arms_are_the_stage_2_recipe_with_keys_it_takes(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO_ROOT)  # the recipe names its data from the project root
    for head_first in (0, 40):
        args = Namespace(steps=100, every=25, head_first=head_first)
        overrides = stage2_drift.stage_two_overrides(args, tmp_path, "m")
        stage2 = load_recipe(stage2_drift.RECIPE, overrides, check_paths=False)
        assert (stage2.training.max_steps, stage2.checkpoint_every, stage2.eval_every) == (100, 25, 25)
        assert stage2.keep_checkpoints == 5 and stage2.model.checkpoint == "m"
        assert stage2.training.lr == 1e-4  # the recipe's own (TAPT's) rate: the run is stage 2 as shipped
        assert stage2.head_warmup.steps == head_first  # 0: as stage 2 ran before head_warmup (auto: 100 now)


def test_the_probed_steps_are_the_shipped_model_each_kept_checkpoint_and_the_last(tmp_path):
    for step in (50, 25):
        (tmp_path / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step:08d}" / "config.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-00000075.partial").mkdir()  # a save cut short: not a checkpoint
    steps = stage2_drift.saved_steps(tmp_path, "shipped", 100)
    assert list(steps) == [0, 25, 50, 100]
    assert steps[0] == Path("shipped") and steps[100] == tmp_path / "checkpoint"


def test_a_rerun_replaces_its_arms_points_and_leaves_the_other_arm():
    records = [
        {"head_first": 0, "step": 0, "probe_accuracy": [0.6]},
        {"head_first": 100, "step": 0, "probe_accuracy": [0.7]},
        {"head_first": 0, "step": 0, "probe_accuracy": [0.5]},  # the plain arm again
    ]
    latest = stage2_drift.latest_per_arm(records)
    assert [(record["head_first"], record["probe_accuracy"]) for record in latest] == [(0, [0.5]), (100, [0.7])]
