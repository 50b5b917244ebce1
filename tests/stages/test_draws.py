"""`draws` x `seeds` with task.labels_per_class: each draw's runs on its own labelled rows, the summary with its 95%
interval (seeds.json, seeds.md, result.json, each run's model card), and --resume keeping finished runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.training import loop as loop_module
from tests.conftest import finetune_recipe, write_task, write_yaml
from tests.training.test_resume_finetune import Stopped, assert_same_run

RUNS = ["draw-0/seed-0", "draw-0/seed-1", "draw-1/seed-0", "draw-1/seed-1"]


def draws_recipe(checkpoint: Path, task: Path, run_dir: Path, **extra) -> dict:
    """Six labelled rows of each class (of 20), drawn twice, x seeds 0 and 1: four runs of 2 steps each."""
    data = finetune_recipe(checkpoint, task, run_dir)
    data["task"]["labels_per_class"] = 6
    data["training"]["epochs"] = 1
    data.update({"draws": 2, "seeds": [0, 1], **extra})
    return data


def read(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_draws_x_seeds_train_each_draw_on_its_rows_and_report_an_interval(pretrained, task_dir, tmp_path):
    run_dir = tmp_path / "run"
    assert run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", draws_recipe(pretrained, task_dir, run_dir))))
    drawn = {run: read(run_dir / run / "labelled_rows.json") for run in RUNS}
    for run, record in drawn.items():
        saved = load_recipe(run_dir / run / "recipe.yaml", check_paths=False)
        assert (saved.draw, saved.seed, saved.draws, saved.seeds) == (int(run[5]), int(run[-1]), None, None)
        assert record["counts"] == {"0": 6, "1": 6} and record["pool_rows"] == 40 and len(record["rows"]) == 12
    assert drawn["draw-0/seed-0"]["rows"] == drawn["draw-0/seed-1"]["rows"]  # every seed of a draw: its rows
    assert drawn["draw-1/seed-0"]["rows"] == drawn["draw-1/seed-1"]["rows"]
    assert drawn["draw-0/seed-0"]["rows"] != drawn["draw-1/seed-0"]["rows"]

    summary = read(run_dir / "seeds.json")
    assert (summary["seeds"], summary["draws"], summary["labels_per_class"]) == ([0, 1], [0, 1], 6)
    assert summary["runs"] == RUNS and summary["saved"] == "best"
    for name in ("dev_accuracy", "dev_f1"):
        values = [read(run_dir / run / RESULT_FILE)["best"][name] for run in RUNS]
        mean, spread = statistics.fmean(values), statistics.stdev(values)
        half = stats.t.ppf(0.975, df=3) * spread / math.sqrt(4)  # Student t over the 4 runs
        metric = summary["metrics"][name]
        assert metric["values"] == values
        assert (metric["mean"], metric["std"]) == pytest.approx((mean, spread))
        assert metric["interval"] == pytest.approx([mean - half, mean + half])
        assert metric["draws"] == {
            "0": {"values": values[:2], "mean": pytest.approx(statistics.fmean(values[:2]))},
            "1": {"values": values[2:], "mean": pytest.approx(statistics.fmean(values[2:]))},
        }
        assert read(run_dir / RESULT_FILE)["metrics"][name] == {key: metric[key] for key in ("mean", "std", "interval")}
    result = read(run_dir / RESULT_FILE)
    assert result["main_metric"] == "accuracy" and result["runs"] == RUNS
    assert result["over"] == "2 draws of 6 labelled rows per class x seeds 0, 1"
    assert "Student t over the 4 runs (3 degrees of freedom)" in result["interval"]

    markdown = (run_dir / "seeds.md").read_text(encoding="utf-8")
    assert markdown.startswith("# dev scores over 2 draws of 6 labelled rows per class x seeds 0, 1 (best checkpoints)")
    assert "| metric | mean | 95% interval | std | median | min | max |" in markdown and "| accuracy |" in markdown
    assert "| metric | draw 0 | draw 1 |" in markdown
    accuracy = summary["metrics"]["dev_accuracy"]
    for index, run in enumerate(RUNS):
        card = (run_dir / run / "checkpoint" / "README.md").read_text(encoding="utf-8")
        assert card.count("## Across runs") == 1 and f"This checkpoint is run {run} of 4" in card
        assert f"| accuracy | {accuracy['values'][index]:.4f} | {accuracy['mean']:.4f} |" in card
        # The saved checkpoint's predictions of each dev row score what result.json says it scored.
        rows = [json.loads(line) for line in (run_dir / run / "dev_predictions.jsonl").read_text().splitlines()]
        assert [row["row"] for row in rows] == list(range(24))
        right = statistics.fmean(row["label"] == row["predicted"] for row in rows)
        assert right == pytest.approx(accuracy["values"][index])


def stop_in(run: str, step: int):
    """A TrainingLoop.__init__ that raises Stopped after the periodic checkpoint of `step` of the run in `run`."""
    original_init = loop_module.TrainingLoop.__init__
    started: list[str] = []

    def init_that_stops(self, *arguments, **keywords):
        original_init(self, *arguments, **keywords)
        save, run_dir = self.save_checkpoint, Path(self.metrics_log.path).parent
        started.append(f"{run_dir.parent.name}/{run_dir.name}")

        def save_then_stop(progress):
            folder = save(progress)
            if started[-1] == run and progress.step == step:
                raise Stopped
            return folder

        self.save_checkpoint = save_then_stop

    return init_that_stops, started


def test_resume_of_a_run_of_draws_keeps_finished_runs_and_checks_the_rows(pretrained, tmp_path, monkeypatch):
    """Stopped in draw 1: a changed training file is refused (its draw would take other rows); restored, --resume
    keeps draw 0 as it was and finishes draw 1 as an unstopped run does."""
    task = write_task(tmp_path / "task")

    def recipe(run_dir: Path) -> dict:
        data = draws_recipe(pretrained, task, run_dir, seeds=None, checkpoint_every=1)
        data["training"]["epochs"] = 2
        return data

    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", recipe(tmp_path / "full"))))
    path = write_yaml(tmp_path / "resumed.yaml", recipe(tmp_path / "resumed"))
    init_that_stops, started = stop_in("draw-1/seed-0", 2)
    monkeypatch.setattr(loop_module.TrainingLoop, "__init__", init_that_stops)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(path))
    finished = (tmp_path / "resumed" / "draw-0" / "seed-0" / "metrics.jsonl").read_text()
    assert not (tmp_path / "resumed" / "seeds.json").exists()

    train = task / "train.tsv"
    original = train.read_text(encoding="utf-8")
    lines = original.splitlines()
    train.write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n", encoding="utf-8")  # the same rows, reordered
    result = CliRunner().invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 2 and "task.labels_per_class: draw 1 now takes other training rows" in result.output
    train.write_text(original, encoding="utf-8")

    result = CliRunner().invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    # The refused resume stopped before training; the other ran draw 1 only.
    assert started == ["draw-0/seed-0", "draw-1/seed-0", "draw-1/seed-0"]
    assert "draw 0, seed 0 finished before: kept" in result.output
    assert (tmp_path / "resumed" / "draw-0" / "seed-0" / "metrics.jsonl").read_text() == finished
    for run in ("draw-0/seed-0", "draw-1/seed-0"):
        assert_same_run(tmp_path / "full" / run, tmp_path / "resumed" / run)
        assert (tmp_path / "full" / run / "dev_predictions.jsonl").read_text() == (
            tmp_path / "resumed" / run / "dev_predictions.jsonl"
        ).read_text()  # the best evaluation's, kept beside its weights through the resume
    assert read(tmp_path / "full" / "seeds.json") == read(tmp_path / "resumed" / "seeds.json")
    assert (tmp_path / "resumed" / "draw-1" / "seed-0" / "checkpoint" / "README.md").read_text().count(
        "## Across runs"
    ) == 1
