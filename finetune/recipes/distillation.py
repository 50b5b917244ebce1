"""The `distillation` section of a fine-tuning run (a fine-tuned teacher teaches the model being trained, Hinton et
al. 2015), and `model.keep_layers` (a smaller student made of some of a checkpoint's blocks, DistilBERT's
initialisation)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from finetune.recipes.base import InputFolder, Section

KEEP_LAYERS_HELP = (
    "a smaller model made of some of model.checkpoint's blocks (DistilBERT's initialisation of a student): "
    "every_other keeps blocks 0, 2, 4, ...; a list keeps those (0 is the lowest), in their order; the embeddings and "
    "the head are kept; null: every block"
)

DISTILLATION_HELP = (
    "a fine-tuned checkpoint of the same task teaches the model (kinds classification, regression, multilabel, "
    "tokens): the loss mixes the teacher's soft targets at a temperature with the hard labels, and the teacher labels "
    "unlabelled_text too (soft targets only); teacher and student may have different tokenizers (the teacher reads "
    "the text); null: no teacher"
)


class DistillationConfig(Section):
    """What the teacher is and how much the student learns from it."""

    teacher: InputFolder = Field(
        description="the teacher: a checkpoint fine-tuned by finetune on this task (its labels, in the same order)"
    )
    temperature: float = Field(
        2.0,
        gt=0,
        description="T: both models' logits are divided by T before the softmax of the soft-target loss, which is "
        "multiplied by T^2 (Hinton et al.) so its gradients keep their size; higher: more of the teacher's "
        "ranking of the wrong classes; regression ignores it",
    )
    soft_weight: float = Field(
        0.5,
        ge=0,
        le=1,
        description="the soft-target loss's share of the loss (the KL divergence to the teacher's probabilities; "
        "regression: the squared distance to its score); the hard labels' cross-entropy (or squared error) takes the "
        "rest; rows of unlabelled_text have soft targets only; 1: the teacher alone",
    )
    hidden_weight: float = Field(
        0.0,
        ge=0,
        description="DistilBERT's cosine loss: this weight x (1 - the cosine similarity of the student's and the "
        "teacher's last hidden states), averaged over the real tokens, added to the loss; needs the same tokenizer "
        "and hidden size (a student of the teacher's blocks has them) and runs the teacher at each step; 0: off",
    )


def keep_layers_value(value: Any) -> Any:
    """`every_other`, or a list of distinct block numbers from 0."""
    if isinstance(value, list):
        if not value:
            raise ValueError("model.keep_layers: an empty list keeps no block; list some, or null for all")
        if any(not isinstance(block, int) or isinstance(block, bool) or block < 0 for block in value):
            raise ValueError(f"model.keep_layers: {value} holds something other than block numbers from 0")
        if len(set(value)) != len(value):
            raise ValueError(f"model.keep_layers: {value} names a block twice")
    return value


KeepLayers = Literal["every_other"] | list[int] | None
