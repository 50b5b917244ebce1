"""Batched prediction over a task split, gathered across processes without duplicated tail samples."""

from __future__ import annotations

import numpy as np
import torch

from finetune.console import phase_bar
from finetune.glue.specs import TaskSpec


@torch.no_grad()
def predict_logits(accelerator, model, loader) -> np.ndarray:
    """The model's logits for every example of a prepared loader, in the loader's order."""
    model.eval()
    outputs = []
    with phase_bar("evaluating", len(loader), accelerator.is_main_process) as advance:
        for batch in loader:
            batch = {key: value for key, value in batch.items() if key != "labels"}
            logits = model(**batch).logits
            # gather_for_metrics drops the samples a distributed sampler repeats to even out the last batch.
            outputs.append(accelerator.gather_for_metrics(logits.float()).cpu())
            advance()
    return torch.cat(outputs).numpy()


def logits_to_predictions(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """Class indices (argmax) for classification, the single output for regression."""
    return logits[:, 0] if spec.is_regression else logits.argmax(axis=-1)


def logits_loss(spec: TaskSpec, logits: np.ndarray, labels: np.ndarray) -> float:
    """The mean of the loss the model trains on: cross-entropy, or squared error for regression."""
    outputs = torch.from_numpy(logits)
    if spec.is_regression:
        return torch.nn.functional.mse_loss(outputs[:, 0], torch.as_tensor(labels, dtype=torch.float32)).item()
    return torch.nn.functional.cross_entropy(outputs, torch.as_tensor(labels, dtype=torch.int64)).item()
