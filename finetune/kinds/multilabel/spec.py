"""The task record of kind multilabel: a TaskSpec with where each example's label set is read from (its section
builds one, kinds/multilabel/recipe.py); its `labels` are the label set."""

from __future__ import annotations

from dataclasses import dataclass, replace

from finetune.tasks.specs import TaskSpec

DEFAULT_LABEL_SEPARATOR = "|"


@dataclass(frozen=True)
class MultilabelSpec(TaskSpec):
    """A multi-label task: a set of `labels` per example, from a list column (label_column, its items separated by
    label_separator in TSV/CSV) or from a 0/1 column per label (label_columns)."""

    label_columns: tuple[str, ...] | None = None
    label_separator: str = DEFAULT_LABEL_SEPARATOR

    def without_labels(self, no_column: str) -> TaskSpec:
        """Its 0/1 columns, too, are left unread."""
        return replace(multilabel_spec(super().without_labels(no_column)), label_columns=None)


def multilabel_spec(spec: TaskSpec) -> MultilabelSpec:
    """The spec of a task of kind multilabel as its own (the section of kind multilabel builds a MultilabelSpec)."""
    assert isinstance(spec, MultilabelSpec), f"task '{spec.name}' is of kind {spec.kind}, not multilabel"
    return spec
