"""Tiny real fine-tuning runs on data/quickstart: `finetune runs compare`, the plots and timing every run writes,
and the experiment trackers of `training.log_with`."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
import torch
from scipy import stats
from scipy.stats import binomtest

from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_wordpiece
from finetune.errors import UserError
from finetune.models.masked_lm import build_masked_lm
from finetune.recipes import MaskedLMModelConfig, TrainingConfig, load_recipe
from finetune.reporting.finish import TIMING_FILE
from finetune.reporting.plots import PLOTS_DIR, learning_rate_figure
from finetune.reporting.significance import mean_interval
from finetune.reporting.trackers import TRACKER_PROJECT, tracker_values
from finetune.run_dir import read_metrics
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.stages.seeds import RunKey, summarise_runs
from finetune.training.checkpoints import save_checkpoint
from finetune.training.loop import make_accelerator
from tests.cli.test_cli import assert_user_error, invoke
from tests.conftest import REPO_ROOT, drawing_plots, finetune_recipe, write_yaml
from tests.reporting.test_plots import EXPECTED_SIZE, PLOT_NAMES, png_size, unfreeze_positions

QUICKSTART_TASK = REPO_ROOT / "data" / "quickstart" / "task"  # 400 train, 600 dev sentences


def quickstart_run(checkpoint: Path, run_dir: Path, lr: float, **training) -> dict:
    """A tiny fine-tuning recipe on the quickstart task: 2 epochs of 4 steps (batch 100), gradual unfreezing."""
    data = finetune_recipe(checkpoint, QUICKSTART_TASK, run_dir)
    data["training"].update({"batch_size": 100, "lr": lr, **training})
    return data


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random BERT (hidden 32, 2 layers) with a WordPiece tokenizer trained on the quickstart corpus."""
    folder = tmp_path_factory.mktemp("pretrained")
    tokenizer = train_wordpiece(
        read_documents([REPO_ROOT / "data" / "quickstart" / "corpus" / "valid.txt"]), vocab_size=200, min_frequency=1
    )
    torch.manual_seed(0)
    model = build_masked_lm(
        MaskedLMModelConfig(layers=2, hidden=32, heads=2, intermediate=64),
        len(tokenizer),
        max_positions=32,
        pad_token_id=tokenizer.pad_token_id,
    )
    return save_checkpoint(model, tokenizer, folder / "checkpoint")


@pytest.fixture(scope="module")
def runs(checkpoint, tmp_path_factory) -> dict[str, Path]:
    """Two finished runs that differ only in training.lr (and run_dir)."""
    folder = tmp_path_factory.mktemp("runs")
    paths = {}
    for name, lr in (("low", 2e-3), ("high", 5e-3)):
        data = quickstart_run(checkpoint, folder / name, lr)
        with drawing_plots():  # test_every_finished_run_writes_its_plots_timing_and_dev_loss looks at them
            run_finetune(load_recipe(write_yaml(folder / f"{name}.yaml", data)))
        paths[name] = folder / name
    return paths


def table(markdown: str, number: int = 0) -> list[list[str]]:
    """The cells of the report's Markdown table `number` (0: the runs', 1: the paired test's), header first
    (separator row left out)."""
    tables = [[]]
    for line in markdown.splitlines():
        if line.startswith("| "):
            tables[-1].append(line)
        elif not line.startswith("|") and tables[-1]:  # a separator row (|---|) is in the table
            tables.append([])
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in tables[number]]


def test_compare_shows_only_the_differing_recipe_keys(runs, tmp_path):
    report = tmp_path / "out" / "report.md"
    result = invoke("runs", "compare", runs["low"], runs["high"], "--output", report)
    assert result.exit_code == 0, result.output
    header, *rows = table(report.read_text(encoding="utf-8"))
    assert header[:3] == ["run", "training.lr", "steps"]  # run_dir differs too, but names the row
    assert header[3:] == [
        "final training loss",
        "validation_loss",
        "dev_accuracy",
        "dev_f1",
        "training wall time",
        "throughput",
    ]
    assert [row[:3] for row in rows] == [[str(runs["low"]), "0.002", "8"], [str(runs["high"]), "0.005", "8"]]
    for row in rows:
        assert row[-2].endswith(" s") and row[-1].endswith(" examples/s")
        assert all(math.isfinite(float(cell)) for cell in row[3:-2])
    assert "![training loss and evaluations](report.png)" in report.read_text(encoding="utf-8")
    assert png_size(tmp_path / "out" / "report.png") == EXPECTED_SIZE


def test_compare_prints_the_report_without_output(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("runs", "compare", runs["low"], runs["high"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Runs compared\n")
    assert table(result.stdout)[0][1] == "training.lr"
    assert png_size(tmp_path / "runs" / "runs-compare.png") == EXPECTED_SIZE  # under runs/, which git ignores
    assert not (tmp_path / "runs-compare.png").exists()


def test_compare_refuses_missing_and_non_run_folders(runs, tmp_path):
    missing = tmp_path / "nope"
    assert_user_error(invoke("runs", "compare", runs["low"], missing), str(missing), "no such folder")
    (tmp_path / "plain").mkdir()
    assert_user_error(
        invoke("runs", "compare", runs["low"], tmp_path / "plain"), str(tmp_path / "plain"), "not a run directory"
    )


def test_every_finished_run_writes_its_plots_timing_and_dev_loss(runs):
    for run_dir in runs.values():
        for name in PLOT_NAMES:
            assert png_size(run_dir / PLOTS_DIR / f"{name}.png") == EXPECTED_SIZE
        timing = json.loads((run_dir / TIMING_FILE).read_text(encoding="utf-8"))
        assert timing["steps"] == 8 and timing["training_wall_time_s"] > 0
        records = read_metrics(run_dir / "metrics.jsonl")
        assert all(math.isfinite(record["validation_loss"]) for record in records if record["phase"] == "eval")
        # The second epoch thaws a second group at step 4: the LR plot marks it there.
        assert [record["step"] for record in records if record["phase"] == "unfreeze"] == [0, 4]
        assert unfreeze_positions(learning_rate_figure(records)) == [4]


def test_plots_turned_off_are_said_and_finetune_plot_draws_them_later(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_PLOTS", "off")
    run_dir = tmp_path / "run"
    recipe = write_yaml(tmp_path / "recipe.yaml", quickstart_run(checkpoint, run_dir, 2e-3, epochs=1))
    result = invoke("finetune", recipe)
    assert result.exit_code == 0, result.output
    assert f"plots not drawn (FINETUNE_PLOTS=off): `finetune plot {run_dir}` draws them" in result.output
    assert not (run_dir / PLOTS_DIR).exists() and (run_dir / TIMING_FILE).is_file()
    result = invoke("plot", run_dir)
    assert result.exit_code == 0, result.output
    assert png_size(run_dir / PLOTS_DIR / "learning_rates.png") == EXPECTED_SIZE


def test_tracker_values_flatten_every_record():
    record = {
        "phase": "train",
        "step": 3,
        "epoch": 0,
        "loss": 0.5,
        "lr": {"group_0": 1e-4, "group_1": 2e-4},
        "examples_per_s": 10.0,
    }
    assert tracker_values(record) == {
        "train/epoch": 0.0,
        "train/loss": 0.5,
        "train/lr/group_0": 1e-4,
        "train/lr/group_1": 2e-4,
        "train/examples_per_s": 10.0,
    }
    assert tracker_values({"phase": "eval", "step": 3, "dev_accuracy": 0.75, "best_so_far": True}) == {
        "eval/dev_accuracy": 0.75,
        "eval/best_so_far": 1.0,
    }


def test_an_unknown_tracker_is_a_one_line_error(tmp_path):
    recipe = write_yaml(tmp_path / "recipe.yaml", quickstart_run(tmp_path / "checkpoint", tmp_path / "run", 1e-3))
    assert_user_error(
        invoke("finetune", recipe, "training.log_with=[tensorboard, nope]"),
        "training.log_with",
        "unknown tracker 'nope'",
    )
    assert not (tmp_path / "run").exists()
    assert TrainingConfig(log_with="tensorboard").log_with == ["tensorboard"]  # one name is a list of one


def test_a_tracker_that_is_not_installed_is_an_error():
    trackers = ("wandb", "mlflow", "comet_ml", "clearml")
    absent = next((name for name in trackers if importlib.util.find_spec(name) is None), None)
    if absent is None:
        pytest.skip("every tracker package tried is installed; nothing to refuse")
    with pytest.raises(UserError, match=f"training.log_with: {absent} is not installed"):
        make_accelerator(TrainingConfig(device="cpu", log_with=[absent]), run_dir=Path("unused"))


def test_tensorboard_gets_every_kind_of_record(checkpoint, tmp_path):
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip(
            "SKIPPED LOUDLY: the tensorboard package is not installed, so training.log_with: [tensorboard] "
            "is untested; pip install -e '.[dev]' installs it"
        )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = quickstart_run(checkpoint, tmp_path / "run", 2e-3, log_with=["tensorboard"])
    run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    event_files = list((tmp_path / "run" / TRACKER_PROJECT).rglob("events.out.tfevents.*"))
    assert event_files
    scalars = set()
    for path in event_files:
        events = EventAccumulator(str(path))
        events.Reload()
        scalars.update(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr/group_0",
        "train/examples_per_s",
        "eval/dev_accuracy",
        "eval/validation_loss",
        "unfreeze/trainable_groups",
    } <= scalars


def prediction_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "dev_predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def test_two_runs_are_tested_row_by_row_on_their_saved_checkpoints_dev_predictions(runs, tmp_path):
    report = tmp_path / "report.md"
    assert invoke("runs", "compare", runs["low"], runs["high"], "--output", report).exit_code == 0
    text = report.read_text(encoding="utf-8")
    assert "## Paired test on the same 600 dev rows" in text
    header, *rows = table(text, 1)
    assert header[1:3] == [str(runs["low"]), str(runs["high"])]
    assert header[3:] == ["difference (second - first)", "95% interval", "p", "test", "verdict"]
    by_metric = {row[0]: row for row in rows}
    assert sorted(by_metric) == ["accuracy", "f1"]
    for name, row in by_metric.items():
        # The rows' scores are the saved (best) checkpoints' of result.json: the predictions are theirs.
        first, second = (json.loads((runs[run] / RESULT_FILE).read_text())["best"][f"dev_{name}"] for run in runs)
        assert float(row[1]) == pytest.approx(first, abs=5e-5) and float(row[2]) == pytest.approx(second, abs=5e-5)
        assert float(row[3]) == pytest.approx(second - first, abs=5e-5)
        low, high = (float(bound) for bound in row[4].split(" to "))
        assert low <= high
        assert row[7] == ("differ beyond noise (p < 0.05)" if float(row[5]) < 0.05 else "within noise (p >= 0.05)")
    mcnemar_by_hand = mcnemar_p(prediction_rows(runs["low"]), prediction_rows(runs["high"]))
    assert by_metric["accuracy"][5:7] == [f"{mcnemar_by_hand:.4f}", "McNemar's exact test"]
    assert by_metric["f1"][5] != "-" and by_metric["f1"][6] == "paired bootstrap, 10,000 resamples"


def mcnemar_p(first: list[dict], second: list[dict]) -> float:
    """McNemar's exact p-value counted by hand from two runs' prediction rows."""
    right = [[row["label"] == row["predicted"] for row in run] for run in (first, second)]
    only_first = sum(a and not b for a, b in zip(*right))
    only_second = sum(b and not a for a, b in zip(*right))
    return 1.0 if only_first + only_second == 0 else binomtest(only_first, only_first + only_second).pvalue


def test_compare_refuses_a_paired_test_of_different_dev_rows(runs, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(runs["high"], other)
    rows = prediction_rows(other)
    rows[3]["key"] = "000000000000"  # another text at dev row 3
    (other / "dev_predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    output = assert_user_error(invoke("runs", "compare", runs["low"], other), "different dev rows", "dev row 3")
    assert "task.dev_split" in output


def folder_of_runs(folder: Path, lr: float, accuracy: list[float], runs: list[RunKey]) -> Path:
    """A finished folder of several runs as stages/seeds.py leaves it (recipe.yaml, seeds.json), written here."""
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text(f"stage: finetune\nrun_dir: {folder}\ntraining:\n  lr: {lr}\n")
    results = {
        key: {"saved": "best", "main_metric": "accuracy", "best": {"dev_accuracy": value}}
        for key, value in zip(runs, accuracy, strict=True)
    }
    summary = summarise_runs(results, labels_per_class=8)
    (folder / "seeds.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


DRAWS_X_SEEDS = [RunKey(draw, seed) for draw in (0, 1) for seed in (0, 1)]


def test_two_folders_of_runs_are_tested_over_their_matching_runs(tmp_path):
    first_values, second_values = [0.70, 0.74, 0.66, 0.69], [0.75, 0.78, 0.70, 0.75]
    first = folder_of_runs(tmp_path / "a", 0.002, first_values, DRAWS_X_SEEDS)
    second = folder_of_runs(tmp_path / "b", 0.005, second_values, DRAWS_X_SEEDS)
    report = tmp_path / "report.md"
    result = invoke("runs", "compare", first, second, "--output", report)
    assert result.exit_code == 0, result.output
    text = report.read_text(encoding="utf-8")
    header, *rows = table(text)
    assert header[:5] == ["run", "training.lr", "steps", "final training loss", "dev_accuracy"]
    assert header[5:] == ["training wall time", "throughput"]
    low, high = mean_interval(first_values)
    assert rows[0] == [f"{first} (4 runs)", "0.002", "-", "-", f"0.6975 ({low:.4f} to {high:.4f})", "-", "-"]
    assert "## Paired test over the 4 runs both folders hold (draw-0/seed-0, draw-0/seed-1, " in text
    (metric, *cells), *others = table(text, 1)[1:]
    assert others == [] and metric == "accuracy"
    differences = [b - a for a, b in zip(first_values, second_values)]
    interval = mean_interval(differences)
    p_value = stats.ttest_rel(second_values, first_values).pvalue
    assert cells[2:] == [
        f"{statistics.fmean(differences):+.4f}",
        f"{interval[0]:+.4f} to {interval[1]:+.4f}",
        f"{p_value:.4f}",
        "paired t-test over 4 matching runs",
        "differ beyond noise (p < 0.05)",
    ]


def test_folders_sharing_too_few_runs_or_a_run_and_a_folder_get_no_paired_test(runs, tmp_path):
    first = folder_of_runs(tmp_path / "a", 0.002, [0.7, 0.72], [RunKey(0, 0), RunKey(0, 1)])
    second = folder_of_runs(tmp_path / "b", 0.005, [0.75, 0.78], [RunKey(0, 1), RunKey(1, 1)])
    text = invoke("runs", "compare", first, second).stdout
    assert "No paired test: the folders hold 1 run(s) of the same draw and seed" in text
    text = invoke("runs", "compare", first, runs["low"]).stdout
    assert "No paired test: one run against a folder of several" in text
