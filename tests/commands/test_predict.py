"""`finetune predict` and `finetune.predict`: raw text in, labels and probabilities (or scores) out."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.data.task_files import read_task_split
from finetune.models.heads import load_finetuned
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from finetune.tasks.specs import task_spec
from tests.conftest import finetune_recipe, make_sentence, save_tiny_masked_lm, write_task, write_yaml

runner = CliRunner()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A tiny sentiment classifier fine-tuned on the generated task (labels "0"/"1")."""
    folder = tmp_path_factory.mktemp("classifier")
    data = finetune_recipe(save_tiny_masked_lm(folder / "lm"), write_task(folder / "task"), folder / "run")
    # Enough to tell the labels apart: the rows' probabilities then differ, so a mix-up of rows would show.
    data.update(pooling="mean", unfreezing={"mode": "none"}, discriminative={"factor": 1.0})
    data["training"].update(epochs=8, lr=1e-2)
    return run_finetune(load_recipe(write_yaml(folder / "recipe.yaml", data), expected_stage="finetune"))


@pytest.fixture(scope="module")
def pair_regressor(tmp_path_factory) -> Path:
    """A tiny regression model on a pair task (columns first/second, a score in [0, 5])."""
    folder = tmp_path_factory.mktemp("pairs")
    rng = random.Random(3)
    (folder / "task").mkdir()
    for split, count in (("train", 32), ("dev", 8)):
        rows = ["first\tsecond\tscore"]
        for _ in range(count):
            positive = rng.random() < 0.5
            rows.append(f"{make_sentence(rng, positive)}\t{make_sentence(rng, True)}\t{5.0 if positive else 1.0}")
        (folder / "task" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    data = finetune_recipe(save_tiny_masked_lm(folder / "lm"), folder / "task", folder / "run")
    data["task"] = {
        "name": "pairs",
        "data_dir": str(folder / "task"),
        "text_columns": ["first", "second"],
        "label_column": "score",
        "labels": None,
        "max_length": 24,
    }
    data["training"]["epochs"] = 1
    return run_finetune(load_recipe(write_yaml(folder / "recipe.yaml", data), expected_stage="finetune"))


def saved_task(checkpoint: Path):
    recipe = load_recipe(checkpoint / "finetune_recipe.yaml", expected_stage="finetune", check_paths=False)
    return task_spec(recipe.task), recipe.task.data_dir


def dev_texts(classifier: Path) -> list[str]:
    spec, data_dir = saved_task(classifier)
    return [texts[0] for texts in read_task_split(spec, data_dir, "dev").texts]


def reference_probabilities(checkpoint: Path, texts: list[str], spec) -> np.ndarray:
    """The model run on one example at a time, no padding: what every batched prediction must equal."""
    from transformers import AutoTokenizer

    model = load_finetuned(str(checkpoint), spec).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        logits = [
            model(**tokenizer(text, truncation=True, max_length=16, return_tensors="pt")).logits[0] for text in texts
        ]
    return torch.softmax(torch.stack(logits).double(), dim=-1).numpy()


def test_python_call_gives_labels_and_probabilities_of_each_text(classifier):
    texts = dev_texts(classifier)
    results = finetune.predict(str(classifier), texts, batch_size=5)
    assert len(results) == len(texts)
    expected = reference_probabilities(classifier, texts, saved_task(classifier)[0])
    got = np.array([[result["probabilities"]["0"], result["probabilities"]["1"]] for result in results])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [result["label"] for result in results] == [str(index) for index in expected.argmax(axis=1)]
    assert np.ptp(got[:, 1]) > 0.1 and len({result["label"] for result in results}) == 2


def test_cli_plain_lines_from_stdin_to_json_lines(classifier):
    texts = dev_texts(classifier)[:6]
    result = runner.invoke(app, ["predict", str(classifier)], input="\n".join(texts) + "\n\n")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [row["sentence"] for row in rows] == texts
    assert rows == [
        {"sentence": text, **prediction} for text, prediction in zip(texts, finetune.predict(str(classifier), texts))
    ]


@pytest.mark.parametrize("extension", ["tsv", "csv", "jsonl"])
def test_cli_tables_in_and_out(classifier, tmp_path, extension):
    texts = dev_texts(classifier)[:7]
    source = tmp_path / f"in.{extension}"
    if extension == "jsonl":
        source.write_text("".join(json.dumps({"id": i, "sentence": t}) + "\n" for i, t in enumerate(texts)))
    else:
        with open(source, "w", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t" if extension == "tsv" else ",")
            writer.writerow(["id", "sentence", "label"])  # a label column is ignored
            writer.writerows([[i, text, "1"] for i, text in enumerate(texts)])
    target = tmp_path / f"out.{extension}"
    result = runner.invoke(app, ["predict", str(classifier), "--input", str(source), "--output", str(target)])
    assert result.exit_code == 0, result.output
    expected = finetune.predict(str(classifier), texts)
    if extension == "jsonl":
        rows = [json.loads(line) for line in target.read_text().splitlines()]
        assert [row["label"] for row in rows] == [row["label"] for row in expected]
    else:
        with open(target, newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t" if extension == "tsv" else ","))
        assert list(rows[0]) == ["sentence", "label", "probability_0", "probability_1"]
        assert [row["sentence"] for row in rows] == texts
        assert [float(row["probability_1"]) for row in rows] == pytest.approx(
            [row["probabilities"]["1"] for row in expected]
        )
    assert not list(tmp_path.glob(".*partial"))


def test_pair_regression_gives_scores(pair_regressor, tmp_path):
    pairs = [
        ("the film was a wonderful treat .", "the cast was a great joy ."),
        ("the plot was a dull mess .", "the music was a great joy ."),
    ]
    results = finetune.predict(str(pair_regressor), pairs)
    assert [set(result) for result in results] == [{"score"}, {"score"}]
    assert results[0]["score"] != results[1]["score"]
    lines = "\n".join("\t".join(pair) for pair in pairs)
    cli = runner.invoke(app, ["predict", str(pair_regressor)], input=lines)
    assert cli.exit_code == 0, cli.output
    rows = [json.loads(line) for line in cli.stdout.splitlines() if line.startswith("{")]
    assert [(row["first"], row["second"]) for row in rows] == pairs
    assert [row["score"] for row in rows] == pytest.approx([result["score"] for result in results])


@pytest.mark.parametrize(
    ("arguments", "stdin", "expected"),
    [
        ([], "one text only\n", "<stdin> line 1: task 'pairs' reads 2 tab-separated texts (first, second), found 1"),
        (["--output", "out.txt"], "a\tb\n", "--output: out.txt must end in .jsonl, .tsv or .csv"),
        (["--input", "absent.tsv"], "", "--input: no such file: absent.tsv"),
        ([], "\n\n", "<stdin>: no text (every line is empty)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(pair_regressor, tmp_path, monkeypatch, arguments, stdin, expected):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["predict", str(pair_regressor), *arguments], input=stdin)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {expected}"
    assert not (tmp_path / "out.txt").exists()


def test_a_table_without_the_text_columns_names_the_file(pair_regressor, tmp_path):
    source = tmp_path / "in.tsv"
    source.write_text("first\tother\na\tb\n")
    result = runner.invoke(app, ["predict", str(pair_regressor), "--input", str(source)])
    assert result.exit_code == 2 and "in.tsv: missing column(s) second" in result.output


def test_a_model_folder_without_a_recipe_is_refused(tmp_path):
    checkpoint = save_tiny_masked_lm(tmp_path)
    result = runner.invoke(app, ["predict", str(checkpoint)], input="text\n")
    assert result.exit_code == 2 and "has no finetune_recipe.yaml" in result.output
