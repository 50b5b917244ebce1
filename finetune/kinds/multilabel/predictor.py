"""A fine-tuned multi-label classifier ready to predict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from finetune.kinds.classification.predictor import Predictor
from finetune.kinds.multilabel.model import DEFAULT_THRESHOLD
from finetune.kinds.multilabel.training import label_probabilities, label_sets


@dataclass
class MultilabelPredictor(Predictor):
    """A fine-tuned multi-label classifier ready to predict: the labels above its saved threshold, and every label's
    probability (a sigmoid each)."""

    threshold: float = DEFAULT_THRESHOLD

    def results(self, logits: np.ndarray) -> list[dict]:
        """One result per example: {"labels": [...], "probabilities": {label: probability}}."""
        probabilities = label_probabilities(logits)
        labels = self.spec.labels
        assert labels is not None  # a multi-label task's spec always has its label set (kinds/multilabel/recipe.py)
        return [
            {"labels": predicted, "probabilities": {label: float(p) for label, p in zip(labels, row)}}
            for predicted, row in zip(label_sets(probabilities, labels, self.threshold), probabilities)
        ]
