"""The task record: one TaskSpec per task, so that reading, metrics, predictions and submissions never branch on
names or kinds; its helpers (a task.text template's columns, a label as the files write it); and the two names the
layers above it share without importing each other: where a run keeps a task's rows (DATA_DIR: recipes, run_dir,
data) and the label that carries no loss (IGNORE_INDEX: data, models).

Every kind's task is one (a kind's section builds it: finetune/kinds/K/recipe.py); GLUE's are a table of them
(finetune/glue/specs.py), whose conventions some fields keep (`glue_folder`, `hub`, `submission_file`, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

STANDARD_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
STANDARD_HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
# RUN_DIR/data: a task's rows written before the run starts (in-memory data of the Python API, a dataset of
# task.source hub: data/run_data.py), read from there by the run as its task.data_dir (one of run_dir.py's OWN_ENTRIES).
DATA_DIR = "data"


@dataclass(frozen=True)
class HubSource:
    """Where the hub's GLUE dataset keeps a task: its configuration, text columns, split names and label order."""

    config: str
    text_columns: tuple[str, ...]
    splits: dict[str, str] = field(default_factory=lambda: dict(STANDARD_HUB_SPLITS))
    # The task's label strings in the order of the hub's class ids; None: the task's own order.
    labels: tuple[str, ...] | None = None


# Hugging Face's config.problem_type values: its names for the losses of a sequence classifier. Lower layers ask the
# spec for these (is_regression, label_sets), never for a task kind's name (tests/project/test_architecture.py).
SINGLE_LABEL_PROBLEM = "single_label_classification"
REGRESSION_PROBLEM = "regression"
MULTI_LABEL_PROBLEM = "multi_label_classification"
PROBLEM_TYPES = (SINGLE_LABEL_PROBLEM, REGRESSION_PROBLEM, MULTI_LABEL_PROBLEM)
# The label that carries no loss (torch's and transformers' convention): what the data writes where there is nothing
# to predict (a masked LM's unmasked tokens: data/masking.py), what the losses skip (models/linear_cross_entropy.py).
IGNORE_INDEX = -100


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
    # The task's kind (task.kind; finetune/kinds/registry.py looks its object up by it).
    kind: str = "classification"
    # Hugging Face's config.problem_type of a sequence classifier, which picks its loss (cross-entropy, MSE, binary
    # cross-entropy): set by the kind (one of PROBLEM_TYPES); None for the kinds with heads of their own.
    problem_type: str | None = SINGLE_LABEL_PROBLEM
    # A kind's own fields are its spec subclass's (kinds/K/spec.py: TaggingSpec's tag_column, ...), built by its
    # section; the kind narrows a TaskSpec to it (tagging_spec(spec), ...).

    def without_labels(self, no_column: str) -> TaskSpec:
        """This spec reading a file of its text columns alone: its label and id columns `no_column` (a column no
        file has), no text template (a kind whose labels are read from other columns too leaves those out)."""
        return replace(self, label_column=no_column, index_column=no_column, text_template=None)

    @property
    def is_regression(self) -> bool:
        """True when the label is a real number (STS-B): one output, a score."""
        return self.problem_type == REGRESSION_PROBLEM

    @property
    def label_sets(self) -> bool:
        """True when an example has a set of labels (multilabel): a 0/1 row, a sigmoid per label."""
        return self.problem_type == MULTI_LABEL_PROBLEM

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


def task_spec(task_config) -> TaskSpec:
    """The spec for a recipe's `task` section (its kind's section builds it: finetune/kinds/K/recipe.py)."""
    return task_config.spec()
