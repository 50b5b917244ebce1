"""Multi-label fine-tuning: the classifier's data, model and machinery with a sigmoid per label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from finetune.kinds.classification.fine_tuning import ClassificationFineTuning, say
from finetune.kinds.multilabel.metrics import best_threshold, label_table, multilabel_metrics
from finetune.kinds.multilabel.model import DEFAULT_THRESHOLD, THRESHOLD_KEY
from finetune.kinds.multilabel.training import binary_cross_entropy, label_probabilities
from finetune.reporting.class_report import classes_of
from finetune.reporting.dev_predictions import label_set_rows
from finetune.training.imbalance import Loss, binary_cross_entropy_loss, described_weights, pos_weight_vector


class MultilabelFineTuning(ClassificationFineTuning):
    """`finetune finetune` for a task of kind multilabel: the classifier's data, model and machinery with a sigmoid
    per label and binary cross-entropy (the head's problem_type), scored by micro F1 at a decision threshold that
    is given (task.threshold) or chosen on dev at each evaluation, and saved with the checkpoint.

    The loss is transformers' BCEWithLogitsLoss, the mean over example x label terms, and a batch counts its
    examples as its loss terms: every example has the same number of labels, so weighing by examples weighs every
    example x label term alike (accumulated steps and processes included).
    """

    plain_loss = staticmethod(binary_cross_entropy)  # the head's own (chunks: of each document's pooled logits)

    def loss_of_the_recipe(self) -> Loss | None:
        """The binary cross-entropy with training.pos_weight (balanced: from the training labels); None when not
        set."""
        setting, spec, rows = self.recipe.training.pos_weight, self.spec, self.train_examples.labels
        if setting is None:
            return None
        assert spec.labels is not None and rows is not None  # a multi-label task has its label set
        weights = pos_weight_vector(setting, spec.labels, rows, spec.file_labels)
        say(f"weights of each label's positives in its binary cross-entropy: {described_weights(spec.labels, weights)}")
        return binary_cross_entropy_loss(weights)

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Dev scores at the threshold (the one chosen on dev, with threshold: dev) and the threshold itself, as
        dev_threshold: the best evaluation's travels with the best-so-far record (and through a resume) to the
        checkpoint and result.json. The dev loss goes to metrics.jsonl only."""
        logits = self.dev_logits()
        references, probabilities = self.dev_labels(), label_probabilities(logits)
        threshold = self.recipe.task.threshold or DEFAULT_THRESHOLD
        if threshold == "dev":
            threshold = best_threshold(references, probabilities)
        scores = multilabel_metrics(references, probabilities > threshold)
        assert self.spec.labels is not None  # a multi-label task lists its labels (or label_columns)
        table = label_table(references, probabilities > threshold, self.spec.labels)
        self.last_classes = classes_of(table, "examples")
        chosen = probabilities > threshold
        self.last_predictions = label_set_rows(self.dev_keys, self.spec.labels, references, chosen, probabilities)
        loss = binary_cross_entropy(torch.from_numpy(logits), torch.from_numpy(references)).item()
        return (
            {f"dev_{name}": scores[name] for name in self.spec.metrics} | {"dev_threshold": float(threshold)},
            {"validation_loss": loss},
        )

    def teacher_scores(self, logits: np.ndarray, teacher) -> dict[str, float]:
        """The teacher's scores at the decision threshold it was saved with (task.threshold: dev, its own dev's)."""
        threshold = getattr(teacher.predictor.model.config, THRESHOLD_KEY, None) or DEFAULT_THRESHOLD
        scores = multilabel_metrics(self.dev_labels(), label_probabilities(logits) > threshold)
        return {f"dev_{name}": scores[name] for name in self.spec.metrics}

    def _save(self, directory: Path) -> None:
        """The weights with the threshold of the evaluation they come from (the newest: a new best, or the last)."""
        config = self.accelerator.unwrap_model(self.model).config
        setattr(config, THRESHOLD_KEY, self.best.last["dev_threshold"])
        super()._save(directory)
