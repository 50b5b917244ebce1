"""A recipe's `task` section: one section per task kind (finetune/kinds/K/recipe.py), chosen by its `kind`.

TASK_SECTIONS is the recipes' side of the kinds' table (finetune/kinds/registry.py's KINDS holds the kind objects,
one layer up, which the recipes cannot import), as MODEL_SECTIONS is of the model families'; the layers between ask
it (models/task_heads.py: each kind's Auto class). It and the union written out for mypy below are the one list of
the kinds outside finetune/kinds/: tests/kinds/test_registry.py checks the three agree, and
tests/project/test_architecture.py that no other module lists kinds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag, TypeAdapter

from finetune.glue.specs import GLUE_TASKS
from finetune.kinds.choices.recipe import ChoicesSection
from finetune.kinds.classification.recipe import ClassificationSection
from finetune.kinds.multilabel.recipe import MultilabelSection
from finetune.kinds.recipe import TaskSection
from finetune.kinds.regression.recipe import RegressionSection
from finetune.kinds.spans.recipe import SpansSection
from finetune.kinds.tokens.recipe import TokensSection
from finetune.recipes.base import ECHO

TASK_SECTIONS: dict[str, type[TaskSection]] = {
    section.kind_name: section
    for section in (
        ClassificationSection,
        RegressionSection,
        MultilabelSection,
        TokensSection,
        ChoicesSection,
        SpansSection,
    )
}
TASK_KINDS = tuple(TASK_SECTIONS)
# The kind whose section reads a task that leaves `kind` out, or says classification without labels (how recipes
# and checkpoints from before kind regression wrote a score task): a GLUE task's own kind, else regression for a
# custom task without labels.
UNLABELLED_KIND = RegressionSection.kind_name
DEFAULT_KIND = ClassificationSection.kind_name


def task_kind(value: Any) -> str:
    """The kind of a task section (a dict as written, or a section already built)."""
    if not isinstance(value, dict):
        return getattr(value, "kind", DEFAULT_KIND)
    kind = value.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str):  # a list, a mapping, a number: its text names no kind, so the union reports it
        return ECHO.repr(kind)
    if kind != DEFAULT_KIND:
        return kind
    name = value.get("name")
    if isinstance(name, str) and name in GLUE_TASKS:
        return GLUE_TASKS[name].kind
    return DEFAULT_KIND if value.get("labels") is not None else UNLABELLED_KIND


if TYPE_CHECKING:
    # What the checker sees: the same sections, spelled out in TASK_SECTIONS' order (mypy cannot read a Union built at
    # run time; tests/kinds/test_registry.py checks it is TASK_SECTIONS').
    TaskConfig = (
        ClassificationSection | RegressionSection | MultilabelSection | TokensSection | ChoicesSection | SpansSection
    )
else:
    # A Union of a tuple built at run time: it has no `A | B` spelling.
    TaskConfig = Annotated[
        Union[tuple(Annotated[section, Tag(name)] for name, section in TASK_SECTIONS.items())],  # noqa: UP007
        Discriminator(task_kind),
    ]

_TASK_ADAPTER: TypeAdapter = TypeAdapter(TaskConfig)


def task_config(**keys: Any) -> TaskConfig:
    """The section of a task given as keys, validated as its kind's (what the `task:` of a recipe is)."""
    return _TASK_ADAPTER.validate_python(keys)
