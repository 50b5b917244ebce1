"""A fine-tuned regressor ready to predict: a score per example."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from finetune.kinds.classification.predictor import Predictor


@dataclass
class RegressionPredictor(Predictor):
    """The classifier's reading and batching; its one output is the score."""

    def results(self, logits: np.ndarray) -> list[dict]:
        """One result per example: {"score"}."""
        return [{"score": float(value)} for value in logits[:, 0]]
