"""The task section of kind classification: a GLUE task by name, or a custom one with its labels."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from finetune.glue.specs import GLUE_TASKS
from finetune.kinds.recipe import DrawnRowsKeys, GlueOrCustomSection, LabelName, distinct, label_as_text
from finetune.tasks.specs import TaskSpec

# What a classification task can report (glue/metrics.py computes them); f1 is the positive class's, of two labels.
ClassificationMetric = Literal["accuracy", "f1", "mcc", "f1_macro", "f1_weighted", "precision_macro", "recall_macro"]
METRICS: tuple[str, ...] = get_args(ClassificationMetric)


class ClassificationSection(GlueOrCustomSection, DrawnRowsKeys):
    """A class per example, from its text or sentence pair: a GLUE task by name, or a custom one described here."""

    kind_name: ClassVar[str] = "classification"
    loss_keys: ClassVar[tuple[str, ...]] = ("class_weights", "label_smoothing")
    trains_on_pairs: ClassVar[bool] = True
    self_trains: ClassVar[bool] = True
    distils: ClassVar[bool] = True
    distils_unlabelled: ClassVar[bool] = True
    calibrations: ClassVar[tuple[str, ...]] = ("temperature",)  # one softmax over the classes: one scalar fits it

    kind: Literal["classification"] = Field(
        "classification",
        description="classification: a class per example, from its text or sentence pair (the kind of a task that "
        "leaves kind out: a GLUE task's own, stsb's regression; else classification with labels and regression "
        "without, as older recipes and checkpoints wrote a score task)",
    )
    labels: list[str] | None = Field(
        None,
        min_length=2,
        description="custom: the labels as the files write them, compared as text (1 is the text "
        "1, true is true; quote anything else YAML would change: '1.0', 'yes', 'True')",
    )
    label_names: dict[str, LabelName] | None = Field(
        None,
        description="custom: names for the labels, e.g. {1: World, 2: Sports}, used by reports, predictions "
        "and the model's id2label; a label without one keeps its text",
    )
    metrics: list[ClassificationMetric] | None = Field(
        None,
        min_length=1,
        description="custom: metrics to report, the first one selects the best model (or metric_for_best); f1 is "
        "the positive class's (2 labels), f1_macro / f1_weighted / precision_macro / recall_macro any number",
    )

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_written(cls, labels: Any) -> Any:
        """YAML gives unquoted numbers and booleans as such: each stands for its text in the files."""
        return [label_as_text(label) for label in labels] if isinstance(labels, list) else labels

    @field_validator("label_names", mode="before")
    @classmethod
    def _named_labels_as_written(cls, names: Any) -> Any:
        return {label_as_text(label): name for label, name in names.items()} if isinstance(names, dict) else names

    @field_validator("metrics", mode="before")
    @classmethod
    def _scores_of_classes(cls, metrics: Any) -> Any:
        for metric in metrics if isinstance(metrics, list) else []:
            if metric in ("pearson", "spearman"):
                raise ValueError(f"metric {metric} is for regression (no labels) tasks")
        return metrics

    @field_validator("labels")
    @classmethod
    def _distinct_labels(cls, names: list[str] | None) -> list[str] | None:
        return distinct(names)

    @model_validator(mode="after")
    def _glue_or_custom(self) -> ClassificationSection:
        self.check_glue_or_custom(("labels", "label_names", "metrics"))
        if self.name in GLUE_TASKS:
            return self
        if self.labels is None:  # a custom task without labels is regression (recipes/task.py picks that kind)
            raise ValueError("labels: a classification task lists its labels (a task without them is regression)")
        self.check_label_names(self.labels)
        for metric in self.metrics or []:
            if metric == "f1" and len(self.labels) != 2:
                raise ValueError(
                    f"metric f1 (of the positive class) needs 2 labels, not {len(self.labels)}; "
                    "f1_macro or f1_weighted score any number of classes"
                )
        return self

    def check_label_names(self, labels: list[str]) -> None:
        """Label names name labels, each class its own name."""
        if self.label_names is None:
            return
        unknown = [label for label in self.label_names if label not in labels]
        if unknown:
            raise ValueError(f"label_names: '{unknown[0]}' is not one of the labels ({', '.join(labels)})")
        names = [self.label_names.get(label, label) for label in labels]
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            raise ValueError(f"label_names: two labels would both be called '{repeated}'")

    def computable_metrics(self) -> tuple[str, ...]:
        """A custom task: every metric of the kind (f1 with two labels); a GLUE task: its own."""
        if self.glue_spec() is not None:
            return self.spec().metrics
        return tuple(metric for metric in METRICS if metric != "f1" or len(self.labels or ()) == 2)

    def spec(self) -> TaskSpec:
        glue = self.glue_spec()
        if glue is not None:
            return glue
        assert self.labels is not None  # a custom classification task lists them (_glue_or_custom)
        names = self.label_names or {}
        return self.text_spec(
            tuple(names.get(label, label) for label in self.labels),
            tuple(self.metrics or ["accuracy"]),
            file_labels=tuple(self.labels) if names else None,
        )
