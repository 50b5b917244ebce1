"""The task section of kind tokens: a tag per word, from CoNLL column files."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from finetune.kinds.recipe import OwnFilesSection, OwnHead, distinct, label_as_text
from finetune.kinds.tokens.spec import TaggingSpec
from finetune.tasks.specs import TaskSpec

FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}

METRICS = ("f1", "precision", "recall", "accuracy")  # entity-level micro scores (seqeval), token accuracy


class TokensSection(OwnFilesSection):
    """A tagging task: CoNLL column files, each line a word and its columns, a blank line between sentences."""

    kind_name: ClassVar[str] = "tokens"
    distils: ClassVar[bool] = True
    auto_class_name: ClassVar[str] = "AutoModelForTokenClassification"
    reads: ClassVar[str] = "CoNLL column files"
    own_head: ClassVar[OwnHead | None] = OwnHead(
        "pools a text into one vector for a class; a tagger (task.kind tokens) reads every token",
        "a tagger",
        "a tagger reads every token: no pooling",
    )

    kind: Literal["tokens"] = Field(
        "tokens",
        description="tokens: a tag per word (named entities, parts of speech), from CoNLL column files (format: conll)",
    )
    format: Literal["conll"] | None = Field(
        None, description="kind tokens: conll, a word and its columns per line, a blank line between sentences"
    )
    tag_column: int = Field(
        -1,
        description="kind tokens: the column of each line that holds the tag (0 is the word; -1, the last: "
        "CoNLL-2003's named entities)",
    )
    labels: list[str] | None = Field(
        None, min_length=2, description="kind tokens: the tags; null: those of the training file"
    )

    @field_validator("format", mode="before")
    @classmethod
    def _conll(cls, value: Any) -> Any:
        if value not in (None, "conll"):
            raise ValueError(f"{value}: a tagging task reads CoNLL column files (format: conll)")
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_written(cls, labels: Any) -> Any:
        return [label_as_text(label) for label in labels] if isinstance(labels, list) else labels

    @field_validator("labels")
    @classmethod
    def _distinct_tags(cls, names: list[str] | None) -> list[str] | None:
        return distinct(names)

    def spec(self) -> TaskSpec:
        """Its tags are the recipe's labels, or (None here) those of its training file."""
        return TaggingSpec(
            name=self.name,
            text_columns=("text",),
            label_column="tags",
            labels=tuple(self.labels) if self.labels is not None else None,
            metrics=METRICS,
            files=dict(self.files or FILES),
            file_format="conll",
            kind=self.kind_name,
            problem_type=None,
            tag_column=self.tag_column,
        )
