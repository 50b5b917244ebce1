"""Method contrastive for the kinds with classes (SetFit's; training/contrastive.py): the method decided, the encoder
trained on pairs of the training rows, the head started from a logistic regression on their embeddings.

Classification's rows hold a class each (class indices), multilabel's a 0/1 row over the labels: rows pair by a shared
class or label (data/pairs.py), a class counts its rows and a label its positive rows, and the head is one softmax
regression, or one regression per label (one-vs-rest).
"""

from __future__ import annotations

import numpy as np

from finetune.console import console
from finetune.data.pairs import contrastive_pairs, unpaired
from finetune.errors import UserError
from finetune.kinds.labelled_rows import NO_LABEL, class_rows
from finetune.kinds.method import MethodChoice, choose_method, contrastive_problem, contrastive_techniques
from finetune.training.contrastive import (
    embed_rows,
    fit_head_by_logistic_regression,
    fit_head_label_by_label,
    train_encoder_on_pairs,
)
from finetune.training.techniques import sentence_normalizes, sentence_pooling


class PairTraining:
    """The contrastive section's settings with the run's discriminative factor and AdamW's decay and betas."""

    def __init__(self, recipe):
        section, training = recipe.contrastive, recipe.training
        self.lr, self.batch_size, self.loss = section.lr, section.batch_size, section.loss
        self.factor = recipe.discriminative.factor
        self.weight_decay, self.betas = training.weight_decay, training.adam_betas


def decided_method(recipe, spec, labels: np.ndarray | None) -> tuple[object, MethodChoice]:
    """(the recipe the run trains with, the method and why) for a classification or multi-label task's training
    `labels`."""
    counts, problem, per_label = None, None, labels is not None and labels.ndim == 2
    if spec.labels is not None and not spec.is_regression and labels is not None:
        # The training rows of each class (multi-label: of each label), as labels_per_class draws them.
        groups = class_rows(labels, spec.labels)
        counts = {name: len(rows) for name, rows in groups.items() if name != NO_LABEL}
        problem = unpaired(labels) or read_in_chunks(recipe.task)
    sentence_model = sentence_pooling(recipe.model.checkpoint, local_files_only=True) == "mean"
    choice = choose_method(recipe.method, counts, sentence_model, recipe.pooling, problem, per_label)
    if choice.method == "contrastive":
        if counts is None:
            raise UserError(f"method: contrastive is for kinds classification and multilabel, not {spec.kind}")
        problem = contrastive_problem(counts, recipe.pooling, problem, per_label)
        if problem is not None:
            raise UserError(f"method: contrastive: {problem} (or method: plain)")
        recipe = contrastive_techniques(recipe)
    decided = recipe.model_copy(update={"method": choice.method})  # the checkpoint's recipe and card say which
    return decided, choice


def read_in_chunks(task) -> str | None:
    """Why rows read in windows make no pairs: the pairs and the regression read one sequence (one embedding) per
    row; or None."""
    long_documents = getattr(task, "long_documents", None)
    if long_documents is not None and long_documents.mode == "chunks":
        return "task.long_documents reads a row in chunks, and the pairs read one sequence per row (head_tail does)"
    return None


def read_as_the_sentence_model(model, checkpoint: str) -> None:
    """Method contrastive's head reads the embeddings as the checkpoint gives them: normalised where its
    sentence-transformers pipeline ends with a Normalize module (as SetFit's logistic regression reads them)."""
    if hasattr(model, "normalized") and sentence_normalizes(checkpoint, local_files_only=True):
        model.config.normalize = True
        console.print("the head reads the mean divided by its length, as the checkpoint's Normalize module does")


def train_contrastively(
    recipe, model, groups, train_data, collate, labels: np.ndarray, names: tuple[str, ...], device
) -> list[dict]:
    """The pair training of the encoder (every group but the head's), then the head by logistic regression (of the
    classes `names`, or of each label); returns the pair losses' records for metrics.jsonl."""
    pairs = contrastive_pairs(labels, recipe.contrastive.iterations, recipe.seed)
    steps = -(-len(pairs.similar) // recipe.contrastive.batch_size)
    console.print(
        f"contrastive: {len(pairs.similar):,} pairs of the {len(labels):,} training rows "
        f"({int(pairs.similar.sum()):,} similar), {steps:,} steps of {recipe.contrastive.batch_size}, "
        f"loss {recipe.contrastive.loss}, lr {recipe.contrastive.lr:g}",
        markup=False,
        highlight=False,
    )
    records = train_encoder_on_pairs(model, groups[:-1], train_data, collate, pairs, PairTraining(recipe), device)
    embeddings = embed_rows(model, train_data, collate, device)
    console.print(start_head(model.classifier, embeddings, labels, names, recipe.seed), markup=False, highlight=False)
    return records


def start_head(classifier, embeddings: np.ndarray, labels: np.ndarray, names: tuple[str, ...], seed: int) -> str:
    """The head's layer from a logistic regression on the embeddings (multi-label: one per label); says how."""
    if labels.ndim == 1:
        accuracy = fit_head_by_logistic_regression(classifier, embeddings, labels, seed)
        return f"head: logistic regression on the embeddings, training accuracy {accuracy:.4f}"
    accuracy, constant = fit_head_label_by_label(classifier, embeddings, labels, seed)
    rates = "".join(
        f"; label '{names[label]}' is on {'every' if labels[:, label].all() else 'no'} training row: its bias alone"
        for label in constant
    )
    return (
        f"head: a logistic regression per label on the embeddings (one-vs-rest), training subset accuracy "
        f"{accuracy:.4f}{rates}"
    )
