"""The task kinds' table: one line per kind, and the lookups the stages and commands use instead of comparing kind
names or listing kinds (each kind's Auto class, predictor, evaluation and spec fields are its object's to give).

A kind's recipe section is also listed in recipes/task.py's TASK_SECTIONS (the recipes layer cannot import the kind
objects); tests/kinds/test_registry.py checks the two agree, and tests/project/test_architecture.py that no other
module lists kinds.
"""

from __future__ import annotations

from finetune.errors import UserError
from finetune.kinds.base import TaskKind
from finetune.kinds.choices.kind import CHOICES
from finetune.kinds.classification.kind import CLASSIFICATION
from finetune.kinds.multilabel.kind import MULTILABEL
from finetune.kinds.regression.kind import REGRESSION
from finetune.kinds.spans.kind import SPANS
from finetune.kinds.tokens.kind import TOKENS
from finetune.tasks.specs import TaskSpec

# One line per kind: adding a kind is its package under finetune/kinds/ and a line here (and its section in
# recipes/task.py's TASK_SECTIONS and union); docs/contributing.md, "Add a task kind".
KINDS: dict[str, TaskKind] = {
    CLASSIFICATION.name: CLASSIFICATION,
    REGRESSION.name: REGRESSION,
    MULTILABEL.name: MULTILABEL,
    TOKENS.name: TOKENS,
    CHOICES.name: CHOICES,
    SPANS.name: SPANS,
}


def kind_named(name: str, key: str = "task.kind") -> TaskKind:
    """The kind called `name`; an unknown one is one line naming `key` and the kinds there are."""
    if name not in KINDS:
        raise UserError(f"{key}: unknown task kind '{name}' (expected {', '.join(KINDS)})")
    return KINDS[name]


def kind_of(spec: TaskSpec) -> TaskKind:
    """The kind of a task's spec (its section set spec.kind)."""
    return kind_named(spec.kind)
