"""`finetune search`: trials as run folders, the summary, best.yaml, the plot, resume, pruning, the space's checks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import RunFailed, UserError
from finetune.recipes import load_recipe
from finetune.run_lock import LOCK_FILE
from finetune.stages.search import Search, is_loss_like, optimized_metric, run_search
from finetune.stages.search_space import Dimension, read_space, yaml_value
from tests.conftest import (
    finetune_recipe,
    interrupted_at_step,
    one_error_line,
    save_tiny_masked_lm,
    write_task,
    write_yaml,
)

optuna = pytest.importorskip("optuna", reason="`finetune search` needs optuna (pip install 'finetune[search]')")
runner = CliRunner()

SPACE = """\
training.lr: {low: 1e-4, high: 1e-2, log: true}
training.batch_size: {choices: [4, 8]}
classifier_dropout: {low: 0.0, high: 0.3}
"""


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_masked_lm(tmp_path_factory.mktemp("lm"), layers=1, hidden=16)


@pytest.fixture
def recipe_and_space(tmp_path: Path, tiny_lm: Path) -> tuple[Path, Path]:
    """A tiny recipe (1 epoch of 4 steps, evaluations at steps 2 and 4) and a 3-key space."""
    data = finetune_recipe(tiny_lm, write_task(tmp_path / "task"), tmp_path / "runs" / "ft")
    data["training"].update(epochs=1, max_steps=4, log_every=2)
    data.update(eval_every=2, classifier_dropout=0.1)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE, encoding="utf-8")
    return write_yaml(tmp_path / "recipe.yaml", data), space


def search_folder(recipe: Path) -> Path:
    return recipe.parent / "runs" / "ft-search"


def test_search_runs_trials_as_run_folders_and_writes_the_summary_plot_and_best_recipe(recipe_and_space):
    recipe, space = recipe_and_space
    result = runner.invoke(app, ["search", str(recipe), "--space", str(space), "--trials", "2", "--baseline"])
    assert result.exit_code == 0, result.output
    folder = search_folder(recipe)
    for number in (0, 1):
        trial = folder / f"trial-{number:03d}"
        assert (
            (trial / "result.json").is_file() and (trial / "checkpoint").is_dir() and (trial / "recipe.yaml").is_file()
        )
    summary = json.loads((folder / "search.json").read_text(encoding="utf-8"))
    assert summary["metric"] == "dev_accuracy" and summary["direction"] == "maximize"
    assert [row["state"] for row in summary["trials"]] == ["complete", "complete"]
    # trial 0 is the recipe's own values (--baseline), and its folder's recipe holds them
    assert summary["trials"][0]["params"] == {"training.lr": 2e-3, "training.batch_size": 8, "classifier_dropout": 0.1}
    second = load_recipe(folder / "trial-001" / "recipe.yaml")
    assert second.training.lr == pytest.approx(summary["trials"][1]["params"]["training.lr"])
    assert 1e-4 <= second.training.lr <= 1e-2 and second.training.batch_size in (4, 8)
    values = [row["value"] for row in summary["trials"]]
    assert summary["best_value"] == max(values)
    markdown = (folder / "search.md").read_text(encoding="utf-8")
    assert "| trial | state | dev_accuracy | training.lr | training.batch_size | classifier_dropout | run |" in markdown
    assert "(best)" in markdown and "| trial | state |" in result.output  # printed too
    assert (folder / "search.png").read_bytes()[:4] == b"\x89PNG"
    best = load_recipe(folder / "best.yaml")  # a complete recipe
    assert best.training.lr == pytest.approx(summary["best_params"]["training.lr"])
    assert Path(best.run_dir) == folder / "best"


def test_resume_continues_the_study_to_more_trials_and_a_second_start_is_refused(recipe_and_space):
    recipe, space = recipe_and_space
    arguments = ["search", str(recipe), "--space", str(space)]
    assert runner.invoke(app, [*arguments, "--trials", "1"]).exit_code == 0
    again = runner.invoke(app, [*arguments, "--trials", "1"])
    assert again.exit_code == 2 and "holds a search already: continue it with --resume" in one_error_line(again)
    resumed = runner.invoke(app, [*arguments, "--trials", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads((search_folder(recipe) / "search.json").read_text(encoding="utf-8"))
    assert [row["trial"] for row in summary["trials"]] == [0, 1]
    assert (search_folder(recipe) / "trial-001" / "result.json").is_file()
    first = summary["trials"][0]
    assert first["params"] != summary["trials"][1]["params"]  # the sampler drew anew, the first trial was kept
    space.write_text(SPACE.replace("[4, 8]", "[4, 16]"), encoding="utf-8")
    changed = runner.invoke(app, [*arguments, "--trials", "3", "--resume"])
    assert changed.exit_code == 2 and "started with other space" in one_error_line(changed)


class AlwaysPrune(optuna.pruners.BasePruner):
    """Prunes at the first report: the path a median pruner takes for a trial behind the others."""

    def prune(self, study, trial) -> bool:
        return True


def test_a_pruned_trial_stops_at_its_first_evaluation_and_is_marked_pruned(recipe_and_space):
    recipe, space = recipe_and_space
    search = Search(recipe, [], space, trials=1, pruner=AlwaysPrune())
    with pytest.raises(RunFailed, match="no trial finished"):  # the only trial was pruned: nothing to call best
        run_search(search)
    folder = search_folder(recipe)
    summary = json.loads((folder / "search.json").read_text(encoding="utf-8"))
    assert [row["state"] for row in summary["trials"]] == ["pruned"]
    assert summary["trials"][0]["stopped_at_step"] == 2
    markdown = (folder / "search.md").read_text(encoding="utf-8")
    assert " (step 2) |" in markdown  # the score of a stopped trial says where it stopped
    assert "not a finished run's" in markdown
    trial = folder / "trial-000"
    evaluations = [
        json.loads(line)
        for line in (trial / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if json.loads(line).get("phase") == "eval"
    ]
    assert [record["step"] for record in evaluations] == [2]  # stopped at the first evaluation, not trained on
    assert not (trial / "result.json").exists() and not (trial / "checkpoint").exists()
    assert not (trial / LOCK_FILE).exists()  # the run's lock was released


def test_an_unknown_key_in_the_space_is_one_line_naming_it_and_the_file(recipe_and_space, tmp_path):
    recipe, _ = recipe_and_space
    space = tmp_path / "bad.yaml"
    space.write_text("training.learning_rate: {low: 1e-5, high: 1e-3}\n", encoding="utf-8")
    result = runner.invoke(app, ["search", str(recipe), "--space", str(space), "--trials", "2"])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert f"space {space}: training.learning_rate: not a key of a finetune recipe" in line
    assert "did you mean training.lr?" in line
    assert not search_folder(recipe).exists()  # refused before any trial


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("training.lr: {low: 1e-3, high: 1e-5}", "expected low < high"),
        ("training.lr: {low: 0, high: 1e-3, log: true}", "a log range needs low > 0"),
        ("training.lr: [1, 2]", "expected {low: L, high: H}"),
        ("training.batch_size: {choices: []}", "choices: expected a list of different values"),
        ("training.batch_size: {choices: [8, big]}", "training.batch_size: the recipe refuses 'big'"),
        ("training.lr: {low: a, high: 1}", "low: expected a number"),
    ],
)
def test_a_bad_spec_is_one_line(recipe_and_space, tmp_path, spec, message):
    recipe, _ = recipe_and_space
    space = tmp_path / "bad.yaml"
    space.write_text(spec + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"^space .*bad\.yaml: ") as error:
        read_space(space, "finetune", lambda override: load_recipe(recipe, [override]))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_ranges_are_ints_when_both_ends_are_and_values_read_back_as_written():
    assert Dimension("training.epochs", low=2, high=4).is_int
    assert not Dimension("classifier_dropout", low=0.0, high=0.3).is_int
    assert yaml_value(1e-05) == "1.0e-05" and yaml_value(0.002) == "0.002" and yaml_value("mean") == "'mean'"
    from finetune.safe_yaml import load_yaml

    assert load_yaml(yaml_value(3e-4)) == pytest.approx(3e-4) and isinstance(load_yaml(yaml_value(1e-05)), float)


def test_loss_like_metrics_are_minimized(recipe_and_space):
    assert is_loss_like("mse") and is_loss_like("validation_loss") and not is_loss_like("accuracy")
    recipe = load_recipe(recipe_and_space[0])
    assert optimized_metric(recipe) == ("accuracy", "maximize")
    # the metric keep_best picks by (recipe.selection_metric(): metric_for_best when set), a loss-like one minimized
    chosen = SimpleNamespace(selection_metric=lambda: "dev_mse")
    assert optimized_metric(chosen) == ("mse", "minimize")


def test_a_trial_stopped_with_its_search_continues_from_its_checkpoint_on_resume(recipe_and_space, monkeypatch):
    from finetune.stages import search as search_module

    recipe, space = recipe_and_space
    resumed: list[bool] = []
    run_finetune = search_module.run_finetune
    monkeypatch.setattr(
        search_module,
        "run_finetune",
        lambda loaded, resume=False: resumed.append(resume) or run_finetune(loaded, resume),
    )
    with interrupted_at_step(3):  # Ctrl-C in trial 0, after its periodic checkpoint of step 3
        run_search(Search(recipe, ["checkpoint_every=3"], space, trials=1))
    folder = search_folder(recipe)
    assert (folder / "trial-000" / "checkpoints").is_dir() and not (folder / "trial-000" / "result.json").exists()
    run_search(Search(recipe, ["checkpoint_every=3"], space, trials=1, resume=True))
    assert resumed == [False, True]  # the second run of trial 0 continued from its checkpoint
    summary = json.loads((folder / "search.json").read_text(encoding="utf-8"))
    assert [(row["trial"], row["state"]) for row in summary["trials"]] == [(0, "complete")]  # the same trial, finished
    assert (folder / "trial-000" / "result.json").is_file() and not (folder / "trial-001").exists()


def test_without_optuna_the_search_says_how_to_install_it(recipe_and_space, monkeypatch):
    recipe, space = recipe_and_space
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)  # as if it were not installed
    result = runner.invoke(app, ["search", str(recipe), "--space", str(space), "--trials", "1"])
    assert result.exit_code == 2 and "needs optuna: pip install 'finetune[search]'" in one_error_line(result)


def test_ctrl_c_in_a_trial_prints_the_search_command_that_continues_it(recipe_and_space, monkeypatch):
    from finetune.training.loop import TrainingLoop

    recipe, space = recipe_and_space
    arguments = ["search", str(recipe), "--space", str(space), "--trials", "1"]
    with monkeypatch.context() as patch:
        patch.setattr(TrainingLoop, "_interrupt_agreed", lambda loop: loop.step == 3)  # Ctrl-C during step 3
        stopped = runner.invoke(app, arguments)
    assert stopped.exit_code == 130
    assert f"continue with: finetune search {recipe} --space {space} --trials 1 --resume" in stopped.output
    continued = runner.invoke(app, [*arguments, "--resume"])
    assert continued.exit_code == 0, continued.output
    assert "trial 0 was stopped: it continues" in continued.output
    summary = json.loads((search_folder(recipe) / "search.json").read_text(encoding="utf-8"))
    assert [(row["trial"], row["state"]) for row in summary["trials"]] == [(0, "complete")]
