"""The task section of kind multilabel: a custom task whose label is a set (a list column, or a 0/1 column per
label)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from finetune.glue.specs import GLUE_TASKS
from finetune.kinds.multilabel.spec import DEFAULT_LABEL_SEPARATOR, MultilabelSpec
from finetune.kinds.recipe import DrawnRowsKeys, TextTaskSection, distinct, label_as_text
from finetune.tasks.specs import MULTI_LABEL_PROBLEM, TaskSpec, template_columns

# The names multi-label scores had before they took scikit-learn's spelling, which classification uses (0.2.0):
# recipes that write them are read with the new name and a notice (recipes/loader.py).
FORMER_NAMES = {"micro_f1": "f1_micro", "macro_f1": "f1_macro", "weighted_f1": "f1_weighted"}

METRICS = ("f1_micro", "f1_macro", "f1_weighted", "subset_accuracy")  # micro F1 selects the best checkpoint


class MultilabelSection(TextTaskSection, DrawnRowsKeys):
    """Any number of labels per example (label_column holding a list, or label_columns of 0/1)."""

    kind_name: ClassVar[str] = "multilabel"
    distils: ClassVar[bool] = True
    distils_unlabelled: ClassVar[bool] = True
    loss_keys: ClassVar[tuple[str, ...]] = ("pos_weight",)
    trains_on_pairs: ClassVar[bool] = True  # rows pair by a shared label (SetFit's rule); a regression per label

    kind: Literal["multilabel"] = Field(
        "multilabel",
        description="multilabel: any number of labels per example (label_column holding a list, or label_columns "
        "of 0/1)",
    )
    labels: list[str] | None = Field(
        None,
        min_length=2,
        description="kind multilabel: the label set, as label_column's lists write the labels (left out with "
        "label_columns, which name them)",
    )
    label_columns: list[str] | None = Field(
        None,
        min_length=2,
        description="kind multilabel: one 0/1 column per label, named by the label (instead of label_column)",
    )
    label_separator: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="kind multilabel: what separates the labels of a label_column in TSV/CSV files (e.g. "
        "PER|LOC); null: |. A JSON list (a JSON Lines value, or a field that starts with [) is read as one",
    )
    threshold: Annotated[float, Field(gt=0, lt=1)] | Literal["dev"] | None = Field(
        None,
        description="kind multilabel: a label is predicted when its probability is above this; dev: the "
        "threshold that maximises micro F1 on dev, chosen at each evaluation and saved with the checkpoint; null: "
        "0.5 (in an eval recipe: each checkpoint's own)",
    )

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_written(cls, labels: Any) -> Any:
        return [label_as_text(label) for label in labels] if isinstance(labels, list) else labels

    @field_validator("labels", "label_columns")
    @classmethod
    def _distinct_names(cls, names: list[str] | None) -> list[str] | None:
        return distinct(names)

    @model_validator(mode="after")
    def _a_label_set(self) -> MultilabelSection:
        """A custom task whose label is a set: a list column, or a 0/1 column per label."""
        if self.data_dir is None or self.source == "hub" or self.hub is not None:
            raise ValueError("kind multilabel reads the task's files: give data_dir (not source hub, nor hub)")
        if self.both_orders:
            raise ValueError("both_orders reads a sentence pair twice, each order truncated: not with kind multilabel")
        if self.name in GLUE_TASKS:
            kind = GLUE_TASKS[self.name].kind
            raise ValueError(f"'{self.name}' is a GLUE task (kind {kind}); name the multi-label task otherwise")
        if self.text_columns is None and self.text is None:
            raise ValueError("kind multilabel needs text_columns (or text)")
        if (self.label_column is None) == (self.label_columns is None):
            both = ", not both" if self.label_column is not None else ""
            raise ValueError(
                "kind multilabel needs label_column (a list of labels per example) or label_columns "
                f"(a 0/1 column per label){both}"
            )
        if self.label_column is not None and self.labels is None:
            raise ValueError("labels: list the label set (label_column holds lists of them)")
        if self.label_columns is not None:
            if self.labels is not None:
                raise ValueError("labels: with label_columns the columns name the labels; leave labels out")
            if self.label_separator is not None:
                raise ValueError("label_separator: for a label_column holding lists, not label_columns")
        label_columns = self.label_columns or ([self.label_column] if self.label_column is not None else [])
        text_columns = self.text_columns or (template_columns(self.text) if self.text is not None else [])
        shared = set(label_columns) & set(text_columns)
        if shared:
            raise ValueError(f"'{sorted(shared)[0]}' is both a text column and a label column")
        self.check_text()
        return self

    def spec(self) -> TaskSpec:
        label_columns = tuple(self.label_columns) if self.label_columns else None
        spec = self.text_spec(
            label_columns or tuple(self.labels or ()),
            METRICS,
            MultilabelSpec,
            problem_type=MULTI_LABEL_PROBLEM,
            label_columns=label_columns,
            label_separator=self.label_separator or DEFAULT_LABEL_SEPARATOR,
        )
        return replace(spec, label_column=self.label_column or ", ".join(label_columns or ()))
