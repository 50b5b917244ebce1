"""training/imbalance.py: class weights (balanced: scikit-learn's), positive weights, label smoothing, and the
weighted loss put in place of a model's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.utils.class_weight import compute_class_weight

from finetune.errors import UserError
from finetune.training.imbalance import (
    binary_cross_entropy_loss,
    class_weight_vector,
    cross_entropy_loss,
    in_place_of,
    pos_weight_vector,
)
from finetune.training.techniques import loss_techniques

NAMES = ("neg", "neutral", "pos")
LABELS = np.array([0] * 12 + [1] * 3 + [2] * 1)


def test_balanced_class_weights_are_scikit_learns():
    weights = class_weight_vector("balanced", NAMES, LABELS)
    expected = compute_class_weight("balanced", classes=np.arange(3), y=LABELS)
    np.testing.assert_allclose(weights, expected)
    assert weights[2] == pytest.approx(16 / (3 * 1)) and weights[0] == pytest.approx(16 / (3 * 12))


def test_named_class_weights_by_label_or_its_name_the_others_one():
    weights = class_weight_vector({"pos": 4.0, "1": 2.0}, NAMES, LABELS, file_labels=("0", "1", "2"))
    np.testing.assert_allclose(weights, [1.0, 2.0, 4.0])


def test_an_unknown_label_and_a_class_without_examples_are_one_line_errors():
    with pytest.raises(UserError, match=r"training.class_weights: unknown label 'positive' \(labels: neg, neutral"):
        class_weight_vector({"positive": 2.0}, NAMES, LABELS)
    with pytest.raises(UserError, match="label 'pos' has none"):
        class_weight_vector("balanced", NAMES, np.array([0, 1, 1]))


def test_the_weighted_loss_is_torchs_weighted_cross_entropy_on_the_same_logits():
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 3), torch.tensor([0, 0, 0, 1, 2, 2])
    weights = class_weight_vector("balanced", NAMES, LABELS)
    loss = cross_entropy_loss(weights, 0.0)
    assert loss is not None
    expected = torch.nn.functional.cross_entropy(logits, labels, weight=torch.tensor(weights, dtype=torch.float32))
    torch.testing.assert_close(loss(logits, labels), expected)
    plain = torch.nn.functional.cross_entropy(logits, labels)
    assert not torch.isclose(loss(logits, labels), plain)  # the weights change the loss
    # by hand: the weighted mean of the examples' losses
    each = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    example_weights = torch.tensor(weights, dtype=torch.float32)[labels]
    torch.testing.assert_close(loss(logits, labels), (each * example_weights).sum() / example_weights.sum())


def test_label_smoothing_is_torchs_and_nothing_set_is_none():
    logits, labels = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    smoothed = cross_entropy_loss(None, 0.1)
    assert smoothed is not None
    torch.testing.assert_close(
        smoothed(logits, labels), torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    )
    assert smoothed(logits, labels) != torch.nn.functional.cross_entropy(logits, labels)
    assert cross_entropy_loss(None, 0.0) is None


def test_balanced_positive_weights_are_negatives_over_positives_per_label():
    rows = np.array([[1, 0], [0, 0], [0, 1], [0, 1], [1, 1]], dtype=np.float32)
    weights = pos_weight_vector("balanced", ("a", "b"), rows)
    np.testing.assert_allclose(weights, [3 / 2, 2 / 3])
    loss = binary_cross_entropy_loss(weights)
    assert loss is not None
    logits = torch.randn(5, 2)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, torch.from_numpy(rows), pos_weight=torch.tensor([1.5, 2 / 3])
    )
    torch.testing.assert_close(loss(logits, torch.from_numpy(rows)), expected)
    with pytest.raises(UserError, match="label 'b' has no positive"):
        pos_weight_vector("balanced", ("a", "b"), rows[:2])


def test_in_place_of_keeps_the_models_extra_gradient_and_the_weighted_value():
    """An AWD-LSTM adds AR/TAR to its loss's gradient only: that gradient stays, the value is the weighted loss."""
    logits = torch.randn(4, 2, requires_grad=True)
    extra = torch.tensor(2.0, requires_grad=True)
    labels = torch.tensor([0, 1, 1, 0])
    plain = torch.nn.functional.cross_entropy(logits, labels)
    model_loss = plain + (extra**2 - (extra**2).detach())  # the value of plain, the gradient of plain + extra**2
    weighted = torch.nn.functional.cross_entropy(logits, labels, weight=torch.tensor([1.0, 3.0]))
    loss = in_place_of(model_loss, plain, weighted)
    assert loss.item() == pytest.approx(weighted.item())
    loss.backward()
    assert extra.grad is not None and extra.grad.item() == pytest.approx(4.0)
    expected = torch.autograd.grad(
        torch.nn.functional.cross_entropy(logits, labels, weight=torch.tensor([1.0, 3.0])), logits
    )[0]
    torch.testing.assert_close(logits.grad, expected)


def test_the_techniques_block_names_the_loss_keys_set():
    class Training:
        class_weights = "balanced"
        pos_weight = None
        label_smoothing = 0.1

    assert loss_techniques(Training()) == [
        ("training.class_weights", "class weights: balanced"),
        ("training.label_smoothing", "label smoothing 0.1"),
    ]
