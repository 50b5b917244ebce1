"""The metrics of any number of classes (f1_macro, f1_weighted, ...) and the per-class report: scikit-learn's
figures on known predictions."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

from finetune.tasks.metrics import METRICS, class_report

LABELS = ("a", "b", "c", "d")
# Class d is never predicted (a collapsed minority class); class c is over-predicted.
REFERENCES = np.array([0, 0, 0, 1, 1, 2, 2, 3, 3, 0])
PREDICTIONS = np.array([0, 0, 2, 1, 2, 2, 2, 2, 2, 0])


def test_averaged_f1_of_four_classes_is_sklearns():
    assert METRICS["f1_macro"](PREDICTIONS, REFERENCES) == pytest.approx(
        f1_score(REFERENCES, PREDICTIONS, average="macro", zero_division=0)
    )
    assert METRICS["f1_weighted"](PREDICTIONS, REFERENCES) == pytest.approx(
        f1_score(REFERENCES, PREDICTIONS, average="weighted", zero_division=0)
    )
    # accuracy 0.6 hides class d; macro F1 does not: (0.857 + 0.667 + 0.5 + 0) / 4
    assert METRICS["accuracy"](PREDICTIONS, REFERENCES) == pytest.approx(0.6)
    assert METRICS["f1_macro"](PREDICTIONS, REFERENCES) == pytest.approx((6 / 7 + 2 / 3 + 0.5 + 0) / 4)
    assert 0 <= METRICS["precision_macro"](PREDICTIONS, REFERENCES) <= 1
    assert 0 <= METRICS["recall_macro"](PREDICTIONS, REFERENCES) <= 1


def test_class_report_is_sklearns_per_class_figures_and_confusion_matrix():
    report = class_report(LABELS, PREDICTIONS, REFERENCES)
    precision, recall, f1, support = precision_recall_fscore_support(
        REFERENCES, PREDICTIONS, labels=[0, 1, 2, 3], zero_division=0
    )
    assert report["labels"] == list(LABELS)
    for index, label in enumerate(LABELS):
        row = report["per_class"][label]
        assert row == {
            "precision": pytest.approx(precision[index]),
            "recall": pytest.approx(recall[index]),
            "f1": pytest.approx(f1[index]),
            "support": int(support[index]),
        }
    assert report["per_class"]["d"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert report["confusion_matrix"] == confusion_matrix(REFERENCES, PREDICTIONS, labels=[0, 1, 2, 3]).tolist()
    assert report["confusion_matrix"][3] == [0, 0, 2, 0]  # both d examples predicted as c


def test_a_class_absent_from_the_split_still_has_its_row():
    report = class_report(("x", "y", "z"), np.array([0, 1]), np.array([0, 1]))
    assert report["per_class"]["z"]["support"] == 0
    assert report["confusion_matrix"] == [[1, 0, 0], [0, 1, 0], [0, 0, 0]]
