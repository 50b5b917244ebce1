"""`finetune runs compare` of two runs: whether they differ beyond noise.

Two single finetune runs are compared row by row on their shared dev set (RUN_DIR/dev_predictions.jsonl, the rows'
keys equal and in the same order, else refused): accuracy by McNemar's exact test, every other metric by a paired
bootstrap of the rows, each difference with its 95% interval (the bootstrap's). Two folders of several runs (seeds,
draws) are compared over the runs both hold (the same draw and seed): the paired t-test of their scores, beside each
folder's mean and interval (reporting/significance.py has the tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from finetune.errors import UserError
from finetune.kinds.multilabel.metrics import multilabel_metrics
from finetune.reporting.dev_predictions import read_rows
from finetune.reporting.significance import (
    RESAMPLES,
    Difference,
    ResampledScore,
    accuracy_score,
    confusion_score,
    mcnemar,
    paired_bootstrap,
    paired_runs,
    right_rows,
    row_score,
)
from finetune.run_dir import DEV_PREDICTIONS_FILE
from finetune.tasks.metrics import METRICS

RIGHT_OR_WRONG = ("accuracy", "subset_accuracy")  # a row is right or wrong: McNemar's test


def paired_section(labels: list[str], folders: list[Path], summaries: list[dict | None]) -> str:
    """The Markdown section on whether two runs differ beyond noise ("" when no paired test applies)."""
    if len(folders) != 2:
        return ""
    first, second = summaries
    if first is not None and second is not None:
        return _runs_section(labels, first, second)
    if (first is None) != (second is None):
        return "\nNo paired test: one run against a folder of several; compare two runs, or two folders of runs.\n"
    missing = [label for label, folder in zip(labels, folders) if not (folder / DEV_PREDICTIONS_FILE).is_file()]
    if missing:
        if all(not (folder / "result.json").is_file() for folder in folders):
            return ""  # not fine-tuning runs: nothing was predicted
        return (
            f"\nNo paired test: {' and '.join(missing)} holds no {DEV_PREDICTIONS_FILE} (fine-tuning runs of "
            "classification, regression and multilabel tasks write it).\n"
        )
    return _rows_section(labels, folders)


def _rows_section(labels: list[str], folders: list[Path]) -> str:
    """Two single runs, row by row on their shared dev rows."""
    rows = [read_rows(folder / DEV_PREDICTIONS_FILE) for folder in folders]
    _check_same_rows(labels, rows)
    metrics = [name for name in _saved_scores(folders[0]) if name in _saved_scores(folders[1])]
    paired, differences = _paired_rows(rows), []
    for name in metrics:
        metric = name.removeprefix("dev_")
        score = paired.score_of(metric)
        if score is None:  # not a metric of rows (multilabel's dev_threshold)
            continue
        difference = paired_bootstrap(metric, score, paired.references, paired.first, paired.second)
        if metric in RIGHT_OR_WRONG:  # each row right or wrong: McNemar's exact test, the bootstrap's interval
            right = [right_rows(paired.references, predicted) for predicted in (paired.first, paired.second)]
            difference = replace(difference, p_value=mcnemar(*right), test="McNemar's exact test")
        differences.append(difference)
    header = f"\n## Paired test on the same {len(paired.references):,} dev rows\n\n"
    note = (
        f"Differences are the second run's score minus the first's. Accuracy's p-value is McNemar's exact test on the "
        "rows one run gets right and the other wrong; the other metrics' is a paired bootstrap of the dev rows "
        f"({RESAMPLES:,} resamples, seed 0), whose 2.5th and 97.5th percentiles give every interval."
    )
    scored = [(difference, [f"{difference.first:.4f}", f"{difference.second:.4f}"]) for difference in differences]
    return header + _table(labels, scored) + f"\n\n{note}\n"


def _runs_section(labels: list[str], first: dict, second: dict) -> str:
    """Two folders of runs, over the runs both hold."""
    shared = [run for run in first["runs"] if run in second["runs"]]
    if len(shared) < 2:
        return (
            f"\nNo paired test: the folders hold {len(shared)} run(s) of the same draw and seed; the paired t-test "
            "needs 2 or more.\n"
        )
    rows = []
    for name in (name for name in first["metrics"] if name in second["metrics"]):
        first_values = [first["metrics"][name]["values"][first["runs"].index(run)] for run in shared]
        second_values = [second["metrics"][name]["values"][second["runs"].index(run)] for run in shared]
        difference = paired_runs(name.removeprefix("dev_"), first_values, second_values)
        rows.append((difference, [_mean_cell(summary["metrics"][name]) for summary in (first, second)]))
    header = f"\n## Paired test over the {len(shared)} runs both folders hold ({', '.join(shared)})\n\n"
    note = (
        "Differences are the second folder's mean minus the first's over those runs, paired by draw and seed; their "
        "interval is Student t over the pairs and their p-value the paired t-test. Each folder's own mean and 95% "
        "interval (over all its runs) are in its column."
    )
    return header + _table(labels, rows) + f"\n\n{note}\n"


def _mean_cell(values: dict) -> str:
    interval = values.get("interval")
    return f"{values['mean']:.4f}" + (f" ({interval[0]:.4f} to {interval[1]:.4f})" if interval else "")


def _table(labels: list[str], rows: list[tuple[Difference, list[str]]]) -> str:
    """One row per metric: both runs' scores (as given), the difference, its interval, the p-value, the test and the
    verdict."""
    header = ["metric", *labels, "difference (second - first)", "95% interval", "p", "test", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * 5 + "---|---|"]
    for difference, scores in rows:
        interval = difference.interval
        cells = [
            difference.metric,
            *scores,
            f"{difference.difference:+.4f}",
            "-" if interval is None else f"{interval[0]:+.4f} to {interval[1]:+.4f}",
            "-" if difference.p_value is None else f"{difference.p_value:.4f}",
            difference.test,
            difference.verdict,
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _check_same_rows(labels: list[str], rows: list[list[dict]]) -> None:
    """Two runs' dev predictions are of the same rows, in the same order, with the same gold labels."""
    first, second = rows
    problem = None
    if len(first) != len(second):
        problem = f"{len(first):,} and {len(second):,} rows"
    else:
        differing = next((index for index, (a, b) in enumerate(zip(first, second)) if a["key"] != b["key"]), None)
        if differing is None:
            differing = next(
                (index for index, (a, b) in enumerate(zip(first, second)) if a["label"] != b["label"]), None
            )
        if differing is not None:
            problem = f"dev row {differing} differs"
    if problem is not None:
        raise UserError(
            f"runs compare: {labels[0]} and {labels[1]} were scored on different dev rows ({problem}); the paired "
            "test needs runs of the same dev set: the same task files and task.dev_split (and, with "
            "task.labels_per_class, draw)"
        )


def _saved_scores(folder: Path) -> dict:
    """The dev scores of a run's saved checkpoint (result.json)."""
    result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    return result["best" if result["saved"] == "best" else "last"]


@dataclass
class PairedRows:
    """Two runs' predictions of the same dev rows as arrays, and how each metric of their kind of task is scored."""

    references: np.ndarray
    first: np.ndarray
    second: np.ndarray
    score_of: Callable[[str], ResampledScore | None]


def _paired_rows(rows: list[list[dict]]) -> PairedRows:
    """Class indices (in the order of the rows' probabilities), 0/1 rows over the labels, or numbers."""
    first, second = rows
    sample = first[0]["label"] if first else 0.0
    names = list(first[0].get("probabilities") or {}) if first else []

    def classes(run: list[dict], key: str) -> np.ndarray:
        return np.array([names.index(row[key]) for row in run])

    def label_sets(run: list[dict], key: str) -> np.ndarray:
        return np.array([[name in row[key] for name in names] for row in run])

    def numbers(run: list[dict], key: str) -> np.ndarray:
        return np.array([row[key] for row in run], dtype=float)

    def class_score(metric: str) -> ResampledScore | None:
        return confusion_score(metric, len(names)) or _by_rows(METRICS.get(metric))

    values, score_of = (
        (classes, class_score)
        if isinstance(sample, str)
        else (label_sets, _label_set_score)
        if isinstance(sample, list)
        else (numbers, lambda metric: _by_rows(METRICS.get(metric)))
    )
    return PairedRows(values(first, "label"), values(first, "predicted"), values(second, "predicted"), score_of)


def _by_rows(function: Callable | None) -> ResampledScore | None:
    return None if function is None else row_score(function)


def _label_set_score(metric: str) -> ResampledScore | None:
    """A multi-label metric of resampled rows (subset accuracy at once, the others one resample at a time)."""
    if metric == "subset_accuracy":
        return accuracy_score
    if metric not in ("f1_micro", "f1_macro", "f1_weighted"):
        return None
    return row_score(lambda predicted, references: multilabel_metrics(references, predicted)[metric])
