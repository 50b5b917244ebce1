"""The task section of kind regression: a score per example (STS-B by name, or a custom task without labels)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from finetune.kinds.recipe import GlueOrCustomSection
from finetune.tasks.specs import REGRESSION_PROBLEM, TaskSpec

METRICS = ("pearson", "spearman")  # the correlations of STS-B; pearson picks the best checkpoint by default


class RegressionSection(GlueOrCustomSection):
    """A real-valued score per example, from its text or sentence pair: its label column holds numbers."""

    kind_name: ClassVar[str] = "regression"
    distils: ClassVar[bool] = True
    distils_unlabelled: ClassVar[bool] = True

    kind: Literal["regression"] = Field("regression", description="regression: a score per example")
    metrics: list[Literal["pearson", "spearman"]] | None = Field(
        None, min_length=1, description="custom: the correlations to report, the first one selects the best model"
    )

    @field_validator("kind", mode="before")
    @classmethod
    def _as_older_recipes_wrote_it(cls, kind: Any) -> Any:
        """Recipes (and the recipes saved with checkpoints) from before kind regression wrote a score task as kind
        classification without labels (recipes/task.py sends those here)."""
        return "regression" if kind == "classification" else kind

    @field_validator("metrics", mode="before")
    @classmethod
    def _correlations(cls, metrics: Any) -> Any:
        for metric in metrics if isinstance(metrics, list) else []:
            if metric in ("accuracy", "f1", "mcc"):
                raise ValueError(f"metric {metric} is for classification (labels) tasks")
        return metrics

    @model_validator(mode="after")
    def _glue_or_custom(self) -> RegressionSection:
        self.check_glue_or_custom(("metrics",))
        return self

    def computable_metrics(self) -> tuple[str, ...]:
        """A custom task: both correlations; a GLUE task (STS-B): its own."""
        return self.spec().metrics if self.glue_spec() is not None else METRICS

    def spec(self) -> TaskSpec:
        glue = self.glue_spec()
        if glue is not None:
            return glue
        return self.text_spec(None, tuple(self.metrics or METRICS), problem_type=REGRESSION_PROBLEM)
