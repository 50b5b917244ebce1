"""The task record of kind tokens: a TaskSpec with the CoNLL column its tags are read from (its section builds one,
kinds/tokens/recipe.py); its `labels` are the tags."""

from __future__ import annotations

from dataclasses import dataclass

from finetune.tasks.specs import TaskSpec


@dataclass(frozen=True)
class TaggingSpec(TaskSpec):
    """A tagging task: a tag per word, read from CoNLL column files."""

    tag_column: int = -1  # the column of a CoNLL line that holds the tag (0 is the word; -1 the last)


def tagging_spec(spec: TaskSpec) -> TaggingSpec:
    """The spec of a task of kind tokens as its own (the section of kind tokens builds a TaggingSpec)."""
    assert isinstance(spec, TaggingSpec), f"task '{spec.name}' is of kind {spec.kind}, not tokens"
    return spec
