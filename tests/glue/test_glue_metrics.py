"""GLUE metrics against hand-computed values; reading GLUE-layout TSV files, and their errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from finetune.data.task_files import read_task_split
from finetune.errors import UserError
from finetune.glue.metrics import compute_metrics
from finetune.glue.specs import GLUE_TASKS, TaskSpec, task_spec
from finetune.recipes import task_config


def spec_with(metrics, labels=("0", "1")) -> TaskSpec:
    return TaskSpec("custom", ("sentence",), "label", labels, tuple(metrics))


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def test_accuracy_f1_mcc_by_hand():
    references = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    predictions = np.array([1, 1, 0, 0, 1, 0, 1, 0])
    # tp=3 fn=1 fp=1 tn=3
    tp, fn, fp, tn = 3, 1, 1, 3
    scores = compute_metrics(spec_with(["accuracy", "f1", "mcc"]), predictions, references)
    assert scores["accuracy"] == pytest.approx(6 / 8)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert scores["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert scores["mcc"] == pytest.approx(mcc)
    assert list(scores) == ["accuracy", "f1", "mcc"]


def test_f1_is_of_class_one():
    references = np.array([0, 0, 0, 1])
    predictions = np.array([0, 0, 0, 0])  # all of class 0: accuracy 0.75, F1 of class 1 is 0
    scores = compute_metrics(spec_with(["accuracy", "f1"]), predictions, references)
    assert scores == {"accuracy": 0.75, "f1": 0.0}
    # F1 of class 1 when class 1 is predicted well and class 0 badly.
    references = np.array([1, 1, 1, 0, 0])
    predictions = np.array([1, 1, 1, 1, 1])  # precision 3/5, recall 1 -> F1 = 0.75
    assert compute_metrics(spec_with(["f1"]), predictions, references)["f1"] == pytest.approx(0.75)


def test_mcc_extremes():
    references = np.array([0, 1, 0, 1, 1, 0])
    spec = spec_with(["mcc"])
    assert compute_metrics(spec, references, references)["mcc"] == pytest.approx(1.0)
    assert compute_metrics(spec, 1 - references, references)["mcc"] == pytest.approx(-1.0)
    assert compute_metrics(spec, np.ones(6, dtype=int), references)["mcc"] == 0.0


def test_correlations_by_hand():
    spec = spec_with(["pearson", "spearman"], labels=None)
    references = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    predictions = np.array([0.5, 1.0, 2.5, 2.0, 5.0])
    x, y = predictions - predictions.mean(), references - references.mean()
    pearson = (x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum())
    # ranks of predictions: 1 2 4 3 5; of references: 1 2 3 4 5; d^2 sum = 2
    spearman = 1 - 6 * 2 / (5 * (25 - 1))
    scores = compute_metrics(spec, predictions, references)
    assert scores["pearson"] == pytest.approx(pearson)
    assert scores["spearman"] == pytest.approx(spearman)


def test_monotone_but_nonlinear_prediction():
    spec = spec_with(["pearson", "spearman"], labels=None)
    references = np.arange(6, dtype=float)
    scores = compute_metrics(spec, references**3, references)
    assert scores["spearman"] == pytest.approx(1.0)
    assert scores["pearson"] < 0.99


def test_constant_predictions_give_zero_correlation():
    spec = spec_with(["pearson", "spearman"], labels=None)
    scores = compute_metrics(spec, np.full(5, 2.5), np.array([0.0, 1.0, 2.0, 3.0, 4.0]))
    assert scores == {"pearson": 0.0, "spearman": 0.0}
    assert not any(math.isnan(value) for value in scores.values())


def test_glue_specs_choose_their_metrics():
    assert GLUE_TASKS["cola"].metrics[0] == "mcc"
    assert GLUE_TASKS["mrpc"].main_metric == "f1"
    assert GLUE_TASKS["stsb"].is_regression and GLUE_TASKS["stsb"].num_labels == 1
    assert GLUE_TASKS["mnli"].num_labels == 3


def test_task_spec_for_custom_tasks(tmp_path):
    config = task_config(name="mine", data_dir=tmp_path, text_columns=["a", "b"], label_column="y", labels=["x", "z"])
    spec = task_spec(config)
    assert (spec.text_columns, spec.label_column, spec.labels, spec.metrics) == (
        ("a", "b"),
        "y",
        ("x", "z"),
        ("accuracy",),
    )
    regression = task_spec(task_config(name="score", data_dir=tmp_path, text_columns=["a"], label_column="s"))
    assert regression.is_regression and regression.metrics == ("pearson", "spearman")
    assert task_spec(task_config(name="sst2", data_dir=tmp_path)) is GLUE_TASKS["sst2"]


# ---------------------------------------------------------------------------------------------
# Reading task files
# ---------------------------------------------------------------------------------------------


def write(folder: Path, name: str, text: str, encoding: str = "utf-8") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(text.encode(encoding))
    return path


def test_read_generated_task(task_dir):
    spec = spec_with(["accuracy"])
    train = read_task_split(spec, task_dir, "train")
    assert len(train.texts) == 40 and train.labels.dtype == np.int64
    assert train.labels.tolist() == [1, 0] * 20
    assert all(len(text) == 1 and text[0].endswith(" .") for text in train.texts)
    assert train.ids[:3] == ["0", "1", "2"]


def test_read_header_and_label_indices(tmp_path):
    write(tmp_path, "dev.tsv", "sentence\tlabel\ngood film\t1\nbad film\t0\nfine\t1\n")
    examples = read_task_split(GLUE_TASKS["sst2"], tmp_path, "dev")
    assert examples.texts == [("good film",), ("bad film",), ("fine",)]
    assert examples.labels.tolist() == [1, 0, 1]


def test_label_strings_map_to_their_index(tmp_path):
    write(tmp_path, "train.tsv", "index\tquestion\tsentence\tlabel\n0\tq1\ts1\tnot_entailment\n1\tq2\ts2\tentailment\n")
    examples = read_task_split(GLUE_TASKS["qnli"], tmp_path, "train")
    assert examples.texts == [("q1", "s1"), ("q2", "s2")]
    assert examples.labels.tolist() == [1, 0]
    assert examples.ids == ["0", "1"]  # the index column


def test_mrpc_with_bom(tmp_path):
    write(
        tmp_path,
        "train.tsv",
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t702876\t702977\tAmrozi accused his brother .\tReferring to him " as the witness .\n'
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought it .\n",
    )
    examples = read_task_split(GLUE_TASKS["mrpc"], tmp_path, "train")
    assert examples.labels.tolist() == [1, 0]
    assert examples.texts[0] == ("Amrozi accused his brother .", 'Referring to him " as the witness .')


def test_cola_headerless_train(tmp_path):
    write(
        tmp_path,
        "train.tsv",
        "gj04\t1\t\tOur friends won't buy this analysis.\n"
        "gj04\t0\t*\tOne more pseudo generalization and I'm giving up.\n",
    )
    examples = read_task_split(GLUE_TASKS["cola"], tmp_path, "train")
    assert examples.texts == [
        ("Our friends won't buy this analysis.",),
        ("One more pseudo generalization and I'm giving up.",),
    ]
    assert examples.labels.tolist() == [1, 0]
    assert examples.ids == ["0", "1"]


def test_cola_headerless_bad_row_counts_from_line_one(tmp_path):
    path = write(tmp_path, "dev.tsv", "gj04\t1\t\tfine.\ngj04\t0\tbroken row\n")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["cola"], tmp_path, "dev")
    assert str(path) in str(info.value) and "line 2" in str(info.value)


def test_cola_test_file_has_a_header(tmp_path):
    write(tmp_path, "test.tsv", "index\tsentence\n0\tBill whistled past the house.\n1\tThe car honked.\n")
    examples = read_task_split(GLUE_TASKS["cola"], tmp_path, "test")
    assert examples.labels is None and examples.ids == ["0", "1"]


def test_stray_double_quote_is_kept(tmp_path):
    write(tmp_path, "train.tsv", 'sentence\tlabel\n"the film\t1\nit was " great "\t0\nlast\t1\n')
    examples = read_task_split(GLUE_TASKS["sst2"], tmp_path, "train")
    assert examples.texts == [('"the film',), ('it was " great "',), ("last",)]
    assert examples.labels.tolist() == [1, 0, 1]


def test_wrong_column_count_names_file_and_line(tmp_path):
    path = write(tmp_path, "train.tsv", "sentence\tlabel\nok\t1\ntoo\tmany\t0\nok\t0\n")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "train")
    message = str(info.value)
    assert str(path) in message and "line 3" in message and "found 3" in message


def test_bad_label_names_file_and_line(tmp_path):
    path = write(tmp_path, "dev.tsv", "sentence\tlabel\nok\t1\nok\t0\nok\tpositive\n")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "dev")
    message = str(info.value)
    assert str(path) in message and "line 4" in message and "positive" in message


def test_bad_regression_label(tmp_path):
    path = write(tmp_path, "train.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.5\n1\ta\tb\tn/a\n")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["stsb"], tmp_path, "train")
    assert str(path) in str(info.value) and "line 3" in str(info.value)


def test_regression_labels_are_floats(tmp_path):
    write(tmp_path, "dev.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.5\n1\tc\td\t0.25\n")
    examples = read_task_split(GLUE_TASKS["stsb"], tmp_path, "dev")
    assert examples.labels.dtype == np.float32 and examples.labels.tolist() == [3.5, 0.25]
    assert examples.texts == [("a", "b"), ("c", "d")]


def test_test_file_without_labels(task_dir):
    examples = read_task_split(spec_with(["accuracy"]), task_dir, "test")
    assert examples.labels is None
    assert examples.ids == [str(index) for index in range(10)]
    assert len(examples.texts) == 10


def test_test_ids_come_from_the_index_column(tmp_path):
    write(tmp_path, "test.tsv", "index\tsentence\n17\tfirst\n4\tsecond\n")
    examples = read_task_split(GLUE_TASKS["sst2"], tmp_path, "test")
    assert examples.ids == ["17", "4"] and examples.labels is None
    assert examples.texts == [("first",), ("second",)]


def test_missing_text_column(tmp_path):
    path = write(tmp_path, "train.tsv", "text\tlabel\nok\t1\n")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "train")
    assert str(path) in str(info.value) and "sentence" in str(info.value)


def test_missing_split_file(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    with pytest.raises(UserError, match="no dev file"):
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "dev")
    with pytest.raises(UserError, match="no split 'validation'"):
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "validation")


def test_header_only_file(tmp_path):
    write(tmp_path, "train.tsv", "sentence\tlabel\n")
    with pytest.raises(UserError, match="no examples"):
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "train")


def test_mnli_file_names(tmp_path):
    write(tmp_path, "dev_matched.tsv", "index\tsentence1\tsentence2\tgold_label\n0\tp\th\tneutral\n")
    examples = read_task_split(GLUE_TASKS["mnli"], tmp_path, "dev")
    assert examples.labels.tolist() == [2]
