"""Multi-label classification (task kind multilabel): label sets read from a list column or 0/1 columns with every
row checked, a sigmoid per label and binary cross-entropy, micro/macro F1 and subset accuracy at a threshold given or
chosen on dev and saved with the checkpoint, which eval and predict apply."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.predict import predict
from finetune.data.task_files import read_examples_file, read_task_split
from finetune.errors import InputError
from finetune.kinds.multilabel.metrics import best_threshold, label_table, multilabel_metrics
from finetune.recipes import load_recipe, task_config
from finetune.tasks.specs import task_spec
from tests.conftest import FILLERS, one_error_line, save_tiny_masked_lm, write_yaml

runner = CliRunner()
MARKERS = {"great": "GREAT", "awful": "AWFUL", "music": "MUSIC"}  # a sentence has the label of each marker it holds
LABELS = list(MARKERS.values())


def marker_sentence(rng: random.Random) -> tuple[str, list[str]]:
    """Fillers with each marker word in it or not (half the time each): the labels are the markers present."""
    present = [marker for marker in MARKERS if rng.random() < 0.5]
    words = [rng.choice(FILLERS) for _ in range(3)] + present
    rng.shuffle(words)
    return " ".join(words), [MARKERS[marker] for marker in MARKERS if marker in present]


def write_marker_task(folder: Path, counts=(("train", 96), ("dev", 32), ("test", 24))) -> Path:
    """JSON Lines: {"text", "labels": [...]} per line."""
    rng = random.Random(4)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in counts:
        rows = [dict(zip(("text", "labels"), marker_sentence(rng))) for _ in range(count)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def marker_task(tmp_path_factory) -> Path:
    return write_marker_task(tmp_path_factory.mktemp("multilabel") / "task")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return save_tiny_masked_lm(tmp_path_factory.mktemp("multilabel-lm"))


def task_section(task: Path, **keys) -> dict:
    return {
        "name": "markers",
        "kind": "multilabel",
        "data_dir": str(task),
        "text_columns": ["text"],
        "label_column": "labels",
        "labels": LABELS,
        "max_length": 16,
        **keys,
    }


def multilabel_recipe(checkpoint: Path, task: Path, run_dir: Path, **task_keys) -> dict:
    """Mean pooling: a tiny BERT at random weights learns which words a text holds from the mean of its tokens much
    sooner than through [CLS]."""
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"checkpoint": str(checkpoint)},
        "pooling": "mean",
        "task": task_section(task, **task_keys),
        "training": {"epochs": 6, "batch_size": 8, "lr": 3e-3, "log_every": 5, "device": "cpu"},
    }


def spec_of(**keys):
    return task_spec(
        task_config(**{"name": "t", "kind": "multilabel", "data_dir": ".", "text_columns": ["text"], **keys})
    )


# ---------------------------------------------------------------------------------------------
# Reading: a list column or a 0/1 column per label
# ---------------------------------------------------------------------------------------------


def test_a_list_column_is_read_in_each_format(tmp_path):
    spec = spec_of(label_column="tags", labels=["PER", "ORG", "LOC"])
    (tmp_path / "a.jsonl").write_text('{"text": "x", "tags": ["LOC", "PER"]}\n{"text": "y", "tags": []}\n')
    (tmp_path / "a.tsv").write_text("text\ttags\nx\tLOC|PER\ny\t\nz\tORG | ORG\n")
    (tmp_path / "a.csv").write_text('text,tags\nx,"[""LOC"", ""PER""]"\ny,[]\n')
    expected = [[1, 0, 1], [0, 0, 0]]
    for name, rows in (("a.jsonl", expected), ("a.tsv", expected + [[0, 1, 0]]), ("a.csv", expected)):
        examples = read_examples_file(spec, tmp_path / name, name.split(".")[1])
        assert examples.labels.dtype == np.float32 and examples.labels.tolist() == rows, name
        assert examples.texts[:2] == [("x",), ("y",)]
    semicolons = spec_of(label_column="tags", labels=["PER", "ORG", "LOC"], label_separator=";")
    (tmp_path / "b.tsv").write_text("text\ttags\nx\tORG;LOC\n")
    assert read_examples_file(semicolons, tmp_path / "b.tsv", "tsv").labels.tolist() == [[0, 1, 1]]


def test_label_columns_of_zero_or_one_are_read_as_the_labels(tmp_path):
    spec = spec_of(label_columns=["PER", "ORG", "LOC"])
    assert spec.labels == ("PER", "ORG", "LOC")
    assert spec.metrics == ("f1_micro", "f1_macro", "f1_weighted", "subset_accuracy")
    (tmp_path / "train.tsv").write_text("text\tPER\tORG\tLOC\nx\t1\t0\t1\ny\t0\t0\t0\n")
    (tmp_path / "dev.jsonl").write_text('{"text": "x", "PER": 1, "ORG": true, "LOC": 0}\n')
    assert read_examples_file(spec, tmp_path / "train.tsv", "tsv").labels.tolist() == [[1, 0, 1], [0, 0, 0]]
    assert read_examples_file(spec, tmp_path / "dev.jsonl", "jsonl").labels.tolist() == [[1, 1, 0]]
    (tmp_path / "test.tsv").write_text("text\nz\n")  # no label column: an unlabelled file
    assert read_examples_file(spec, tmp_path / "test.tsv", "tsv").labels is None


@pytest.mark.parametrize(
    "keys, name, text, line, message",
    [
        (
            {"label_column": "tags", "labels": ["PER", "ORG"]},
            "a.tsv",
            "text\ttags\nx\tPER\ny\tPER|CITY\n",
            3,
            "label 'CITY' is not one of PER, ORG",
        ),
        (
            {"label_column": "tags", "labels": ["PER", "ORG"]},
            "a.jsonl",
            '{"text": "x", "tags": ["PER"]}\n{"text": "y", "tags": "PER"}\n{"text": "z", "tags": {"PER": 1}}\n',
            3,
            "tags: expected a list of labels",
        ),
        (
            {"label_column": "tags", "labels": ["PER", "ORG"]},
            "a.jsonl",
            '{"text": "x", "tags": ["PER"]}\n{"text": "y"}\n',
            2,
            "missing key tags (earlier lines have it)",
        ),
        (
            {"label_columns": ["PER", "ORG"]},
            "a.tsv",
            "text\tPER\tORG\nx\t1\t0\ny\t0\t2\n",
            3,
            "column ORG: '2' is not 0 or 1",
        ),
        ({"label_columns": ["PER", "ORG"]}, "a.csv", "text,PER,ORG\nx,1,yes\n", 2, "column ORG: 'yes' is not 0 or 1"),
    ],
)
def test_a_bad_label_names_file_and_line(tmp_path, keys, name, text, line, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as error:
        read_examples_file(spec_of(**keys), tmp_path / name, name.split(".")[1])
    assert (error.value.source, error.value.line) == (tmp_path / name, line)
    assert str(error.value) == f"{tmp_path / name} line {line}: {message}" or message in str(error.value)


# ---------------------------------------------------------------------------------------------
# The model, the metrics, the threshold
# ---------------------------------------------------------------------------------------------


def test_the_head_is_a_sigmoid_per_label_with_binary_cross_entropy(tiny_bert):
    from finetune.models.heads import load_classifier
    from finetune.recipes.finetune import BackboneConfig

    backbone = BackboneConfig(checkpoint=str(tiny_bert))
    model = load_classifier(backbone, spec_of(label_columns=LABELS), None).eval()
    assert model.config.problem_type == "multi_label_classification" and model.config.num_labels == 3
    assert model.config.id2label == {0: "GREAT", 1: "AWFUL", 2: "MUSIC"}
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    output = model(
        input_ids=torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]]),
        attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        labels=labels,
    )
    assert output.logits.shape == (2, 3) and output.loss.shape == ()
    probabilities = torch.sigmoid(output.logits)  # the mean over the 6 example x label terms
    by_hand = -(labels * probabilities.log() + (1 - labels) * (1 - probabilities).log()).mean()
    assert torch.allclose(output.loss, by_hand, atol=1e-6)


def test_micro_f1_macro_and_subset_accuracy_by_hand():
    references = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0]])
    predicted = np.array([[1, 0, 0], [0, 1, 1], [1, 0, 0], [0, 0, 0]])
    # TP 3, FP 1, FN 1: micro 6/8; per label F1 1, 1 and 0 (C: no TP, one FP, one FN); rows 1 (C missed) and 2
    # (C extra) are wrong as sets, rows 3 and 4 right; weighted by examples (A 2, B 1, C 1): (2 + 1 + 0) / 4
    assert multilabel_metrics(references, predicted) == {
        "f1_micro": 0.75,
        "f1_macro": 2 / 3,
        "f1_weighted": 0.75,
        "subset_accuracy": 0.5,
    }
    table = label_table(references, predicted, ["A", "B", "C"])
    assert table["C"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "examples": 1}
    assert table["A"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "examples": 2}
    # A label nobody has and nothing predicts is left out of macro F1 (its F1 is undefined), not counted as 0.
    assert multilabel_metrics(references[:, :2], predicted[:, :2])["f1_macro"] == 1.0
    assert multilabel_metrics(np.zeros((2, 2)), np.zeros((2, 2))) == {
        "f1_micro": 0.0,
        "f1_macro": 0.0,
        "f1_weighted": 0.0,
        "subset_accuracy": 1.0,
    }


def test_the_dev_threshold_is_the_best_f1_micro_nearest_one_half():
    references = np.array([[1, 0], [1, 1], [0, 0], [0, 1]])
    probabilities = np.array([[0.35, 0.1], [0.3, 0.8], [0.2, 0.1], [0.1, 0.9]])
    # The positives' lowest probability is 0.3, the negatives' highest 0.2: F1 1.0 for the thresholds in
    # [0.2, 0.3) (a label is predicted above the threshold), the nearest 0.5 of them on the grid is 0.29.
    assert best_threshold(references, probabilities) == 0.29
    assert multilabel_metrics(references, probabilities > 0.29)["f1_micro"] == 1.0
    assert multilabel_metrics(references, probabilities > 0.5)["f1_micro"] == 2 / 3  # TP 2, FN 2, FP 0: 4/6
    # A plateau on both sides of 0.5: 0.5 itself.
    assert best_threshold(np.array([[1, 0]]), np.array([[0.9, 0.1]])) == 0.5


# ---------------------------------------------------------------------------------------------
# Fine-tune, evaluate, predict
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multilabel_run(tmp_path_factory, tiny_bert, marker_task) -> Path:
    folder = tmp_path_factory.mktemp("multilabel-run")
    recipe = write_yaml(
        folder / "recipe.yaml", multilabel_recipe(tiny_bert, marker_task, folder / "run", threshold="dev")
    )
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    return folder / "run"


def test_a_multilabel_classifier_learns_and_saves_its_threshold(multilabel_run):
    result = json.loads((multilabel_run / "result.json").read_text())
    assert result["main_metric"] == "f1_micro"
    assert set(result["best"]) == {
        "dev_f1_micro",
        "dev_f1_macro",
        "dev_f1_weighted",
        "dev_subset_accuracy",
        "dev_threshold",
    }
    # The labels are the marker words: a classifier that learns gets them; every label everywhere scores about 0.67.
    assert result["best"]["dev_f1_micro"] > 0.85
    per_label = result["classes"]["per_class"]  # the saved evaluation's table per label
    assert list(per_label) == result["classes"]["labels"] and len(per_label) >= 2
    assert all(set(row) == {"precision", "recall", "f1", "support"} for row in per_label.values())
    evaluations = [json.loads(line) for line in (multilabel_run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record for record in evaluations if record["phase"] == "eval"]
    assert len(evaluations) == 6 and evaluations[0]["dev_f1_micro"] < result["best"]["dev_f1_micro"]
    model = AutoModelForSequenceClassification.from_pretrained(multilabel_run / "checkpoint")
    assert model.config.problem_type == "multi_label_classification"
    assert model.config.id2label == {0: "GREAT", 1: "AWFUL", 2: "MUSIC"}
    assert model.config.multilabel_threshold == result["best"]["dev_threshold"]
    card = (multilabel_run / "checkpoint" / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "multi-label-classification" in card
    assert f"| decision threshold | {result['best']['dev_threshold']:g} (a sigmoid per label" in card
    assert "chosen on dev" in card


def eval_yaml(folder: Path, task: Path, models: dict, **task_keys) -> Path:
    return write_yaml(
        folder / "eval.yaml",
        {
            "stage": "eval",
            "run_dir": str(folder / "eval"),
            "split": "test",
            "write_predictions": True,
            "task": {**task_section(task), **task_keys},
            "models": models,
        },
    )


def test_eval_applies_the_threshold_the_checkpoint_saved(multilabel_run, marker_task, tmp_path):
    saved = json.loads((multilabel_run / "result.json").read_text())["best"]["dev_threshold"]
    result = runner.invoke(
        app, ["eval", str(eval_yaml(tmp_path, marker_task, {"ml": str(multilabel_run / "checkpoint")}))]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    scores = report["results"]["ml"]
    assert report["examples"] == 24 and scores["threshold"] == saved and scores["f1_micro"] > 0.8
    assert set(scores["labels"]) == set(LABELS) and sum(row["examples"] for row in scores["labels"].values()) == int(
        read_task_split(task_spec(task_config(**task_section(marker_task))), marker_task, "test").labels.sum()
    )
    markdown = (tmp_path / "eval" / "report.md").read_text()
    assert "## ml: by label" in markdown and f"| ml | {saved:g} |" in markdown
    rows = (tmp_path / "eval" / "predictions" / "ml.tsv").read_text().splitlines()
    assert (
        rows[0] == "index\tlabels"
        and len(rows) == 25
        and all(set(filter(None, row.split("\t")[1].split("|"))) <= set(LABELS) for row in rows[1:])
    )
    # A number in the eval recipe scores at that threshold instead.
    shutil.rmtree(tmp_path / "eval")
    extreme = runner.invoke(
        app,
        ["eval", str(eval_yaml(tmp_path, marker_task, {"ml": str(multilabel_run / "checkpoint")}, threshold=0.999))],
    )
    assert extreme.exit_code == 0, extreme.output
    scores = json.loads((tmp_path / "eval" / "report.json").read_text())["results"]["ml"]
    assert scores["threshold"] == 0.999 and scores["f1_micro"] < report["results"]["ml"]["f1_micro"]


def test_predict_gives_the_labels_above_the_threshold(multilabel_run, tmp_path):
    threshold = AutoModelForSequenceClassification.from_pretrained(
        multilabel_run / "checkpoint"
    ).config.multilabel_threshold
    rows = predict(
        str(multilabel_run / "checkpoint"), ["really great music so", "very quite truly awful", "so very really"]
    )
    for row in rows:  # the labels are those above the threshold the checkpoint saved
        assert list(row["probabilities"]) == LABELS
        assert row["labels"] == [label for label in LABELS if row["probabilities"][label] > threshold]
    assert "GREAT" in rows[0]["labels"] and "AWFUL" not in rows[0]["labels"]
    assert "AWFUL" in rows[1]["labels"] and "GREAT" not in rows[1]["labels"]
    assert rows[2]["probabilities"]["GREAT"] < rows[0]["probabilities"]["GREAT"]
    (tmp_path / "in.jsonl").write_text('{"text": "great awful", "labels": ["MUSIC"]}\n')  # its labels are ignored
    result = runner.invoke(
        app,
        [
            "predict",
            str(multilabel_run / "checkpoint"),
            "--input",
            str(tmp_path / "in.jsonl"),
            "--output",
            str(tmp_path / "out.tsv"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "out.tsv").read_text().splitlines()
    assert lines[0] == "text\tlabels\tprobability_GREAT\tprobability_AWFUL\tprobability_MUSIC"
    # The file's labels are those its own probabilities put above the threshold (what the tiny model learnt of
    # "great awful" is its training's: asserting GREAT|AWFUL made the test pass or fail with the thread count).
    text, labels, *probabilities = lines[1].split("\t")
    above = [label for label, value in zip(LABELS, probabilities) if float(value) > threshold]
    assert (text, labels) == ("great awful", "|".join(above))


def test_an_awd_lstm_classifier_learns_several_labels(marker_task, tmp_path):
    from tests.commands.test_profile import save_tiny_awd_lstm

    data = multilabel_recipe(save_tiny_awd_lstm(tmp_path / "lm"), marker_task, tmp_path / "run", threshold="dev")
    del data["pooling"]  # its own concat pooling
    # From random weights every layer must learn at once: no gradual unfreezing, one LR.
    data.update({"unfreezing": {"mode": "none"}, "discriminative": {"factor": 1.0}})
    data["training"].update({"epochs": 8, "lr": 3e-2})
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    best = json.loads((tmp_path / "run" / "result.json").read_text())["best"]
    assert best["dev_f1_micro"] > 0.85  # every label predicted everywhere: about 0.67
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "checkpoint")
    assert model.config.model_type == "awd_lstm" and model.config.problem_type == "multi_label_classification"
    assert model.config.multilabel_threshold == best["dev_threshold"]


def test_documents_read_in_chunks_learn_from_binary_cross_entropy(tiny_bert, marker_task, tmp_path):
    data = multilabel_recipe(
        tiny_bert, marker_task, tmp_path / "run", max_length=6, long_documents="chunks", threshold="dev"
    )
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    assert "are read in windows" in result.output  # the texts are longer than 6 tokens: several windows each
    # Each document's windows' logits are pooled (mean) before the loss; every label everywhere scores about 0.67.
    assert json.loads((tmp_path / "run" / "result.json").read_text())["best"]["dev_f1_micro"] > 0.8


def test_profile_counts_the_multilabel_classifier(tiny_bert, marker_task, tmp_path):
    data = multilabel_recipe(tiny_bert, marker_task, tmp_path / "run")
    del data["pooling"]  # the checkpoint's own head: what AutoModelForSequenceClassification builds
    result = runner.invoke(
        app, ["profile", str(write_yaml(tmp_path / "recipe.yaml", data)), "--json", "--matmul-gflops", "100"]
    )
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)
    real = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=3)
    assert profile["parameters"]["total"] == sum(parameter.numel() for parameter in real.parameters())
    assert profile["model"]["kind"] == "multi-label classifier, 3 labels"


def test_a_stopped_multilabel_run_resumes_bit_for_bit(tiny_bert, marker_task, tmp_path, monkeypatch):
    from tests.training.test_resume_finetune import Stopped, assert_same_run, stop_after_checkpoint

    def recipe(name: str) -> Path:
        data = multilabel_recipe(tiny_bert, marker_task, tmp_path / name, threshold="dev")
        data.update({"checkpoint_every": 7, "eval_every": 5})
        data["training"]["epochs"] = 3
        return write_yaml(tmp_path / f"{name}.yaml", data)

    assert runner.invoke(app, ["finetune", str(recipe("full"))]).exit_code == 0
    stop_after_checkpoint(monkeypatch, 14)  # mid-epoch 2 (12 steps an epoch), after an evaluation at step 10
    with pytest.raises(Stopped):
        from finetune.recipes import load_recipe
        from finetune.stages.finetune import run_finetune

        run_finetune(load_recipe(recipe("resumed")))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")
    configs = [json.loads((tmp_path / name / "checkpoint" / "config.json").read_text()) for name in ("full", "resumed")]
    assert configs[0]["multilabel_threshold"] == configs[1]["multilabel_threshold"]


# ---------------------------------------------------------------------------------------------
# Refusals: one line each
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"metrics": ["accuracy"]}, "metrics: not for kind multilabel"),
        ({"labels": None}, "labels: list the label set (label_column holds lists of them)"),
        (
            {"label_columns": LABELS},
            "label_column (a list of labels per example) or label_columns (a 0/1 column per label), not both",
        ),
        (
            {"label_column": None, "labels": None, "label_columns": LABELS, "label_separator": ";"},
            "label_separator: for a label_column holding lists",
        ),
        ({"label_column": "text"}, "'text' is both a text column and a label column"),
        ({"threshold": 1.5}, "threshold"),
    ],
)
def test_bad_multilabel_keys_are_one_line(tiny_bert, marker_task, tmp_path, keys, expected):
    data = multilabel_recipe(tiny_bert, marker_task, tmp_path / "run")
    data["task"].update(keys)
    data["task"] = {key: value for key, value in data["task"].items() if value is not None}
    assert expected in one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert not (tmp_path / "run").exists()


def test_a_former_score_name_is_read_with_a_notice(tiny_bert, marker_task, tmp_path, capsys):
    """Multi-label scores are spelled as classification's (scikit-learn's f1_macro); macro_f1 still reads."""
    data = multilabel_recipe(tiny_bert, marker_task, tmp_path / "run") | {"metric_for_best": "macro_f1"}
    path = write_yaml(tmp_path / "r.yaml", data)
    assert load_recipe(path).selection_metric() == "f1_macro"
    notice = " ".join(capsys.readouterr().err.split())  # the console says it on stderr
    assert f"recipe {path}: metric_for_best: macro_f1 is read as f1_macro" in notice
    assert load_recipe(path, ["metric_for_best=f1_micro"]).selection_metric() == "f1_micro"
    assert "is read as" not in capsys.readouterr().err


def test_multilabel_keys_need_kind_multilabel(tiny_bert, marker_task, tmp_path):
    data = multilabel_recipe(tiny_bert, marker_task, tmp_path / "run", threshold=0.3)
    del data["task"]["kind"]
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert "task.threshold: not for kind classification (a key of kind multilabel)" in message


def test_an_unknown_dev_label_is_one_line_naming_file_and_line(tiny_bert, marker_task, tmp_path):
    task = tmp_path / "task"
    shutil.copytree(marker_task, task)
    (task / "dev.jsonl").write_text('{"text": "great", "labels": ["GREAT"]}\n{"text": "x", "labels": ["CAT"]}\n')
    data = multilabel_recipe(tiny_bert, task, tmp_path / "run")
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "r.yaml", data))]))
    assert message == f"error: {task / 'dev.jsonl'} line 2: label 'CAT' is not one of GREAT, AWFUL, MUSIC"
    assert not (tmp_path / "run").exists()


def test_eval_refuses_dev_thresholds_ensembles_and_single_label_checkpoints(multilabel_run, marker_task, tmp_path):
    checkpoint = str(multilabel_run / "checkpoint")
    message = one_error_line(
        runner.invoke(app, ["eval", str(eval_yaml(tmp_path, marker_task, {"ml": checkpoint}, threshold="dev"))])
    )
    assert "task.threshold: dev is chosen while fine-tuning" in message
    single = tmp_path / "single"
    shutil.copytree(checkpoint, single)
    config = json.loads((single / "config.json").read_text())
    (single / "config.json").write_text(json.dumps({**config, "problem_type": "single_label_classification"}))
    message = one_error_line(runner.invoke(app, ["eval", str(eval_yaml(tmp_path, marker_task, {"one": str(single)}))]))
    assert message.startswith(f"error: models.one: {single}: a single-label classifier (one label per example)")
    assert not (tmp_path / "eval").exists()


def test_the_dev_predictions_are_label_sets_at_the_saved_threshold(multilabel_run):
    best = json.loads((multilabel_run / "result.json").read_text())["best"]
    rows = [json.loads(line) for line in (multilabel_run / "dev_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and all(list(row["probabilities"]) == LABELS for row in rows)
    references = np.array([[label in row["label"] for label in LABELS] for row in rows])
    predicted = np.array([[label in row["predicted"] for label in LABELS] for row in rows])
    probabilities = np.array([list(row["probabilities"].values()) for row in rows])
    assert ((probabilities > best["dev_threshold"]) == predicted).mean() > 0.99  # the probabilities are rounded
    scores = multilabel_metrics(references, predicted)
    assert scores["f1_micro"] == pytest.approx(best["dev_f1_micro"])  # the saved checkpoint's evaluation
    assert scores["subset_accuracy"] == pytest.approx(best["dev_subset_accuracy"])


def test_labels_per_class_draws_rows_of_every_label_and_of_none(tiny_bert, marker_task, tmp_path):
    data = multilabel_recipe(tiny_bert, marker_task, tmp_path / "run", labels_per_class=10)
    data["training"]["epochs"] = 1
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "labelled_rows.json").read_text())
    assert set(record["counts"]) == {*LABELS, "(no label)"} and min(record["counts"].values()) >= 10
    assert len(record["rows"]) < 96 and record["pool_rows"] == 96
    assert f"task.labels_per_class 10, draw 0: {len(record['rows'])} of the 96 training rows" in result.output
