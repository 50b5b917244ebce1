"""The Python API (finetune/api/runs.py): stages called with a recipe dict, overrides and in-memory data, a RunResult
back, the toolkit's exceptions instead of exits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

import finetune
from finetune.errors import UserError
from tests.conftest import custom_task_section, finetune_recipe, interrupted_at_step, make_sentence, save_tiny_masked_lm

pandas = pytest.importorskip("pandas", reason="the DataFrame tests need pandas")


def rows(count: int, seed: int) -> list[dict]:
    """Generated sentiment rows: sentence (text) and label (0/1)."""
    rng = random.Random(seed)
    return [{"sentence": make_sentence(rng, index % 2 == 0), "label": int(index % 2 == 0)} for index in range(count)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_masked_lm(tmp_path_factory.mktemp("lm"), layers=1, hidden=16)


def recipe_without_data(checkpoint: Path, run_dir: Path) -> dict:
    """A tiny finetune recipe whose task names its columns but no folder: the rows come from the call."""
    recipe = finetune_recipe(checkpoint, Path("unused"), run_dir)
    recipe["task"] = {key: value for key, value in custom_task_section(Path("unused")).items() if key != "data_dir"}
    recipe["training"]["epochs"] = 1
    return recipe


def test_finetune_on_a_dataframe_returns_scores_a_checkpoint_and_the_history(checkpoint, tmp_path):
    run_dir = tmp_path / "run"
    train, dev = pandas.DataFrame(rows(24, 1)), pandas.DataFrame(rows(12, 2))

    result = finetune.finetune(recipe_without_data(checkpoint, run_dir), {"training.lr": 1e-3}, train=train, dev=dev)

    assert isinstance(result, finetune.RunResult)
    assert result.run_dir == run_dir and result.checkpoint == run_dir / "checkpoint"
    assert (result.checkpoint / "config.json").is_file()
    assert 0.0 <= result.metrics["dev_accuracy"] <= 1.0 and result.best_step == 3  # 24 rows, batches of 8
    assert [record["step"] for record in result.history if "loss" in record][:3] == [1, 2, 3]
    saved = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert saved["training"]["lr"] == 1e-3
    assert Path(saved["task"]["data_dir"]) == run_dir / "data" and saved["task"]["source"] == "files"
    written = (run_dir / "data" / "train.jsonl").read_text().splitlines()
    assert len(written) == 24 and '"label": 1' in written[0]


def test_finetune_on_lists_of_dicts_resumes_and_evaluates_from_the_rows_it_wrote(checkpoint, tmp_path):
    run_dir = tmp_path / "run"
    recipe = recipe_without_data(checkpoint, run_dir) | {"checkpoint_every": 2}
    train, dev = rows(32, 3), rows(12, 4)
    with interrupted_at_step(2):
        finetune.finetune(recipe, train=train, dev=dev)
    assert not (run_dir / "checkpoint").exists()

    # The saved recipe reads the rows written into the run: no data given again.
    resumed = finetune.finetune(run_dir / "recipe.yaml", resume=True)
    assert resumed.checkpoint == run_dir / "checkpoint" and resumed.best_step == 4
    again = finetune.finetune(run_dir / "recipe.yaml", resume=True)  # finished: nothing trains, the same result
    assert again.checkpoint == resumed.checkpoint and again.metrics == resumed.metrics

    scored = finetune.evaluate(resumed)
    assert scored.run_dir == Path(f"{run_dir}-eval")
    assert scored.report["examples"] == 12 and scored.report["split"] == "dev"
    assert scored.metrics["accuracy"] == pytest.approx(resumed.metrics["dev_accuracy"])


def test_resuming_with_other_rows_is_refused(checkpoint, tmp_path):
    recipe = recipe_without_data(checkpoint, tmp_path / "run") | {"checkpoint_every": 2}
    with interrupted_at_step(2):
        finetune.finetune(recipe, train=rows(32, 3), dev=rows(12, 4))
    with pytest.raises(UserError, match=r"^the train rows differ from those the run started with"):
        finetune.finetune(recipe, train=rows(32, 5), dev=rows(12, 4), resume=True)


def test_a_dataframe_without_the_recipes_columns_is_one_line_naming_them(checkpoint, tmp_path):
    run_dir = tmp_path / "run"
    train = pandas.DataFrame(rows(8, 1)).rename(columns={"sentence": "text", "label": "target"})

    with pytest.raises(UserError) as raised:
        finetune.finetune(recipe_without_data(checkpoint, run_dir), train=train, dev=pandas.DataFrame(rows(4, 2)))

    message = str(raised.value)
    assert message == "train: missing column(s) sentence, label (columns: text, target)"
    assert not (run_dir / "data").exists()


def test_a_recipe_mistake_is_the_clis_one_line_error_not_an_exit(checkpoint, tmp_path):
    recipe = recipe_without_data(checkpoint, tmp_path / "run")
    with pytest.raises(UserError, match=r"training\.lr"):
        finetune.finetune(recipe, ["training.lr=-1"], train=rows(8, 1), dev=rows(4, 2))
    with pytest.raises(UserError, match="run it with `finetune finetune`"):
        finetune.pretrain(recipe)


def test_ulmfit_runs_its_three_stages_and_returns_the_classifier(tmp_path):
    from tests.conftest import write_corpus, write_task
    from tests.stages.test_ulmfit_flow import ulmfit_recipe

    run_dir = tmp_path / "flow"
    recipe = ulmfit_recipe(write_corpus(tmp_path / "corpus"), write_task(tmp_path / "task"), run_dir)

    result = finetune.ulmfit(recipe, ["classifier.training.epochs=1"])

    assert result.run_dir == run_dir and result.checkpoint == run_dir / "3-classifier" / "checkpoint"
    assert set(result.metrics) >= {"dev_accuracy", "dev_f1"} and result.best_step == 5  # the classifier's: 40 rows
    assert any("loss" in record for record in result.history)
    assert set(result.report) >= {"general_lm", "target_lm", "classifier"}  # the flow's summary


def test_a_run_of_several_seeds_returns_their_summary(checkpoint, tmp_path):
    run_dir = tmp_path / "run"
    recipe = recipe_without_data(checkpoint, run_dir) | {"seeds": [0, 1]}

    result = finetune.finetune(recipe, train=rows(16, 1), dev=rows(8, 2))

    assert result.checkpoint == run_dir and (run_dir / "seed-1" / "checkpoint").is_dir()
    assert result.metrics["seeds"] == [0, 1] and "dev_accuracy" in result.metrics["metrics"]


def test_paths_are_taken_wherever_a_recipe_names_a_file_or_folder(checkpoint, tmp_path):
    """A notebook passes pathlib.Path objects: model.checkpoint (a folder or a hub name, so typed as text), run_dir,
    an override's value and finetune.predict's checkpoint all take one."""
    task = tmp_path / "task"
    for split, count, seed in (("train", 16, 5), ("dev", 8, 6)):
        task.mkdir(exist_ok=True)
        lines = ["sentence\tlabel", *(f"{row['sentence']}\t{row['label']}" for row in rows(count, seed))]
        (task / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    recipe = finetune_recipe(checkpoint, task, tmp_path / "unused")
    recipe["model"]["checkpoint"] = checkpoint  # a Path, not its text
    recipe["task"]["data_dir"] = task
    recipe["training"]["epochs"] = 1
    result = finetune.finetune(recipe, {"run_dir": tmp_path / "run"})
    assert result.run_dir == tmp_path / "run" and (result.checkpoint / "config.json").is_file()
    assert yaml.safe_load((result.run_dir / "recipe.yaml").read_text())["model"]["checkpoint"] == str(checkpoint)
    predicted = finetune.predict(result.checkpoint, ["a warm , funny film"])
    assert len(predicted) == 1 and set(predicted[0]["probabilities"]) == {"0", "1"}
