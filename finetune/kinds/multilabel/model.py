"""Multi-label classifiers (task kind multilabel): a sequence classifier with `problem_type`
multi_label_classification (a sigmoid per label, binary cross-entropy), its decision threshold saved in config.json
so that eval and predict apply the one the run chose."""

from __future__ import annotations

from finetune.errors import CheckpointError
from finetune.models.heads import load_finetuned
from finetune.tasks.specs import TaskSpec

THRESHOLD_KEY = "multilabel_threshold"  # config.json: a label is predicted when its probability is above this
DEFAULT_THRESHOLD = 0.5  # a recipe without task.threshold, a checkpoint without a saved one


def load_finetuned_multilabel(name: str, spec: TaskSpec, *, trust_remote_code: bool = False):
    """A fine-tuned multi-label classifier whose labels are the task's, in order; a single-label one is refused."""
    model = load_finetuned(name, spec, trust_remote_code=trust_remote_code)
    if model.config.problem_type != "multi_label_classification":
        kind = "a regressor" if model.config.problem_type == "regression" else "a single-label classifier"
        raise CheckpointError(
            f"{kind} (one label per example), not a multi-label one: fine-tune it on a task of kind multilabel first",
            source=name,
        )
    return model


def saved_threshold(model) -> float | None:
    """The decision threshold a multi-label checkpoint was saved with (None: another tool's checkpoint)."""
    value = getattr(model.config, THRESHOLD_KEY, None)
    return float(value) if isinstance(value, (int, float)) else None
