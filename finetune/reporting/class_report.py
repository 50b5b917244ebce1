"""The per-class report of a classifier (tasks/metrics.py's class_report: precision, recall, F1 and support per class,
and the confusion matrix) as Markdown tables and as a PNG of the confusion matrix: what `finetune eval`'s report.md
and the model card show, so that a class the model never predicts is seen."""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure

from finetune.reporting.plots import new_figure, save_figure

CONFUSION_DIR = "plots"  # beside report.md (a run directory's own folder of figures)
CONFUSION_PNG = "confusion-{name}.png"  # in it, one per model


def per_class_markdown(classes: dict) -> list[str]:
    """A Markdown table: one row per class, its precision, recall and F1 (x 100) and support."""
    lines = ["| class | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|"]
    for label, row in classes["per_class"].items():
        lines.append(
            f"| {label} | {100 * row['precision']:.1f} | {100 * row['recall']:.1f} | {100 * row['f1']:.1f} "
            f"| {row['support']} |"
        )
    return lines


def confusion_markdown(classes: dict) -> list[str]:
    """The confusion matrix as a Markdown table: a row per true class, a column per predicted class."""
    labels = classes["labels"]
    lines = ["| true \\ predicted | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for label, row in zip(labels, classes["confusion_matrix"]):
        lines.append(f"| {label} | " + " | ".join(str(count) for count in row) + " |")
    return lines


def confusion_figure(classes: dict, title: str) -> Figure:
    """The confusion matrix as a heat map, each cell's count written in it."""
    figure, (axes,) = new_figure()
    labels, matrix = classes["labels"], classes["confusion_matrix"]
    image = axes.imshow(matrix, cmap="Blues")
    figure.colorbar(image, ax=axes)
    axes.set_xticks(range(len(labels)), labels=labels, rotation=45, ha="right")
    axes.set_yticks(range(len(labels)), labels=labels)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(title)
    top = max((count for row in matrix for count in row), default=0)
    for row_index, row in enumerate(matrix):
        for column, count in enumerate(row):
            color = "white" if top and count > top / 2 else "black"
            axes.text(column, row_index, str(count), ha="center", va="center", color=color)
    return figure


def confusion_png_name(model: str) -> str:
    """The PNG of a model's confusion matrix, relative to report.md: plots/confusion-NAME.png, NAME its report name
    with anything but letters, digits, - and _ as _."""
    return f"{CONFUSION_DIR}/" + CONFUSION_PNG.format(name=re.sub(r"[^A-Za-z0-9_-]", "_", model))


def write_confusion_png(classes: dict, directory: Path, model: str) -> Path:
    """Draw a model's confusion matrix beside report.md in `directory`; returns the file."""
    path = directory / confusion_png_name(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(confusion_figure(classes, f"{model}: confusion matrix"), path)


def classes_markdown(model: str, classes: dict, png: bool) -> list[str]:
    """A model's per-class section of report.md: the table, the confusion matrix, and with `png` a link to it."""
    lines = ["", f"## {model}: per class", "", *per_class_markdown(classes), "", "Confusion matrix:", ""]
    lines += confusion_markdown(classes)
    if png:
        lines += ["", f"![{model}: confusion matrix]({confusion_png_name(model)})"]
    return lines


def classes_of(table: dict[str, dict], count: str) -> dict:
    """A kind's own table per label or entity type (its count column named `count`: examples, entities) in the
    shape of class_report (labels, per_class with a support column), which result.json and the model card show."""
    per_class = {
        name: {**{key: value for key, value in row.items() if key != count}, "support": row[count]}
        for name, row in table.items()
    }
    return {"labels": list(per_class), "per_class": per_class}
