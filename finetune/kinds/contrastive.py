"""Method contrastive for a classifier (SetFit's; training/contrastive.py): the method decided, the encoder trained
on pairs of the training rows, the head started from a logistic regression on their embeddings."""

from __future__ import annotations

import numpy as np

from finetune.console import console
from finetune.data.pairs import contrastive_pairs
from finetune.errors import UserError
from finetune.kinds.labelled_rows import class_rows
from finetune.kinds.method import MethodChoice, choose_method, contrastive_problem, contrastive_techniques
from finetune.training.contrastive import embed_rows, fit_head_by_logistic_regression, train_encoder_on_pairs
from finetune.training.techniques import sentence_normalizes, sentence_pooling


class PairTraining:
    """The contrastive section's settings with the run's discriminative factor and AdamW's decay and betas."""

    def __init__(self, recipe):
        section, training = recipe.contrastive, recipe.training
        self.lr, self.batch_size, self.loss = section.lr, section.batch_size, section.loss
        self.factor = recipe.discriminative.factor
        self.weight_decay, self.betas = training.weight_decay, training.adam_betas


def decided_method(recipe, spec, labels: np.ndarray | None) -> tuple[object, MethodChoice]:
    """(the recipe the run trains with, the method and why) for a classification task's training `labels`."""
    # One class per row: multi-label pairs and heads are not built yet (their rows share some labels, not all).
    takes_pairs = spec.labels is not None and not spec.is_regression and labels is not None and labels.ndim == 1
    counts = None
    if takes_pairs and labels is not None:  # the training rows of each class, as labels_per_class draws them
        counts = {name: len(rows) for name, rows in class_rows(labels, spec.labels).items()}
    sentence_model = sentence_pooling(recipe.model.checkpoint, local_files_only=True) == "mean"
    choice = choose_method(recipe.method, counts, sentence_model, recipe.pooling)
    if choice.method == "contrastive":
        if counts is None:
            raise UserError(f"method: contrastive is for kind classification, not {spec.kind}")
        problem = contrastive_problem(counts, recipe.pooling)
        if problem is not None:
            raise UserError(f"method: contrastive: {problem} (or method: plain)")
        recipe = contrastive_techniques(recipe)
    decided = recipe.model_copy(update={"method": choice.method})  # the checkpoint's recipe and card say which
    return decided, choice


def read_as_the_sentence_model(model, checkpoint: str) -> None:
    """Method contrastive's head reads the embeddings as the checkpoint gives them: normalised where its
    sentence-transformers pipeline ends with a Normalize module (as SetFit's logistic regression reads them)."""
    if hasattr(model, "normalized") and sentence_normalizes(checkpoint, local_files_only=True):
        model.config.normalize = True
        console.print("the head reads the mean divided by its length, as the checkpoint's Normalize module does")


def train_contrastively(recipe, model, groups, train_data, collate, labels: np.ndarray, device) -> list[dict]:
    """The pair training of the encoder (every group but the head's), then the head by logistic regression;
    returns the pair losses' records for metrics.jsonl."""
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
    accuracy = fit_head_by_logistic_regression(model.classifier, embeddings, labels, recipe.seed)
    console.print(f"head: logistic regression on the embeddings, training accuracy {accuracy:.4f}", markup=False)
    return records
