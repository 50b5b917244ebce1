"""What `finetune eval` writes for one task: report.json, report.md (a table of every model's scores) and, with
write_predictions, a predictions file per model."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from finetune.console import console
from finetune.reporting.class_report import classes_markdown, write_confusion_png

REPORT_JSON, REPORT_MARKDOWN = "report.json", "report.md"
PREDICTIONS_DIR = "predictions"  # one file per model, with write_predictions


def write_report(run_dir: Path, report: dict, markdown: str) -> None:
    """report.json and report.md in the run directory; the table is also printed."""
    (run_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name, result in report.get("results", {}).items():
        if "classes" in result:  # the PNG that report.md links (classes_markdown)
            write_confusion_png(result["classes"], run_dir, name)
    (run_dir / REPORT_MARKDOWN).write_text(markdown, encoding="utf-8")
    console.print(markdown, markup=False)  # [text](link) is Markdown, not console markup
    console.print(f"report written to {run_dir / REPORT_MARKDOWN}")


def task_report(
    run_dir: Path,
    recipe,
    spec,
    examples: int,
    results: dict,
    markdown: Callable[[dict], str],
    main_process: bool,
    metrics: Sequence[str] | None = None,
) -> dict:
    """A kind's evaluation report (the task, split, examples scored, metrics (the task's unless given) and each
    model's results), written by the main process (write_report, its Markdown by `markdown`); returned."""
    report = {
        "task": spec.name,
        "split": recipe.split,
        "examples": examples,
        "metrics": list(spec.metrics if metrics is None else metrics),
        "results": results,
    }
    if main_process:
        write_report(run_dir, report, markdown(report))
    return report


def report_markdown(report: dict) -> str:
    """A Markdown table: one row per model, one column per metric (scores x 100, as GLUE reports them)."""
    metrics = report["metrics"]
    lines = [
        f"# {report['task']} ({report['split']}, {report['examples']} examples)",
        "",
        "| model | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]

    def row(label: str, result: dict) -> str:
        scores = [f"{100 * result[metric]:.1f}" if metric in result else "-" for metric in metrics]
        return f"| {label} | " + " | ".join(scores) + " |"

    for name, result in report["results"].items():
        if "members" in result:  # an ensemble: its members, then their average
            lines += [row(f"{name}: {member['checkpoint']}", member) for member in result["members"]]
            lines.append(row(f"{name} (ensemble of {len(result['members'])})", result))
        else:
            lines.append(row(name, result))
    for name, result in report["results"].items():  # a classifier's: per class, and its confusion matrix
        if "classes" in result:
            lines += classes_markdown(name, result["classes"], png=True)
    return "\n".join(lines) + "\n"
