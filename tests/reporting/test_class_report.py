"""The per-class section of `finetune eval`'s report.md and the confusion-matrix PNG it links."""

from __future__ import annotations

import json

import numpy as np

from finetune.reporting.class_report import confusion_png_name
from finetune.reporting.eval_report import report_markdown, write_report
from finetune.tasks.metrics import class_report


def test_report_md_shows_each_class_and_links_the_confusion_png(tmp_path):
    classes = class_report(("pos", "neg", "mixed"), np.array([0, 0, 1, 0]), np.array([0, 1, 1, 2]))
    report = {
        "task": "tiny",
        "split": "dev",
        "examples": 4,
        "metrics": ["accuracy"],
        "results": {"my model": {"checkpoint": "x", "accuracy": 0.5, "classes": classes}},
    }
    markdown = report_markdown(report)
    write_report(tmp_path, report, markdown)
    png = tmp_path / confusion_png_name("my model")
    assert png.relative_to(tmp_path).as_posix() == "plots/confusion-my_model.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = (tmp_path / "report.md").read_text()
    assert "](plots/confusion-my_model.png)" in written
    assert "| mixed | 0.0 | 0.0 | 0.0 | 1 |" in written  # never predicted: a row of zeros, not left out
    assert "| pos | 33.3 | 100.0 | 50.0 | 1 |" in written
    assert "| mixed | 1 | 0 | 0 |" in written  # the confusion matrix: the mixed example predicted as pos
    assert json.loads((tmp_path / "report.json").read_text())["results"]["my model"]["classes"] == classes


def test_a_report_without_classes_has_no_per_class_section(tmp_path):
    report = {"task": "sts", "split": "dev", "examples": 2, "metrics": ["pearson"], "results": {"m": {"pearson": 1}}}
    write_report(tmp_path, report, report_markdown(report))
    assert "per class" not in (tmp_path / "report.md").read_text()
    assert not list(tmp_path.rglob("*.png"))
