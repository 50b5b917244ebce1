"""`finetune ulmfit`: ULMFiT's three stages in one command, through the real CLI on the shipped quickstart recipe.

The flow runs once for the module (the quickstart recipe shrunk to a few steps by nested overrides) in a workspace
whose `data` links to the project's data, so that its relative paths survive copying the workspace: tests that
change a run work on a copy.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

import finetune.models.awd_lstm  # noqa: F401  (registers awd_lstm with the Auto classes)
from finetune.cli import app
from finetune.errors import UserError
from finetune.recipes import UlmfitRecipe, load_recipe, read_yaml
from finetune.recipes.loader import recipe_to_yaml
from finetune.run_dir import MARKER_FILE
from finetune.stages import ulmfit as ulmfit_stage
from finetune.training import loop as loop_module
from tests.conftest import REPO_ROOT, custom_task_section, write_yaml

runner = CliRunner()
QUICKSTART = REPO_ROOT / "recipes" / "quickstart" / "ulmfit.yaml"
RUN = Path("runs") / "flow"  # inside the workspace
STAGES = ("1-general-lm", "2-target-lm", "3-classifier")
FAST = (  # the quickstart flow in a few seconds: nested overrides reach into each stage
    "general_lm.training.max_steps=5",
    "general_lm.eval_every=null",
    "general_lm.corpus.cache_dir=null",
    "target_lm.training.epochs=1",
    "target_lm.corpus.cache_dir=null",
    "classifier.training.epochs=2",
)


def ulmfit_recipe(corpus: Path, task: Path, run_dir: Path) -> dict[str, Any]:
    """A tiny, valid ulmfit recipe on generated data (an AWD-LSTM of width 16-24, a few steps per stage)."""
    training = {"max_steps": 4, "batch_size": 8, "lr": 1e-3, "log_every": 1, "device": "cpu"}
    return {
        "stage": "ulmfit",
        "description": "tiny test flow",
        "run_dir": str(run_dir),
        "seed": 0,
        "general_lm": {
            "model": {"family": "awd_lstm", "embedding_size": 16, "hidden": 24, "layers": 2},
            "tokenizer": {"vocab_size": 300, "min_frequency": 1},
            "corpus": {"train_files": [str(corpus)], "validation_fraction": 0.1, "block_size": 16, "cache_dir": None},
            "training": dict(training),
        },
        "target_lm": {
            "tokenizer": {"new_vocabulary": True, "vocab_size": 300, "min_frequency": 1},
            "corpus": {
                "task": custom_task_section(task),
                "task_splits": ["train", "test"],
                "validation_fraction": 0.2,
                "block_size": 8,
                "cache_dir": None,
            },
            "training": dict(training),
            "discriminative": {"factor": 2.6},
        },
        "classifier": {
            "task": custom_task_section(task),
            "training": {"epochs": 2, "batch_size": 8, "lr": 2e-3, "log_every": 1, "device": "cpu"},
        },
    }


def flow(*arguments: str):
    """`finetune ulmfit` on the quickstart recipe into RUN (relative to the working folder), shrunk by FAST."""
    return runner.invoke(app, ["ulmfit", str(QUICKSTART), f"run_dir={RUN}", *FAST, *arguments])


def make_workspace(folder: Path) -> Path:
    """A working folder whose `data` is the project's: the quickstart recipe's relative paths resolve there."""
    folder.mkdir(parents=True)
    (folder / "data").symlink_to(REPO_ROOT / "data", target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace holding the finished quickstart flow in RUN (never changed by the tests: they copy it)."""
    folder = make_workspace(tmp_path_factory.mktemp("ulmfit") / "work")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        result = flow()
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture
def copied(workspace, tmp_path, monkeypatch) -> Path:
    """A copy of the finished workspace, made the working folder; returns the copied flow's run_dir."""
    copy = tmp_path / "work"
    shutil.copytree(workspace, copy, symlinks=True)
    monkeypatch.chdir(copy)
    return copy / RUN


def mtimes(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in sorted(folder.rglob("*"))}


class Stopped(Exception):
    """Raised right after a periodic checkpoint: the run stops there, as if killed."""


def stop_after_the_first_periodic_checkpoint(patch: pytest.MonkeyPatch) -> None:
    original_init = loop_module.TrainingLoop.__init__

    def init_that_stops(self, *arguments, **keywords):
        original_init(self, *arguments, **keywords)
        save = self.save_checkpoint

        def save_then_stop(progress):
            save(progress)
            raise Stopped

        self.save_checkpoint = save_then_stop

    patch.setattr(loop_module.TrainingLoop, "__init__", init_that_stops)


# ---------------------------------------------------------------------------------------------
# One command, three stages
# ---------------------------------------------------------------------------------------------


def test_three_stage_folders_with_checkpoints(workspace):
    run = workspace / RUN
    assert sorted(entry.name for entry in run.iterdir()) == sorted([*STAGES, MARKER_FILE, "recipe.yaml", "result.json"])
    for stage in STAGES:
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            assert (run / stage / "checkpoint" / name).is_file(), f"{stage}/checkpoint/{name}"
        assert (run / stage / "recipe.yaml").is_file() and (run / stage / MARKER_FILE).is_file()


def test_each_stage_starts_from_the_checkpoint_before(workspace):
    run = workspace / RUN
    saved = {stage: read_yaml(run / stage / "recipe.yaml") for stage in STAGES[1:]}  # what each stage ran
    assert Path(saved["2-target-lm"]["model"]["checkpoint"]) == RUN / "1-general-lm" / "checkpoint"
    assert Path(saved["3-classifier"]["model"]["checkpoint"]) == RUN / "2-target-lm" / "checkpoint"
    general, target = (AutoModelForCausalLM.from_pretrained(run / stage / "checkpoint") for stage in STAGES[:2])
    # Stage 2 continued stage 1's network (the quickstart's 64/128/2, not the recipe defaults) on a new vocabulary.
    for key in ("embedding_size", "hidden_size", "num_layers"):
        assert getattr(target.config, key) == getattr(general.config, key)
    assert target.config.embedding_size == 64
    target_vocabulary = AutoTokenizer.from_pretrained(run / "2-target-lm" / "checkpoint").get_vocab()
    assert AutoTokenizer.from_pretrained(run / "1-general-lm" / "checkpoint").get_vocab() != target_vocabulary
    assert AutoTokenizer.from_pretrained(run / "3-classifier" / "checkpoint").get_vocab() == target_vocabulary


def test_the_classifier_loads_with_transformers(workspace):
    checkpoint = workspace / RUN / "3-classifier" / "checkpoint"
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        logits = model(**tokenizer(["the acting was superb ."], return_tensors="pt")).logits
    assert logits.shape == (1, 2) and torch.isfinite(logits).all()


def test_summary_and_the_saved_flow_recipe(workspace):
    run = workspace / RUN
    summary = json.loads((run / "result.json").read_text())
    assert summary["target_lm"]["checkpoint"] == str(RUN / "2-target-lm" / "checkpoint")
    assert math.isfinite(summary["target_lm"]["validation_perplexity"]) and summary["general_lm"]["step"] == 5
    classifier = summary["classifier"]
    assert classifier["main_metric"] == "accuracy" and 0 <= classifier["dev"]["dev_accuracy"] <= 1
    result = json.loads((run / "3-classifier" / "result.json").read_text())
    assert classifier["dev"] == result["best"]
    # The flow's own recipe, saved without what the flow wires, loads again into the same stages.
    saved = load_recipe(run / "recipe.yaml", check_paths=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workspace)
        given = load_recipe(QUICKSTART, [f"run_dir={RUN}", *FAST])
    assert isinstance(saved, UlmfitRecipe) and saved.model_dump() == given.model_dump()
    assert saved.general_lm.seed == saved.classifier.seed == 0  # the top-level seed reached every stage


@pytest.mark.parametrize("task", ["sst2", "imdb"])
def test_a_shipped_flow_is_its_three_stage_recipes(task):
    """recipes/ulmfit/TASK.yaml runs exactly the three stage recipes, but for the wiring."""
    flow_recipe = load_recipe(REPO_ROOT / "recipes" / "ulmfit" / f"{task}.yaml", check_paths=False)
    separate = [
        load_recipe(REPO_ROOT / "recipes" / path, check_paths=False)
        for path in (
            "pretrain/awd-lstm-wikitext2.yaml",
            f"ulmfit/{task}-2-language-model.yaml",
            f"ulmfit/{task}-3-classifier.yaml",
        )
    ]
    # The flow's one task gives stage 2's corpus the classifier's max_length too, which a language model never reads.
    wiring = {
        "run_dir": True,
        "description": True,
        "model": {"checkpoint": True},
        "corpus": {"task": {"max_length": True}},
    }
    for stage, alone in zip(flow_recipe.stage_recipes().values(), separate):
        assert stage.model_dump(exclude=wiring) == alone.model_dump(exclude=wiring)


# ---------------------------------------------------------------------------------------------
# Reruns, --resume, and a general LM that is given
# ---------------------------------------------------------------------------------------------


def test_a_finished_flow_is_kept_without_overwrite(copied):
    before = mtimes(copied)
    result = flow("overwrite=false")
    assert result.exit_code == 2 and "already holds a finished run" in result.output, result.output
    result = flow("--resume")
    assert result.exit_code == 0 and "finished before: nothing to resume" in result.output, result.output
    assert mtimes(copied) == before


def test_overwrite_runs_every_stage_again_and_keeps_the_users_files(copied):
    (copied / "notes.txt").write_text("mine\n")
    before = {stage: mtimes(copied / stage / "checkpoint") for stage in STAGES}
    result = flow()  # the quickstart recipe says overwrite: true
    assert result.exit_code == 0, result.output
    assert "finished before" not in result.output
    for stage in STAGES:
        assert mtimes(copied / stage / "checkpoint").keys() == before[stage].keys()
        assert mtimes(copied / stage / "checkpoint") != before[stage], f"{stage} was not run again"
    assert (copied / "notes.txt").read_text() == "mine\n" and (copied / "result.json").is_file()


def test_a_user_mistake_found_by_the_first_stage_leaves_no_flow_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(make_workspace(tmp_path / "work"))

    def refuse(recipe, resume=False):
        raise UserError("noticed late")

    monkeypatch.setattr(ulmfit_stage, "run_pretrain", refuse)
    result = flow()
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == "error: noticed late", result.output
    assert not RUN.exists()


def test_resume_after_stage_3_stopped_runs_only_stage_3(copied, monkeypatch):
    shutil.rmtree(copied / "3-classifier")
    (copied / "result.json").unlink()
    finished = {stage: mtimes(copied / stage) for stage in STAGES[:2]}

    # A user mistake that only stage 3 finds: the finished stages stay, and the error says how to go on.
    def refuse(recipe, resume=False):
        raise UserError("task file broken")

    with monkeypatch.context() as patch:
        patch.setattr(ulmfit_stage, "run_finetune", refuse)
        result = flow("--resume")
    assert result.exit_code == 2 and "task file broken" in result.output, result.output
    assert "finished stages are kept" in result.output and (copied / MARKER_FILE).is_file()

    # Stopped in stage 3 right after its first periodic checkpoint ...
    with monkeypatch.context() as patch:
        stop_after_the_first_periodic_checkpoint(patch)
        result = flow("classifier.checkpoint_every=10", "--resume")
    assert isinstance(result.exception, Stopped), result.output
    assert result.output.count("finished before, kept") == 2
    assert (copied / "3-classifier" / "checkpoints" / "step-00000010").is_dir()

    # ... and --resume continues stage 3 from there; stages 1 and 2 are kept untouched.
    result = flow("classifier.checkpoint_every=10", "--resume")
    assert result.exit_code == 0, result.output
    assert result.output.count("finished before, kept") == 2 and "resuming from" in result.output
    assert {stage: mtimes(copied / stage) for stage in STAGES[:2]} == finished
    assert (copied / "3-classifier" / "checkpoint" / "model.safetensors").is_file()
    assert (copied / "result.json").is_file()


def test_resume_refuses_a_changed_finished_stage(copied):
    result = flow("target_lm.training.lr=0.5", "--resume")
    assert result.exit_code == 2, result.output
    assert "target_lm.training.lr changed" in result.output and result.output.count("\n") == 1


def test_a_given_general_lm_skips_stage_1(workspace, tmp_path, monkeypatch):
    """general_lm: {checkpoint: PATH} starts stage 2 from that model; rows of the pieces both vocabularies hold are
    the given model's (a learning rate of ~0 keeps them as they were mapped)."""
    monkeypatch.chdir(make_workspace(tmp_path / "work"))
    given = workspace / RUN / "1-general-lm" / "checkpoint"
    result = flow(f"general_lm={{checkpoint: {given}}}", "target_lm.training.lr=1e-12", "classifier.training.epochs=1")
    assert result.exit_code == 0, result.output
    assert sorted(path.name for path in RUN.iterdir() if path.is_dir()) == ["2-target-lm", "3-classifier"]
    assert read_yaml(RUN / "2-target-lm" / "recipe.yaml")["model"]["checkpoint"] == str(given)
    summary = json.loads((RUN / "result.json").read_text())
    assert summary["general_lm"] == {"checkpoint": str(given), "trained": False}
    before, after = (
        AutoModelForCausalLM.from_pretrained(path).get_input_embeddings().weight
        for path in (given, RUN / "2-target-lm" / "checkpoint")
    )
    old, new = (AutoTokenizer.from_pretrained(path).get_vocab() for path in (given, RUN / "2-target-lm" / "checkpoint"))
    shared = sorted(set(old) & set(new))
    assert len(shared) > 100
    assert torch.allclose(after[[new[token] for token in shared]], before[[old[token] for token in shared]], atol=1e-6)


def test_help_explains_the_three_stages():
    result = runner.invoke(app, ["ulmfit", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Stage 1" in result.output and "stage 2" in result.output and "stage 3" in result.output


def test_recipes_keys_ulmfit_points_at_the_stages_keys():
    result = runner.invoke(app, ["recipes", "--keys", "ulmfit"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for key in ("general_lm.*", "general_lm.checkpoint", "target_lm.*", "classifier.*", "--keys pretrain"):
        assert key in result.output


def test_a_tiny_generated_flow_recipe_validates(tmp_path):
    """The builder test_bad_input.py breaks row by row is valid as it is."""
    from tests.conftest import write_corpus, write_task

    data = ulmfit_recipe(write_corpus(tmp_path / "corpus"), write_task(tmp_path / "task"), tmp_path / "run")
    recipe = load_recipe(write_yaml(tmp_path / "flow.yaml", data))
    assert recipe.target_lm.model.family == "awd_lstm"  # stage 1's family, not written in the section
    assert recipe.classifier.model.checkpoint == str(tmp_path / "run" / "2-target-lm" / "checkpoint")


def test_resume_continues_a_stopped_stage_2(copied, monkeypatch):
    """Stopped in stage 2 after a periodic checkpoint: --resume keeps stage 1 and continues stage 2 from there."""
    shutil.rmtree(copied / "3-classifier")
    shutil.rmtree(copied / "2-target-lm")
    (copied / "result.json").unlink()
    with monkeypatch.context() as patch:
        stop_after_the_first_periodic_checkpoint(patch)
        result = flow("target_lm.checkpoint_every=2", "--resume")
    assert isinstance(result.exception, Stopped), result.output
    result = flow("target_lm.checkpoint_every=2", "--resume")
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output and (copied / "result.json").is_file()


def test_one_top_level_task_feeds_stages_2_and_3_and_the_saved_recipe_loads_again(tmp_path):
    from tests.conftest import write_corpus, write_task

    def saved_and_loaded(recipe: UlmfitRecipe) -> UlmfitRecipe:
        (tmp_path / "saved.yaml").write_text(recipe_to_yaml(recipe), encoding="utf-8")
        return load_recipe(tmp_path / "saved.yaml")

    corpus = write_corpus(tmp_path / "corpus")
    data = ulmfit_recipe(corpus, write_task(tmp_path / "task"), tmp_path / "run")
    data["task"] = data["classifier"].pop("task")
    del data["target_lm"]["corpus"]["task"]
    recipe = load_recipe(write_yaml(tmp_path / "flow.yaml", data))
    assert recipe.classifier.task == recipe.target_lm.corpus.task == recipe.task
    assert saved_and_loaded(recipe).model_dump() == recipe.model_dump()
    # A language model that reads other text keeps it; the task is then stage 3's alone.
    data["target_lm"]["corpus"]["train_files"] = [str(corpus)]
    recipe = load_recipe(write_yaml(tmp_path / "flow.yaml", data))
    assert recipe.target_lm.corpus.task is None and recipe.classifier.task == recipe.task
    assert saved_and_loaded(recipe).model_dump() == recipe.model_dump()
