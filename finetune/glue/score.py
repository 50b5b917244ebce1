"""The GLUE score under each averaging convention in use, the conventions written as data.

Papers and the leaderboard average different things under the same name; a report labels each
score with its convention, and a score with a task missing is never given (only the mean of what
is there, labelled as such).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Component:
    """One averaged entry of a GLUE score: the mean of its (task, metric) parts."""

    label: str
    parts: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Convention:
    """A way of averaging per-task scores into one GLUE score: the plain mean of its components."""

    name: str
    description: str
    components: tuple[Component, ...]


def _single(label: str, task: str, metric: str) -> Component:
    """A component of one task and one metric."""
    return Component(label, ((task, metric),))


CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "leaderboard",
        "gluebenchmark.com: mean of 9 tasks; a task's metrics averaged first (MRPC and QQP F1/accuracy, STS-B "
        "Pearson/Spearman), MNLI matched/mismatched averaged into one; CoLA MCC; WNLI in, AX out",
        (
            _single("CoLA", "cola", "mcc"),
            _single("SST-2", "sst2", "accuracy"),
            Component("MRPC", (("mrpc", "f1"), ("mrpc", "accuracy"))),
            Component("STS-B", (("stsb", "pearson"), ("stsb", "spearman"))),
            Component("QQP", (("qqp", "f1"), ("qqp", "accuracy"))),
            Component("MNLI", (("mnli", "accuracy"), ("mnli-mm", "accuracy"))),
            _single("QNLI", "qnli", "accuracy"),
            _single("RTE", "rte", "accuracy"),
            _single("WNLI", "wnli", "accuracy"),
        ),
    ),
    Convention(
        "bert-paper",
        "BERT paper, Table 1 'Average': 9 numbers, WNLI out; MNLI-m and MNLI-mm separately; MRPC and QQP F1, "
        "STS-B Spearman, CoLA MCC, others accuracy",
        (
            _single("CoLA", "cola", "mcc"),
            _single("SST-2", "sst2", "accuracy"),
            _single("MRPC", "mrpc", "f1"),
            _single("STS-B", "stsb", "spearman"),
            _single("QQP", "qqp", "f1"),
            _single("MNLI-m", "mnli", "accuracy"),
            _single("MNLI-mm", "mnli-mm", "accuracy"),
            _single("QNLI", "qnli", "accuracy"),
            _single("RTE", "rte", "accuracy"),
        ),
    ),
    Convention(
        "one-metric-per-task",
        "one named metric per task, 10 numbers: CoLA MCC, MRPC F1, QQP F1, STS-B Pearson, MNLI-m and MNLI-mm "
        "accuracy separately, SST-2, QNLI, RTE and WNLI accuracy",
        (
            _single("CoLA", "cola", "mcc"),
            _single("SST-2", "sst2", "accuracy"),
            _single("MRPC", "mrpc", "f1"),
            _single("STS-B", "stsb", "pearson"),
            _single("QQP", "qqp", "f1"),
            _single("MNLI-m", "mnli", "accuracy"),
            _single("MNLI-mm", "mnli-mm", "accuracy"),
            _single("QNLI", "qnli", "accuracy"),
            _single("RTE", "rte", "accuracy"),
            _single("WNLI", "wnli", "accuracy"),
        ),
    ),
)


def glue_score(convention: Convention, scores: dict[str, dict[str, float]]) -> dict:
    """The convention's score from per-task metrics ({task: {metric: value}}); None while a component is missing."""
    components, missing = {}, []
    for component in convention.components:
        values = [scores.get(task, {}).get(metric) for task, metric in component.parts]
        present = [value for value in values if value is not None]
        if len(present) < len(values):
            missing.append(component.label)
        else:
            components[component.label] = statistics.fmean(present)
    return {
        "description": convention.description,
        "score": statistics.fmean(components.values()) if not missing else None,
        "components": components,
        "missing": missing,
        # Only a hint while tasks are missing: never comparable with a GLUE score.
        "mean_of_present": statistics.fmean(components.values()) if components else None,
    }


def glue_scores(scores: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Every convention's score, by convention name."""
    return {convention.name: glue_score(convention, scores) for convention in CONVENTIONS}
