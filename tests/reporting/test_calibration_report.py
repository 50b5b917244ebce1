"""A run's calibration in words and in a picture: the closing line, the model card's table and the reliability diagram
that `finetune plot` draws again from result.json."""

from __future__ import annotations

import json

import numpy as np

from finetune.inference.calibration import calibrated_probabilities, calibration_record
from finetune.reporting.calibration_report import calibration_markdown, calibration_summary
from finetune.reporting.plots import PLOTS_DIR, RELIABILITY_PLOT, RESULT_FILE, reliability_figure, write_plots
from tests.reporting.test_plots import EXPECTED_SIZE, PLOT_NAMES, finetune_records, png_size, write_run


def over_confident_record(method: str) -> dict:
    """The calibration record of 2,000 rows drawn from a calibrated model whose logits were then doubled."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 2.0, (2_000, 3))
    labels = (rng.random((2_000, 1)) > calibrated_probabilities(logits).cumsum(axis=1)).sum(axis=1)
    return calibration_record(method, 2 * logits, labels)


def test_the_line_and_the_card_give_the_numbers_before_and_after():
    record = over_confident_record("temperature")
    dev = record["dev"]
    line = calibration_summary(record)
    assert line.startswith(f"calibration: temperature {record['temperature']:.4f} fitted on dev (2000 rows): ")
    assert f"ECE {dev['ece_before']:.4f} -> {dev['ece_after']:.4f}" in line
    assert f"NLL {dev['nll_before']:.4f} -> {dev['nll_after']:.4f}" in line
    card = calibration_markdown(record)
    assert "| measure | before | after |" in card
    assert f"| Brier score | {dev['brier_before']:.4f} | {dev['brier_after']:.4f} |" in card
    assert "model.config.calibration_temperature" in card
    measured = over_confident_record("none")
    assert calibration_summary(measured).startswith("calibration: none; dev (2000 rows) ECE ")
    assert "| measure | value |" in calibration_markdown(measured) and "after" not in calibration_markdown(measured)


def test_the_diagram_draws_both_curves_beside_the_diagonal():
    record = over_confident_record("temperature")
    diagram, counts = reliability_figure(record).axes
    labels = [line.get_label() for line in diagram.get_lines()]
    assert labels[0] == "calibrated (accuracy = confidence)"
    assert f"ECE {record['dev']['ece_before']:.3f}" in labels[1] and "before" in labels[1]
    assert f"/ {record['temperature']:.2f}), ECE {record['dev']['ece_after']:.3f}" in labels[2]
    filled = sum(1 for rows in record["reliability"]["before"]["rows"] if rows)
    assert len(diagram.get_lines()[1].get_xdata()) == filled  # an empty bin has no point
    assert sum(bar.get_height() for bar in counts.patches) == 2 * 2_000  # every row once before and once after
    alone = reliability_figure(over_confident_record("none")).axes[0]
    assert len(alone.get_lines()) == 2  # calibration none: the model's own curve only


def test_plot_draws_the_reliability_diagram_of_a_run_with_a_calibration(tmp_path):
    run_dir = write_run(tmp_path / "run", finetune_records())
    (run_dir / RESULT_FILE).write_text(
        json.dumps({"main_metric": "accuracy", "calibration": over_confident_record("none")})
    )
    written = write_plots(run_dir)
    assert [path.name for path in written] == [f"{name}.png" for name in (*PLOT_NAMES, RELIABILITY_PLOT)]
    assert png_size(run_dir / PLOTS_DIR / f"{RELIABILITY_PLOT}.png") == EXPECTED_SIZE
    (run_dir / RESULT_FILE).write_text(json.dumps({"main_metric": "accuracy"}))  # a kind without calibration
    assert [path.name for path in write_plots(run_dir)] == [f"{name}.png" for name in PLOT_NAMES]
