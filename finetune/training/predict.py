"""Batched prediction over a task split, gathered across processes without duplicated tail samples."""

from __future__ import annotations

import numpy as np
import torch

from finetune.glue.specs import TaskSpec


@torch.no_grad()
def predict_logits(accelerator, model, loader) -> np.ndarray:
    """The model's logits for every example of a prepared loader, in the loader's order."""
    model.eval()
    outputs = []
    for batch in loader:
        batch = {key: value for key, value in batch.items() if key != "labels"}
        logits = model(**batch).logits
        # gather_for_metrics drops the samples a distributed sampler repeats to even out the last batch.
        outputs.append(accelerator.gather_for_metrics(logits.float()).cpu())
    return torch.cat(outputs).numpy()


def logits_to_predictions(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """Class indices (argmax) for classification, the single output for regression."""
    return logits[:, 0] if spec.is_regression else logits.argmax(axis=-1)
