"""Uneven classes: the weights of training.class_weights (classification) and training.pos_weight (multilabel),
and the losses that use them with training.label_smoothing.

`balanced` class weights are scikit-learn's compute_class_weight on the training labels; balanced positive weights
are each label's negatives / positives, what BCEWithLogitsLoss's pos_weight documents. A mapping names labels as
the files write them or by their label_names; the labels it leaves out weigh 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from finetune.errors import UserError

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, labels) -> the batch's mean loss


def _named_weights(
    key: str, weights: Mapping[str, float], names: Sequence[str], file_labels: Sequence[str] | None
) -> np.ndarray:
    """A weight per label from {label or its name: weight}; the others 1."""
    vector = np.ones(len(names), dtype=np.float64)
    for label, weight in weights.items():
        if label in names:
            vector[list(names).index(label)] = weight
        elif file_labels is not None and label in file_labels:
            vector[list(file_labels).index(label)] = weight
        else:
            raise UserError(f"training.{key}: unknown label '{label}' (labels: {', '.join(names)})")
    return vector


def class_weight_vector(
    setting: str | Mapping[str, float],
    names: Sequence[str],
    labels: np.ndarray,
    file_labels: Sequence[str] | None = None,
) -> np.ndarray:
    """The weight of each class in the cross-entropy (training.class_weights), from the training labels (class
    indices) when balanced."""
    if setting != "balanced":
        assert not isinstance(setting, str)
        return _named_weights("class_weights", setting, names, file_labels)
    from sklearn.utils.class_weight import compute_class_weight

    counts = np.bincount(labels, minlength=len(names))
    absent = [name for name, count in zip(names, counts) if count == 0]
    if absent:
        raise UserError(
            f"training.class_weights: balanced weighs the classes by their training examples, and label "
            f"'{absent[0]}' has none; give the weights as {{label: weight}}"
        )
    return np.asarray(compute_class_weight("balanced", classes=np.arange(len(names)), y=labels), dtype=np.float64)


def pos_weight_vector(
    setting: str | Mapping[str, float], names: Sequence[str], rows: np.ndarray, file_labels: Sequence[str] | None = None
) -> np.ndarray:
    """The weight of each label's positives in its binary cross-entropy (training.pos_weight), from the training
    label rows (examples x labels of 0/1) when balanced."""
    if setting != "balanced":
        assert not isinstance(setting, str)
        return _named_weights("pos_weight", setting, names, file_labels)
    positives = np.asarray(rows, dtype=np.float64).sum(axis=0)
    absent = [name for name, count in zip(names, positives) if count == 0]
    if absent:
        raise UserError(
            f"training.pos_weight: balanced divides each label's negatives by its positives, and label "
            f"'{absent[0]}' has no positive training example; give the weights as {{label: weight}}"
        )
    return (len(rows) - positives) / positives


def described_weights(names: Sequence[str], weights: np.ndarray) -> str:
    """`name weight, ...` for the run's log."""
    return ", ".join(f"{name} {weight:.3g}" for name, weight in zip(names, weights))


def cross_entropy_loss(weights: np.ndarray | None, smoothing: float) -> Loss | None:
    """torch's cross-entropy with class weights and label smoothing; None when neither is set (the model's own
    loss is then the loss)."""
    if weights is None and not smoothing:
        return None
    table = None if weights is None else torch.as_tensor(weights)

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        weight = None if table is None else table.to(device=logits.device, dtype=logits.dtype)
        return torch.nn.functional.cross_entropy(logits, labels, weight=weight, label_smoothing=smoothing)

    return loss


def binary_cross_entropy_loss(pos_weight: np.ndarray | None) -> Loss | None:
    """The mean binary cross-entropy over examples x labels with each label's positives weighed (pos_weight); None
    when not set."""
    if pos_weight is None:
        return None
    table = torch.as_tensor(pos_weight)

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        weight = table.to(device=logits.device, dtype=logits.dtype)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), pos_weight=weight)

    return loss


def in_place_of(model_loss: torch.Tensor, plain: torch.Tensor, weighted: torch.Tensor) -> torch.Tensor:
    """The weighted loss in place of the model's plain one, keeping what else the model's loss back-propagates (an
    AWD-LSTM's AR/TAR, added to its gradient only): the value is `weighted`'s, the gradient `weighted`'s plus the
    model loss's beyond `plain`."""
    return weighted + (model_loss - model_loss.detach()) - (plain - plain.detach())
