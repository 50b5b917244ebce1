"""The task table: one record per task, so that reading, metrics and submissions never branch on names.

Column names follow the original GLUE TSV files (the layout of `download_glue_data.py`); the hub
columns and label order are those of the `nyu-mll/glue` dataset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

STANDARD_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
STANDARD_HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
HUB_DATASET = "nyu-mll/glue"


@dataclass(frozen=True)
class HubSource:
    """Where the hub's GLUE dataset keeps a task: its configuration, text columns, split names and label order."""

    config: str
    text_columns: tuple[str, ...]
    splits: dict[str, str] = field(default_factory=lambda: dict(STANDARD_HUB_SPLITS))
    # The task's label strings in the order of the hub's class ids; None: the task's own order.
    labels: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TaskSpec:
    """Everything needed to read, score and submit one task."""

    name: str
    text_columns: tuple[str, ...]  # the columns read: one text, a sentence pair, or the columns of text_template
    label_column: str
    # The class names (reports, predictions, the model's id2label): the files' label texts, or the recipe's
    # label_names for them; None: regression.
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]  # the first one selects the best checkpoint
    # split -> file name in the task's folder; None: whichever of SPLIT.tsv, SPLIT.csv and SPLIT.jsonl is there
    files: dict[str, str] | None = field(default_factory=lambda: dict(STANDARD_FILES))
    # Files without a header row get these column names (CoLA's train/dev).
    headerless_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    index_column: str = "index"  # test files: the id each submission row must carry
    file_format: str | None = None  # tsv, csv or jsonl; None: by each file's extension
    source: str = "files"  # files: read from a folder; hub: from the hub's GLUE dataset (see `hub`)
    # GLUE only:
    glue_folder: str | None = None  # the task's folder in a GLUE root (download_glue_data.py's layout)
    hub: HubSource | None = None
    predicted_by: str | None = None  # a task without a model of its own, predicted by this task's model
    submission_file: str | None = None  # file name in the leaderboard archive
    submission_labels: tuple[str, ...] | None = None  # what a submission writes per class; None: the labels
    submission_range: tuple[float, float] | None = None  # regression predictions are clipped to this
    test_rows: int | None = None  # rows of the official test file: what a submission must have
    # Custom tasks only:
    text_template: str | None = None  # the one text a model reads, each {column} filled in; None: the columns
    file_labels: tuple[str, ...] | None = None  # the labels as the files write them, where labels renames them
    # Tagging tasks (kind tokens): a tag per word, read from CoNLL column files; `labels` are the tags.
    kind: str = "classification"
    tag_column: int = -1  # the column of a CoNLL line that holds the tag
    # Multi-label tasks (kind multilabel): a set of `labels` per example, from a list column (label_column, its
    # items separated by label_separator in TSV/CSV) or from a 0/1 column per label (label_columns).
    label_columns: tuple[str, ...] | None = None
    label_separator: str = "|"

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

    @property
    def display_name(self) -> str:
        """The task's name on the leaderboard (CoLA, MNLI-mm, ...), or its own name."""
        return Path(self.submission_file).stem if self.submission_file else self.name

    def model_texts(self, columns: tuple[str, ...]) -> tuple[str, ...]:
        """What a model reads of one example's text columns: the columns themselves (one text or a pair), or the one
        text of `text_template`."""
        if self.text_template is None:
            return columns
        values = dict(zip(self.text_columns, columns))
        return (TEMPLATE_COLUMN.sub(lambda match: values[match.group(1)], self.text_template),)


TEMPLATE_COLUMN = re.compile(r"\{([^{}]+)\}")  # a {column} of task.text


def template_columns(template: str) -> list[str]:
    """The columns a task.text template names, each once, in the order they first appear."""
    return list(dict.fromkeys(TEMPLATE_COLUMN.findall(template)))


def label_text(value: Any) -> Any:
    """A label as the files write it: a number stands for its digits (1: "1"), a boolean for true or false (as YAML
    and JSON write it); anything else as it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else value


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_HUB_NLI = ("entailment", "neutral", "contradiction")  # the hub numbers MNLI's classes in this order
_ENTAILMENT = ("entailment", "not_entailment")
_PAIR = ("sentence1", "sentence2")
_PREMISE_HYPOTHESIS = ("premise", "hypothesis")

GLUE_TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            "cola",
            ("sentence",),
            "label",
            _BINARY,
            ("mcc", "accuracy"),
            headerless_columns=dict.fromkeys(("train", "dev"), ("source", "label", "star", "sentence")),
            glue_folder="CoLA",
            hub=HubSource("cola", ("sentence",)),
            submission_file="CoLA.tsv",
            test_rows=1063,
        ),
        TaskSpec(
            "sst2",
            ("sentence",),
            "label",
            _BINARY,
            ("accuracy",),
            glue_folder="SST-2",
            hub=HubSource("sst2", ("sentence",)),
            submission_file="SST-2.tsv",
            test_rows=1821,
        ),
        TaskSpec(
            "mrpc",
            ("#1 String", "#2 String"),
            "Quality",
            _BINARY,
            ("f1", "accuracy"),
            glue_folder="MRPC",
            hub=HubSource("mrpc", _PAIR),
            submission_file="MRPC.tsv",
            test_rows=1725,
        ),
        TaskSpec(
            "stsb",
            _PAIR,
            "score",
            None,
            ("pearson", "spearman"),
            glue_folder="STS-B",
            hub=HubSource("stsb", _PAIR),
            submission_file="STS-B.tsv",
            submission_range=(0.0, 5.0),
            test_rows=1379,
        ),
        TaskSpec(
            "qqp",
            ("question1", "question2"),
            "is_duplicate",
            _BINARY,
            ("f1", "accuracy"),
            index_column="id",
            glue_folder="QQP",
            hub=HubSource("qqp", ("question1", "question2")),
            submission_file="QQP.tsv",
            test_rows=390965,
        ),
        TaskSpec(
            "mnli",
            _PAIR,
            "gold_label",
            _NLI,
            ("accuracy",),
            files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
            glue_folder="MNLI",
            submission_file="MNLI-m.tsv",
            test_rows=9796,
            hub=HubSource(
                "mnli",
                _PREMISE_HYPOTHESIS,
                {"train": "train", "dev": "validation_matched", "test": "test_matched"},
                _HUB_NLI,
            ),
        ),
        TaskSpec(
            "mnli-mm",
            _PAIR,
            "gold_label",
            _NLI,
            ("accuracy",),
            files={"train": "train.tsv", "dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
            glue_folder="MNLI",
            predicted_by="mnli",
            submission_file="MNLI-mm.tsv",
            test_rows=9847,
            hub=HubSource(
                "mnli",
                _PREMISE_HYPOTHESIS,
                {"train": "train", "dev": "validation_mismatched", "test": "test_mismatched"},
                _HUB_NLI,
            ),
        ),
        TaskSpec(
            "qnli",
            ("question", "sentence"),
            "label",
            _ENTAILMENT,
            ("accuracy",),
            glue_folder="QNLI",
            hub=HubSource("qnli", ("question", "sentence")),
            submission_file="QNLI.tsv",
            test_rows=5463,
        ),
        TaskSpec(
            "rte",
            _PAIR,
            "label",
            _ENTAILMENT,
            ("accuracy",),
            glue_folder="RTE",
            hub=HubSource("rte", _PAIR),
            submission_file="RTE.tsv",
            test_rows=3000,
        ),
        TaskSpec(
            "wnli",
            _PAIR,
            "label",
            _BINARY,
            ("accuracy",),
            glue_folder="WNLI",
            hub=HubSource("wnli", _PAIR),
            submission_file="WNLI.tsv",
            test_rows=146,
        ),
        # The diagnostic set has no training data and no public labels: the MNLI model predicts it.
        TaskSpec(
            "ax",
            _PAIR,
            "label",
            _NLI,
            ("mcc",),
            files={"test": "diagnostic.tsv"},
            glue_folder="diagnostic",
            predicted_by="mnli",
            submission_file="AX.tsv",
            test_rows=1104,
            hub=HubSource("ax", _PREMISE_HYPOTHESIS, {"test": "test"}, _HUB_NLI),
        ),
    ]
}

# The 11 files of an archive, each with its task
SUBMISSION_FILES: dict[str, TaskSpec] = {
    spec.submission_file: spec for spec in GLUE_TASKS.values() if spec.submission_file
}
SUBMISSION_TASKS = list(SUBMISSION_FILES.values())


def predicted_with(name: str) -> list[TaskSpec]:
    """The GLUE task and those its model also predicts (mnli: mnli, mnli-mm and ax)."""
    return [GLUE_TASKS[name]] + [spec for spec in GLUE_TASKS.values() if spec.predicted_by == name]


def task_spec(task_config) -> TaskSpec:
    """The spec for a recipe's `task` section: the GLUE record, or one built from the custom keys."""
    if task_config.kind == "tokens":
        return tagging_spec(task_config)
    if task_config.kind == "choices":
        return choices_spec(task_config)
    if task_config.kind == "spans":
        return spans_spec(task_config)
    if task_config.kind == "multilabel":
        return multilabel_spec(task_config)
    if task_config.name in GLUE_TASKS:
        spec = GLUE_TASKS[task_config.name]
        return replace(spec, source="hub") if task_config.source == "hub" else spec
    columns = task_config.text_columns or template_columns(task_config.text)
    template = task_config.text
    if template is None and len(columns) > 1 and not task_config.reads_a_pair:
        template = " ".join(f"{{{column}}}" for column in columns)  # joined with a space into one text
    labels, names = task_config.labels, task_config.label_names or {}
    files = task_config.files or (
        {split: f"{split}.{task_config.format}" for split in STANDARD_FILES} if task_config.format else None
    )
    return TaskSpec(
        name=task_config.name,
        text_columns=tuple(columns),
        label_column=task_config.label_column,
        labels=tuple(names.get(label, label) for label in labels) if labels is not None else None,
        metrics=tuple(task_config.metrics or (["pearson", "spearman"] if labels is None else ["accuracy"])),
        files=dict(files) if files is not None else None,
        index_column=task_config.index_column or "index",
        file_format=task_config.format,
        text_template=template,
        file_labels=tuple(labels) if names else None,
    )


TAGGING_FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}
TAGGING_METRICS = ("f1", "precision", "recall", "accuracy")  # entity-level micro scores (seqeval), token accuracy


def tagging_spec(task_config) -> TaskSpec:
    """A tagging task's spec: its tags are the recipe's labels, or (None here) those of its training file."""
    return TaskSpec(
        name=task_config.name,
        text_columns=("text",),
        label_column="tags",
        labels=tuple(task_config.labels) if task_config.labels is not None else None,
        metrics=TAGGING_METRICS,
        files=dict(task_config.files or TAGGING_FILES),
        file_format="conll",
        kind="tokens",
        tag_column=task_config.tag_column,
    )


CHOICES_FILES = {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"}


def choices_spec(task_config) -> TaskSpec:
    """A multiple-choice task's spec: questions in ARC's JSON Lines layout, scored by accuracy. Its labels are
    each question's own (A-E, 1-4): the spec has none."""
    return TaskSpec(
        name=task_config.name,
        text_columns=("question", "choices"),
        label_column="answerKey",
        labels=None,
        metrics=("accuracy",),
        files=dict(task_config.files or CHOICES_FILES),
        file_format="jsonl",
        kind="choices",
    )


SPANS_FILES = {"train": "train.json", "dev": "dev.json", "test": "test.json"}
SPANS_METRICS = ("f1", "exact")  # SQuAD's token F1 and exact match (glue/squad_metrics.py); f1 picks the best


def spans_spec(task_config) -> TaskSpec:
    """A question-answering task's spec: SQuAD JSON files, no labels (the answers are spans of the context)."""
    return TaskSpec(
        name=task_config.name,
        text_columns=("question", "context"),
        label_column="answers",
        labels=None,
        metrics=SPANS_METRICS,
        files=dict(task_config.files or SPANS_FILES),
        file_format="squad",
        kind="spans",
    )


MULTILABEL_METRICS = ("micro_f1", "macro_f1", "subset_accuracy")  # micro F1 selects the best checkpoint
DEFAULT_LABEL_SEPARATOR = "|"


def multilabel_spec(task_config) -> TaskSpec:
    """A multi-label task's spec: a custom task's text columns, a label set per example."""
    label_columns = task_config.label_columns
    plain = task_config.model_copy(
        update={
            "kind": "classification",
            "label_columns": None,
            "threshold": None,
            "label_separator": None,
            "label_column": task_config.label_column or label_columns[0],
        }
    )
    spec = task_spec(plain)
    return replace(
        spec,
        kind="multilabel",
        metrics=MULTILABEL_METRICS,
        labels=tuple(label_columns) if label_columns else spec.labels,
        label_column=task_config.label_column or ", ".join(label_columns),
        label_columns=tuple(label_columns) if label_columns else None,
        label_separator=task_config.label_separator or DEFAULT_LABEL_SEPARATOR,
    )
