"""The task section of kind spans: extractive question answering from SQuAD JSON files."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from finetune.kinds.recipe import OwnFilesSection, OwnHead
from finetune.tasks.specs import TaskSpec

FILES = {"train": "train.json", "dev": "dev.json", "test": "test.json"}
METRICS = ("f1", "exact")  # SQuAD's token F1 and exact match (kinds/spans/metrics.py); f1 picks the best


class SpansSection(OwnFilesSection):
    """A question-answering task: SQuAD files hold the questions, contexts and answers; long contexts are read in
    windows (doc_stride). Null keys: the defaults (in an eval recipe: each checkpoint's own)."""

    kind_name: ClassVar[str] = "spans"
    auto_class_name: ClassVar[str] = "AutoModelForQuestionAnswering"
    reads: ClassVar[str] = "SQuAD JSON files"
    own_head: ClassVar[OwnHead | None] = OwnHead(
        "pools a text into one vector for a class; question answering (task.kind spans) scores every "
        "token as an answer's start and end",
        "question answering",
        "question answering scores every token: no pooling",
    )

    kind: Literal["spans"] = Field(
        "spans",
        description="spans: extractive question answering, an answer cut from a context, from SQuAD JSON files "
        "(v1.1, v2.0)",
    )
    doc_stride: int | None = Field(
        None,
        gt=0,
        description="kind spans: tokens two windows of a long context share; null: a third of max_length "
        "(128 of the default 384)",
    )
    n_best: int | None = Field(
        None, gt=0, description="kind spans: the best starts and ends paired per window; null: 20"
    )
    max_answer_length: int | None = Field(None, gt=0, description="kind spans: the longest answer, in tokens; null: 30")
    null_threshold: float | None = Field(
        None,
        description="kind spans, SQuAD 2.0: no answer when the no-answer score beats the best span's by more "
        "than this; null: 0.0 (eval reports the threshold that would have scored best on its split)",
    )

    @model_validator(mode="after")
    def _room_for_the_question(self) -> SpansSection:
        if self.doc_stride is not None and self.max_length is not None and self.doc_stride >= self.max_length // 2:
            raise ValueError(
                f"doc_stride {self.doc_stride}: windows of max_length {self.max_length} tokens need "
                f"a doc_stride below half of it ({self.max_length // 2}), room left for the question"
            )
        return self

    def spec(self) -> TaskSpec:
        """No labels: the answers are spans of the context."""
        return TaskSpec(
            name=self.name,
            text_columns=("question", "context"),
            label_column="answers",
            labels=None,
            metrics=METRICS,
            files=dict(self.files or FILES),
            file_format="squad",
            kind=self.kind_name,
            problem_type=None,
        )
