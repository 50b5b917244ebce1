"""The head of method contrastive started from logistic regressions on the embeddings: one per label for multi-label
rows (one-vs-rest), each label's logit the regression's decision function; a label on no row or every row its rate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from finetune.training.contrastive import fit_head_by_logistic_regression, fit_head_label_by_label

ROWS, WIDTH = 24, 6


def embeddings_and_labels() -> tuple[np.ndarray, np.ndarray]:
    """Embeddings, and labels: two that depend on them, one on no row, one on every row."""
    generator = np.random.default_rng(0)
    embeddings = generator.normal(size=(ROWS, WIDTH)).astype(np.float32)
    labels = np.zeros((ROWS, 4), dtype=np.float32)
    labels[:, 0] = embeddings[:, 0] + 0.5 * generator.normal(size=ROWS) > 0
    labels[:, 1] = embeddings[:, 1] - embeddings[:, 2] > 0.3
    labels[:, 3] = 1.0
    return embeddings, labels


def test_each_labels_logit_is_its_one_vs_rest_regressions_decision_function():
    embeddings, labels = embeddings_and_labels()
    head = torch.nn.Linear(WIDTH, 4)
    accuracy, constant = fit_head_label_by_label(head, embeddings, labels, seed=3)
    with torch.no_grad():
        logits = head(torch.from_numpy(embeddings)).double().numpy()
    fitted = labels[:, :2]  # scikit-learn's one-vs-rest over the labels that have a regression
    one_vs_rest = OneVsRestClassifier(LogisticRegression(max_iter=1000, random_state=3)).fit(embeddings, fitted)
    np.testing.assert_allclose(logits[:, :2], one_vs_rest.decision_function(embeddings), rtol=1e-5, atol=1e-5)
    for label in range(2):
        alone = LogisticRegression(max_iter=1000, random_state=3).fit(embeddings, labels[:, label])
        np.testing.assert_allclose(logits[:, label], alone.decision_function(embeddings), rtol=1e-5, atol=1e-5)
        probabilities = torch.sigmoid(torch.from_numpy(logits[:, label])).numpy()
        np.testing.assert_allclose(probabilities, alone.predict_proba(embeddings)[:, 1], atol=1e-5)
    # No row, every row: the bias alone, the log-odds of (positives + 1/2) / (rows + 1).
    assert constant == [2, 3]
    assert torch.equal(head.weight[2:], torch.zeros(2, WIDTH))
    assert head.bias[2].item() == pytest.approx(np.log(0.5 / (ROWS + 0.5)))
    assert head.bias[3].item() == pytest.approx(np.log((ROWS + 0.5) / 0.5))
    decided = np.concatenate([one_vs_rest.predict(embeddings), np.zeros((ROWS, 1)), np.ones((ROWS, 1))], axis=1)
    assert accuracy == pytest.approx(float((decided == labels).all(axis=1).mean()))


def test_the_same_rows_and_seed_give_the_same_head():
    embeddings, labels = embeddings_and_labels()
    heads = [torch.nn.Linear(WIDTH, 4) for _ in range(2)]
    for head in heads:
        fit_head_label_by_label(head, embeddings, labels, seed=0)
    assert torch.equal(heads[0].weight, heads[1].weight) and torch.equal(heads[0].bias, heads[1].bias)


def test_under_a_lora_adapter_the_heads_trained_copy_gets_the_regressions():
    from peft.utils.other import ModulesToSaveWrapper

    embeddings, labels = embeddings_and_labels()
    plain, wrapped = torch.nn.Linear(WIDTH, 4), ModulesToSaveWrapper(torch.nn.Linear(WIDTH, 4), "default")
    original = wrapped.original_module.weight.clone()
    for head in (plain, wrapped):
        fit_head_label_by_label(head, embeddings, labels, seed=0)
    with torch.no_grad():
        assert torch.equal(wrapped(torch.from_numpy(embeddings)), plain(torch.from_numpy(embeddings)))
    assert torch.equal(wrapped.original_module.weight, original)  # the frozen original stays as it was


@pytest.mark.parametrize("classes", [2, 3])
def test_a_head_on_another_device_than_the_cpu_gets_the_regressions(classes):
    """On a GPU the head's weights were indexed by the regression's CPU class indices: "Expected all tensors to be on
    the same device" (3 classes and more; multi-label too). The meta device stands in for a GPU here: another device
    than scikit-learn's arrays, and the same error before the fix."""
    embeddings, labels = embeddings_and_labels()
    classes_of_rows = (np.arange(ROWS) % classes).astype(np.int64)
    fit_head_by_logistic_regression(torch.nn.Linear(WIDTH, classes, device="meta"), embeddings, classes_of_rows, 0)
    fit_head_label_by_label(torch.nn.Linear(WIDTH, 4, device="meta"), embeddings, labels, seed=0)
