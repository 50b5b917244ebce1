"""The specs (GLUE's and a custom task's); reading GLUE-layout TSV files, and their errors (the metrics:
tests/tasks/test_metrics.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from finetune.data.task_files import read_task_split
from finetune.errors import UserError
from finetune.glue.specs import GLUE_TASKS
from finetune.recipes import task_config
from finetune.tasks.specs import TaskSpec, task_spec


def spec_with(metrics, labels=("0", "1")) -> TaskSpec:
    return TaskSpec("custom", ("sentence",), "label", labels, tuple(metrics))


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------


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
