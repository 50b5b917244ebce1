"""The task table: one record per task, so that reading, metrics and submissions never branch on names.

Column names follow the original GLUE TSV files (the layout of `download_glue_data.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

STANDARD_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}


@dataclass(frozen=True)
class TaskSpec:
    """Everything needed to read, score and submit one task."""

    name: str
    text_columns: tuple[str, ...]  # one column (single sentence) or two (sentence pair)
    label_column: str
    labels: Optional[tuple[str, ...]]  # label strings as they appear in the files; None: regression
    metrics: tuple[str, ...]  # the first one selects the best checkpoint
    files: dict[str, str] = field(default_factory=lambda: dict(STANDARD_FILES))
    # Files without a header row get these column names (CoLA's train/dev).
    headerless_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    index_column: str = "index"  # test files: the id each submission row must carry
    submission_file: Optional[str] = None  # file name in the leaderboard archive
    submission_labels: Optional[tuple[str, ...]] = None  # what a submission writes per class; None: the labels

    @property
    def is_regression(self) -> bool:
        """True when the label is a real number (STS-B)."""
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Outputs of the task head: one per class, or one for regression."""
        return 1 if self.labels is None else len(self.labels)

    @property
    def main_metric(self) -> str:
        """The metric that picks the best checkpoint."""
        return self.metrics[0]


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_ENTAILMENT = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            "cola", ("sentence",), "label", _BINARY, ("mcc", "accuracy"),
            headerless_columns={split: ("source", "label", "star", "sentence") for split in ("train", "dev")},
            submission_file="CoLA.tsv",
        ),
        TaskSpec("sst2", ("sentence",), "label", _BINARY, ("accuracy",), submission_file="SST-2.tsv"),
        TaskSpec(
            "mrpc", ("#1 String", "#2 String"), "Quality", _BINARY, ("f1", "accuracy"), submission_file="MRPC.tsv"
        ),
        TaskSpec(
            "stsb", ("sentence1", "sentence2"), "score", None, ("pearson", "spearman"), submission_file="STS-B.tsv"
        ),
        TaskSpec(
            "qqp", ("question1", "question2"), "is_duplicate", _BINARY, ("f1", "accuracy"),
            index_column="id", submission_file="QQP.tsv",
        ),
        TaskSpec(
            "mnli", ("sentence1", "sentence2"), "gold_label", _NLI, ("accuracy",),
            files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
            submission_file="MNLI-m.tsv",
        ),
        TaskSpec(
            "mnli-mm", ("sentence1", "sentence2"), "gold_label", _NLI, ("accuracy",),
            files={"train": "train.tsv", "dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
            submission_file="MNLI-mm.tsv",
        ),
        TaskSpec("qnli", ("question", "sentence"), "label", _ENTAILMENT, ("accuracy",), submission_file="QNLI.tsv"),
        TaskSpec("rte", ("sentence1", "sentence2"), "label", _ENTAILMENT, ("accuracy",), submission_file="RTE.tsv"),
        TaskSpec("wnli", ("sentence1", "sentence2"), "label", _BINARY, ("accuracy",), submission_file="WNLI.tsv"),
        # The diagnostic set has no training data: it is predicted by an MNLI model.
        TaskSpec(
            "ax", ("sentence1", "sentence2"), "label", _NLI, ("mcc",),
            files={"test": "diagnostic.tsv"}, submission_file="AX.tsv",
        ),
    ]
}


def task_spec(task_config) -> TaskSpec:
    """The spec for a recipe's `task` section: the GLUE record, or one built from the custom keys."""
    if task_config.name in GLUE_TASKS:
        return GLUE_TASKS[task_config.name]
    return TaskSpec(
        name=task_config.name,
        text_columns=tuple(task_config.text_columns),
        label_column=task_config.label_column,
        labels=tuple(task_config.labels) if task_config.labels is not None else None,
        metrics=tuple(task_config.metrics or (["pearson", "spearman"] if task_config.labels is None else ["accuracy"])),
    )
