"""Run plots drawn from metrics.jsonl alone: valid PNGs of the set size, unfreezing marks at the logged steps."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from finetune.errors import UserError
from finetune.reporting.plots import (
    DPI,
    FIGURE_SIZE,
    PLOTS_DIR,
    UNFREEZE_MARK,
    evaluation_figure,
    learning_rate_figure,
    write_plots,
    write_plots_or_warn,
)
from finetune.run_dir import read_metrics
from finetune.training.optim import discriminative_lrs
from finetune.training.schedules import slanted_triangular
from tests.cli.test_cli import assert_user_error, invoke

EXPECTED_SIZE = (round(FIGURE_SIZE[0] * DPI), round(FIGURE_SIZE[1] * DPI))  # 800 x 450
PLOT_NAMES = ["loss", "learning_rates", "evaluation", "throughput"]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the PNG signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR", f"{path}: IHDR is not the first chunk"
    return struct.unpack(">II", data[16:24])


def finetune_records(total_steps: int = 40, epoch_steps: int = 10, groups: int = 4) -> list[dict]:
    """What a fine-tuning run logs: an unfreeze record per epoch (one more group each), STLR x discriminative LRs
    every 2 steps, an evaluation per epoch."""
    peaks = discriminative_lrs(groups, 2e-3, 2.6)
    records = []
    for step in range(1, total_steps + 1):
        epoch = (step - 1) // epoch_steps
        if (step - 1) % epoch_steps == 0:
            records.append(
                {
                    "phase": "unfreeze",
                    "step": step - 1,
                    "epoch": epoch,
                    "trainable_groups": min(groups, epoch + 1),
                    "total_groups": groups,
                }
            )
        multiplier = slanted_triangular(step - 1, total_steps, 0.1, 32)
        if step % 2 == 0:
            records.append(
                {
                    "phase": "train",
                    "step": step,
                    "epoch": epoch,
                    "loss": 1 / math.sqrt(step),
                    "lr": {f"group_{index}": peak * multiplier for index, peak in enumerate(peaks)},
                    "examples_per_s": 500.0 + step,
                }
            )
        if step % epoch_steps == 0:
            records.append(
                {
                    "phase": "eval",
                    "step": step,
                    "epoch": epoch,
                    "dev_accuracy": 0.5 + step / 100,
                    "dev_f1": 0.4 + step / 100,
                    "validation_loss": 0.7 - step / 100,
                    "best_so_far": True,
                }
            )
    return records


def pretrain_records() -> list[dict]:
    """What a pretraining run logs: one LR for every group, no unfreezing, validation loss and perplexity."""
    records = [
        {
            "phase": "train",
            "step": step,
            "epoch": 0,
            "loss": 5.0 - step / 10,
            "lr": {f"group_{index}": 1e-3 * step / 20 for index in range(4)},
            "tokens_per_s": 9000.0,
        }
        for step in range(2, 21, 2)
    ]
    records += [
        {
            "phase": "eval",
            "step": step,
            "epoch": 0,
            "validation_loss": loss,
            "validation_perplexity": math.exp(loss),
            "masked_accuracy": 0.1 * step / 10,
        }
        for step, loss in ((10, 4.2), (20, 3.9))
    ]
    return records


def write_run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return folder


def unfreeze_positions(figure) -> list[float]:
    """x of every vertical line the LR plot drew for an unfreezing step."""
    axes = figure.axes[0]
    return [line.get_xdata()[0] for line in axes.get_lines() if line.get_gid() == UNFREEZE_MARK]


def test_every_plot_is_a_png_of_the_set_size(tmp_path):
    run_dir = write_run(tmp_path / "run", finetune_records())
    written = write_plots(run_dir)
    assert [path.name for path in written] == [f"{name}.png" for name in PLOT_NAMES]
    for path in written:
        assert path.parent == run_dir / PLOTS_DIR
        assert png_size(path) == EXPECTED_SIZE, path.name


def test_unfreezing_marks_sit_at_the_logged_steps():
    records = finetune_records()
    logged = [record["step"] for record in records if record["phase"] == "unfreeze"]
    assert logged == [0, 10, 20, 30]
    figure = learning_rate_figure(records)
    # The first record is the starting state; each later one thaws a group: a line at its step.
    assert unfreeze_positions(figure) == [10, 20, 30]


def test_lr_plot_shows_each_group_training_only_after_it_is_thawed():
    figure = learning_rate_figure(finetune_records())
    axes = figure.axes[0]
    lines = {line.get_label(): line for line in axes.get_lines()}
    bottom, top = lines["group 0 (bottom)"], lines["group 3 (top)"]
    # The bottom group is thawed at step 30: its solid line starts with the first record after it.
    steps, values = bottom.get_xdata(), bottom.get_ydata()
    assert all(math.isnan(value) for step, value in zip(steps, values) if step <= 30)
    assert all(math.isfinite(value) for step, value in zip(steps, values) if step > 30)
    assert all(math.isfinite(value) for value in top.get_ydata())  # the head trains from the start
    # Discriminative spread 2.6^3 ~ 17.6x: a log axis, with every group's LR a constant factor below the next.
    assert axes.get_yscale() == "log"
    assert top.get_ydata()[-1] / bottom.get_ydata()[-1] == pytest.approx(2.6**3)
    # STLR: the top group's LR rises over the first tenth of the steps (cut_frac), then falls for the rest.
    values = list(top.get_ydata())
    peak = values.index(max(values))
    assert top.get_xdata()[peak] <= 0.2 * 40
    assert values[: peak + 1] == sorted(values[: peak + 1]) and values[peak:] == sorted(values[peak:], reverse=True)


def test_pretraining_plots_one_lr_line_and_perplexity_on_its_own_axes():
    records = pretrain_records()
    lr_axes = learning_rate_figure(records).axes[0]
    assert [line.get_label() for line in lr_axes.get_lines()] == ["all 4 layer groups"]
    assert lr_axes.get_yscale() == "linear"
    assert unfreeze_positions(learning_rate_figure(records)) == []
    titles = [axes.get_title() for axes in evaluation_figure(records).axes]
    assert titles == ["scores", "validation_perplexity"]  # validation loss is drawn with the training loss


def test_a_run_without_evaluations_gets_the_plots_it_has_data_for(tmp_path):
    records = [record for record in pretrain_records() if record["phase"] == "train"]
    written = write_plots(write_run(tmp_path / "run", records))
    assert [path.name for path in written] == ["loss.png", "learning_rates.png", "throughput.png"]


def test_a_plotting_failure_is_a_warning(tmp_path):
    records = finetune_records()
    del records[1]["loss"]  # a record the plots cannot read
    run_dir = write_run(tmp_path / "run", records)
    with pytest.warns(RuntimeWarning, match="finetune plot"):
        assert write_plots_or_warn(run_dir) == []


def test_plot_command_redraws_from_metrics_alone(tmp_path):
    run_dir = write_run(tmp_path / "run", finetune_records())
    result = invoke("plot", run_dir)
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(run_dir / PLOTS_DIR / f"{name}.png") for name in PLOT_NAMES]
    assert all(png_size(run_dir / PLOTS_DIR / f"{name}.png") == EXPECTED_SIZE for name in PLOT_NAMES)


def test_plot_command_on_a_multi_seed_run_plots_each_seed(tmp_path):
    for seed in (1, 2):
        write_run(tmp_path / "run" / f"seed-{seed}", finetune_records())
    result = invoke("plot", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert all((tmp_path / "run" / f"seed-{seed}" / PLOTS_DIR / "loss.png").is_file() for seed in (1, 2))


def test_plot_command_refuses_what_is_not_a_run(tmp_path):
    assert_user_error(invoke("plot", tmp_path / "missing"), str(tmp_path / "missing"), "no such folder")
    (tmp_path / "empty").mkdir()
    assert_user_error(invoke("plot", tmp_path / "empty"), str(tmp_path / "empty"), "not a run directory")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b"[1, 2]", "expected a JSON object, found list"),
        (b"3", "expected a JSON object, found int"),
        (b"null", "expected a JSON object, found NoneType"),
        (b'{"step": 2,', "not JSON"),
        (b'{"loss": "caf\xe9"}', "not valid UTF-8"),
    ],
)
def test_read_metrics_names_a_line_that_is_no_json_object(tmp_path, line, fragment):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n\n' + line + b"\n")
    with pytest.raises(UserError) as info:
        read_metrics(path)
    assert str(info.value).startswith(f"{path} line 3: ") and fragment in str(info.value)
    path.write_bytes(b'{"step": 1}\n\n{"step": 2}\n')  # blank lines are skipped
    assert read_metrics(path) == [{"step": 1}, {"step": 2}]


def test_a_record_without_phase_is_named_in_one_warning_line(tmp_path, capsys):
    # issue 44: such records were skipped without a word; the plots still draw from the others
    records = finetune_records()
    records.insert(3, {"step": 3, "loss": 1.0})
    records.insert(7, {"step": 6, "loss": 1.0})
    run_dir = write_run(tmp_path / "run", records)
    written = write_plots(run_dir)
    assert [path.name for path in written] == [f"{name}.png" for name in PLOT_NAMES]
    warning = capsys.readouterr().err.strip()
    path = run_dir / "metrics.jsonl"
    assert warning == (
        f"warning: {path} line 4: a record without 'phase' (train, eval, unfreeze) is not plotted "
        "(nor 1 more such lines)"
    )


def test_a_partly_written_last_line_is_left_out_with_a_note(tmp_path):
    # a running job writes its metrics.jsonl as it goes: `finetune plot` on it meets a line without its line break
    run_dir = write_run(tmp_path / "run", finetune_records())
    path = run_dir / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").count("\n")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"phase": "train", "step": 41, "lo')
    result = invoke("plot", run_dir)
    assert result.exit_code == 0, result.output
    assert f"{path} line {lines + 1}: not complete yet" in result.output and "Traceback" not in result.output
    assert (run_dir / PLOTS_DIR / "loss.png").is_file()
    with open(path, "a", encoding="utf-8") as handle:  # a broken line in the middle is still refused
        handle.write("ss\n" + json.dumps(finetune_records()[0]) + "\n")
    assert_user_error(invoke("plot", run_dir), f"{path} line {lines + 1}", "not JSON")
