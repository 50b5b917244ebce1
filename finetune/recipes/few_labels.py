"""The finetune recipe's sections for learning from few labels: `method` contrastive's pair training and
self-training on `unlabelled_text` (kinds/method.py decides the auto values, stages/self_training.py runs the
rounds)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from finetune.recipes.base import Section
from finetune.recipes.task import TASK_SECTIONS

METHODS = Literal["auto", "plain", "contrastive"]


class ContrastiveConfig(Section):
    """`contrastive`: SetFit's sentence-embedding training of the encoder on pairs of labelled rows, before the head."""

    iterations: int = Field(
        20,
        gt=0,
        description="pairs drawn per training row and kind (similar, dissimilar): 2 x iterations x rows pairs in "
        "all (SetFit's num_iterations, 20 in its paper)",
    )
    batch_size: int = Field(16, gt=0, description="pairs per optimizer step (SetFit's 16)")
    lr: float = Field(2e-5, gt=0, description="peak learning rate of the encoder's top group (SetFit's body 2e-5)")
    loss: Literal["cosine", "contrastive", "online_contrastive"] = Field(
        "cosine",
        description="sentence-transformers' pair loss: cosine (CosineSimilarityLoss, SetFit's: the cosine of a "
        "similar pair pulled to 1, of a dissimilar one to 0), contrastive (ContrastiveLoss, margin 0.5) or "
        "online_contrastive (OnlineContrastiveLoss: the hard pairs of each batch only)",
    )


UNLABELLED_TEXT_HELP = (
    "text without labels: with distillation, what the teacher labels for the student (soft targets; kinds "
    "classification, regression, multilabel); else self-training's, which the classifier labels for itself (kind "
    "classification): .txt one text "
    "a line (a task of one text column), or .tsv / .csv / .jsonl holding the task's text columns by name (other "
    "columns, a label column too, are ignored); one file or a list; []: none"
)
UNLABELLED_ROWS_HELP = "the first this many rows of unlabelled_text (the files in their order) are read; null: all"


class SelfTrainingConfig(Section):
    """`self_training`: rounds in which the last round's model labels unlabelled_text and the confident rows join the
    labelled ones for a model trained again from model.checkpoint."""

    rounds: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="rounds after the first training, each a new model on the labelled rows and the rows the "
        "previous round's model labels confidently; 0: off; auto: 2 rounds with unlabelled_text and few labelled "
        "rows per class, else off (finetune/kinds/method.py says the rule)",
    )
    threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the least probability of its top class (calibrated, with calibration: temperature) for a row "
        "to join; null: no floor, each class's most confident rows join up to the round's cap (a fixed floor of 0.9 "
        "let no row of SST-2 join after method contrastive, whose probabilities stay lower: docs/benchmarks.md)",
    )
    per_class: int | None = Field(
        None,
        gt=0,
        description="rows each round adds per predicted class: round r trains on at most r x per_class of each, "
        "the most confident, so no class takes over; null: 4 x the labelled rows of the smallest class",
    )
    min_rows: int = Field(
        1,
        ge=1,
        description="a round trains only when at least this many rows join; fewer, or the very rows the previous "
        "round trained on, end self-training there",
    )
    keep: Literal["best", "last"] = Field(
        "best",
        description="the round whose model is the run's: best, the round with the best dev score (the earliest on a "
        "tie; round 0 is a candidate, so rounds that cost points on dev are not kept); last, the last round's "
        "(best reads dev, and keeps the last round when the dev rows are training rows too)",
    )


def self_training_problem(
    unlabelled_text: list[Path], unlabelled_rows: int | None, section: SelfTrainingConfig, task, distilling: bool
) -> str | None:
    """Why the recipe cannot self-train as it says, or None. Self-training labels unlabelled_text with the classes of
    a single-label classifier; its keys without that text would change nothing, and are refused rather than ignored.
    With a teacher (`distilling`) the teacher labels unlabelled_text, and no round runs."""
    if distilling:
        if section != SelfTrainingConfig(rounds=section.rounds) or section.rounds not in ("auto", 0):
            return "self_training: with distillation the teacher labels unlabelled_text; remove the self_training keys"
        return None
    if unlabelled_text and not task.self_trains:
        owners = ", ".join(kind for kind, kind_section in TASK_SECTIONS.items() if kind_section.self_trains)
        return (
            f"unlabelled_text: self-training labels text with the classes of kind {owners} (one class per row), not "
            f"{task.kind}; remove unlabelled_text"
        )
    if unlabelled_text:
        return None
    if section.rounds != "auto" and section.rounds > 0:
        return (
            f"self_training.rounds: {section.rounds} round(s) label unlabelled_text, which the recipe does not give; "
            "set unlabelled_text (a .txt, .tsv, .csv or .jsonl file) or rounds: 0"
        )
    defaults = SelfTrainingConfig()
    keys = ("threshold", "per_class", "min_rows", "keep")
    changed = [f"self_training.{key}" for key in keys if getattr(section, key) != getattr(defaults, key)]
    changed += ["unlabelled_rows"] if unlabelled_rows is not None else []
    if changed:
        key = changed[0]
        return (
            f"{key} is read with unlabelled_text, which the recipe does not give: give unlabelled_text, or remove {key}"
        )
    return None
