"""Self-training's choice of rows: the threshold, at most `cap` per predicted class (the most confident first), never
a labelled or dev text nor a text twice, the same rows for the same probabilities; and the record a round keeps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from finetune.data.examples import TaskExamples
from finetune.errors import UserError
from finetune.training.self_training import PSEUDO_LABELLED_FILE, pseudo_labelled, select_confident, text_key

NAMES = ("negative", "positive")


def rows(*texts: str) -> list[tuple[str, ...]]:
    return [text_key((text,)) for text in texts]


def test_rows_below_the_threshold_stay_out():
    probabilities = np.array([[0.95, 0.05], [0.6, 0.4], [0.1, 0.9], [0.5, 0.5]])
    chosen = select_confident(probabilities, rows("a", "b", "c", "d"), set(), 0.9, 10, NAMES)
    assert chosen.rows.tolist() == [0, 2] and chosen.labels.tolist() == [0, 1]
    assert chosen.confidence.tolist() == pytest.approx([0.95, 0.9])
    assert chosen.confident == {"negative": 1, "positive": 1} and chosen.added == {"negative": 1, "positive": 1}


def test_each_class_takes_at_most_cap_rows_the_most_confident_first():
    # Eight rows the model calls negative, two positive: the cap keeps the negative class from taking over.
    negative = [[0.91 + index / 100, 0.09 - index / 100] for index in range(8)]
    probabilities = np.array([*negative, [0.05, 0.95], [0.02, 0.98]])
    keys = rows(*(f"text {index}" for index in range(10)))
    chosen = select_confident(probabilities, keys, set(), 0.9, 3, NAMES)
    assert chosen.confident == {"negative": 8, "positive": 2} and chosen.added == {"negative": 3, "positive": 2}
    assert chosen.rows.tolist() == [5, 6, 7, 8, 9]  # the three most confident negatives, in the text's order


def test_labelled_and_dev_texts_and_repeats_never_join():
    probabilities = np.full((5, 2), [0.99, 0.01])
    keys = rows("a labelled text", " a dev text ", "new", "new", "other")
    chosen = select_confident(probabilities, keys, {("a labelled text",), ("a dev text",)}, 0.9, 10, NAMES)
    assert chosen.rows.tolist() == [2, 4]  # surrounding spaces compare equal; "new" once, as its first row


def test_the_same_probabilities_choose_the_same_rows_ties_by_the_texts_order():
    probabilities = np.full((6, 2), [0.97, 0.03])
    keys = rows(*"abcdef")
    first = select_confident(probabilities, keys, set(), 0.9, 4, NAMES)
    again = select_confident(probabilities.copy(), list(keys), set(), 0.9, 4, NAMES)
    assert first.rows.tolist() == again.rows.tolist() == [0, 1, 2, 3]
    assert first.labels.tolist() == again.labels.tolist() and first.added == again.added


def test_a_round_keeps_its_rows_and_a_resume_must_choose_them_again(tmp_path):
    unlabelled = TaskExamples([("good film",), ("bad film",), ("dull",)], None, ["0", "1", "2"])
    probabilities = np.array([[0.1, 0.9], [0.95, 0.05], [0.5, 0.5]])
    chosen = select_confident(probabilities, rows("good film", "bad film", "dull"), set(), 0.9, 5, NAMES)
    record = {"phase": "self_training", "round": 1}
    joined = pseudo_labelled(chosen, unlabelled, lambda texts: (f"review: {texts[0]}",), record)
    assert joined.texts == [("review: good film",), ("review: bad film",)] and joined.record == record
    labelled = TaskExamples([("labelled",)], np.array([1]), ["7"])
    together = joined.joined(labelled)
    assert list(together.texts) == [("labelled",), ("review: good film",), ("review: bad film",)]
    assert together.labels.tolist() == [1, 1, 0] and together.labels.dtype == labelled.labels.dtype

    joined.write(tmp_path, ("sentence",), NAMES)
    written = [json.loads(line) for line in (tmp_path / PSEUDO_LABELLED_FILE).read_text().splitlines()]
    assert written == [
        {"sentence": "good film", "label": "positive", "probability": 0.9},
        {"sentence": "bad film", "label": "negative", "probability": 0.95},
    ]
    joined.check_recorded(tmp_path, ("sentence",), NAMES)  # the same rows: fine
    assert joined.recorded_in(tmp_path, ("sentence",), NAMES) and joined.recorded_in(tmp_path / "x", (), ()) is None
    other = select_confident(probabilities, rows("good film", "bad film", "dull"), set(), 0.92, 5, NAMES)
    with pytest.raises(UserError, match=r"now labels other rows than .*pseudo_labelled\.jsonl"):
        pseudo_labelled(other, unlabelled, tuple, record).check_recorded(tmp_path, ("sentence",), NAMES)


def test_without_a_threshold_each_class_takes_its_most_confident_rows_however_low():
    # Probabilities as a contrastive head gives them: none near 0.9, yet the ranking says which rows to trust.
    probabilities = np.array([[0.62, 0.38], [0.55, 0.45], [0.30, 0.70], [0.45, 0.55], [0.58, 0.42]])
    chosen = select_confident(probabilities, rows("a", "b", "c", "d", "e"), set(), None, 2, NAMES)
    assert chosen.rows.tolist() == [0, 2, 3, 4]  # negative: a (0.62), e (0.58); positive: c (0.70), d (0.55)
    assert chosen.added == {"negative": 2, "positive": 2}
    assert chosen.confident == {"negative": 3, "positive": 2}  # every row left in is eligible
    assert select_confident(probabilities, rows("a", "b", "c", "d", "e"), set(), 0.9, 2, NAMES).rows.tolist() == []
