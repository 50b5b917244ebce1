"""The task section of kind choices: questions with their choices, in ARC's JSON Lines layout."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from finetune.kinds.recipe import OwnFilesSection, OwnHead
from finetune.tasks.specs import TaskSpec

FILES = {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"}


class ChoicesSection(OwnFilesSection):
    """A multiple-choice task: each line holds a question, its choices with their labels and the answerKey."""

    kind_name: ClassVar[str] = "choices"
    auto_class_name: ClassVar[str] = "AutoModelForMultipleChoice"
    loss_keys: ClassVar[tuple[str, ...]] = ("label_smoothing",)
    reads: ClassVar[str] = "JSON Lines files in ARC's layout"
    own_head: ClassVar[OwnHead | None] = OwnHead(
        "is for classifiers; a multiple-choice model (task.kind choices) scores each choice with its family's own head",
        "a multiple-choice model",
        "a multiple-choice model scores each choice with its family's own head",
    )

    kind: Literal["choices"] = Field(
        "choices",
        description="choices: the right answer among each question's choices, from JSON Lines in ARC's layout",
    )
    format: Literal["jsonl"] | None = Field(None, description="kind choices: jsonl, ARC's layout (the only one)")

    @field_validator("format", mode="before")
    @classmethod
    def _json_lines(cls, value: Any) -> Any:
        if value not in (None, "jsonl"):
            raise ValueError(f"{value}: a multiple-choice task reads JSON Lines in ARC's layout (format: jsonl)")
        return value

    def spec(self) -> TaskSpec:
        """Scored by accuracy; its labels are each question's own (A-E, 1-4): the spec has none."""
        return TaskSpec(
            name=self.name,
            text_columns=("question", "choices"),
            label_column="answerKey",
            labels=None,
            metrics=("accuracy",),
            files=dict(self.files or FILES),
            file_format="jsonl",
            kind=self.kind_name,
            problem_type=None,
        )
