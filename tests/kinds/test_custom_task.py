"""A newcomer's own task through the real CLI: a news CSV with numeric labels and Title/Description columns."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.models.heads import load_finetuned
from finetune.recipes import load_recipe
from finetune.tasks.specs import task_spec
from tests.conftest import finetune_where_a_user_would

runner = CliRunner()
TOPICS = {
    1: ["minister", "election", "summit"],
    2: ["match", "goal", "coach"],
    3: ["shares", "profit", "bank"],
    4: ["software", "chip", "robot"],
}
NAMES = ["World", "Sports", "Business", "Sci/Tech"]
RECIPE = """\
stage: finetune
run_dir: runs/news
model:
  checkpoint: lm/checkpoint
task:
  name: news
  data_dir: data/news              # train.csv, dev.csv, test.csv: no format key
  text: "{Title}. {Description}"
  label_column: Class Index
  labels: [1, 2, 3, 4]
  label_names: {1: World, 2: Sports, 3: Business, 4: Sci/Tech}
  max_length: 24
training: {epochs: 1, batch_size: 8, device: cpu}
"""


def write_news(folder: Path) -> None:
    """train.csv and dev.csv (Class Index 1-4, Title, Description) and test.csv without labels."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for split, count in (("train", 16), ("dev", 8), ("test", 3)):
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow((["Class Index"] if split != "test" else []) + ["Title", "Description"])
            for _ in range(count):
                label = rng.randint(1, 4)
                row = [f"{rng.choice(TOPICS[label]).title()}, today", f"The {rng.choice(TOPICS[label])} said so."]
                writer.writerow(([label] if split != "test" else []) + row)


@pytest.fixture(scope="module")
def news_run(tmp_path_factory) -> Path:
    """The working folder after `finetune finetune news.yaml` there."""
    folder = tmp_path_factory.mktemp("newcomer")
    write_news(folder / "data" / "news")
    return finetune_where_a_user_would(folder, "news.yaml", RECIPE)


def test_the_checkpoint_and_its_card_carry_the_label_names(news_run):
    checkpoint = news_run / "runs" / "news" / "checkpoint"
    assert AutoConfig.from_pretrained(checkpoint).id2label == dict(enumerate(NAMES))
    card = (checkpoint / "README.md").read_text(encoding="utf-8")
    assert "`{Title}. {Description}` -> World, Sports, Business, Sci/Tech" in card


def test_predict_reads_the_columns_and_gives_label_names(news_run, monkeypatch):
    monkeypatch.chdir(news_run)
    checkpoint = "runs/news/checkpoint"
    result = runner.invoke(app, ["predict", checkpoint, "--input", "data/news/test.csv", "--output", "out.csv"])
    assert result.exit_code == 0, result.output
    with open("out.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["Title", "Description", "label"] + [f"probability_{name}" for name in NAMES]
    assert len(rows) == 3 and {row["label"] for row in rows} <= set(NAMES)
    # Plain lines: the columns separated by a tab. The model reads the template's one text, not a pair.
    title, description = rows[0]["Title"], rows[0]["Description"]
    result = runner.invoke(app, ["predict", checkpoint], input=f"{title}\t{description}\n")
    assert result.exit_code == 0, result.output
    predicted = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    assert predicted["Title"] == title and predicted["label"] == rows[0]["label"]
    spec = task_spec(load_recipe(f"{checkpoint}/finetune_recipe.yaml", check_paths=False).task)
    model, tokenizer = load_finetuned(checkpoint, spec).eval(), AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        logits = model(**tokenizer(f"{title}. {description}", truncation=True, max_length=24, return_tensors="pt"))
    expected = torch.softmax(logits.logits[0].double(), dim=-1).tolist()
    assert list(predicted["probabilities"].values()) == pytest.approx(expected)
    assert finetune.predict(checkpoint, [(title, description)])[0]["probabilities"] == predicted["probabilities"]


def test_eval_writes_label_names_and_names_a_file_without_labels(news_run, monkeypatch):
    monkeypatch.chdir(news_run)
    recipe = (
        "stage: eval\nrun_dir: runs/news-eval\ntask: {name: news, data_dir: data/news, text: '{Title}. "
        "{Description}', label_column: Class Index, labels: [1, 2, 3, 4], label_names: {1: World, 2: Sports, "
        "3: Business, 4: Sci/Tech}}\nsplit: dev\nwrite_predictions: true\nmodels: {news: runs/news/checkpoint}\n"
    )
    Path("eval.yaml").write_text(recipe, encoding="utf-8")
    result = runner.invoke(app, ["eval", "eval.yaml"])
    assert result.exit_code == 0, result.output
    predictions = Path("runs/news-eval/predictions/news.tsv").read_text(encoding="utf-8").splitlines()
    assert len(predictions) == 9 and {line.split("\t")[1] for line in predictions[1:]} <= set(NAMES)
    result = runner.invoke(
        app, ["eval", "eval.yaml", "split=test", "write_predictions=false", "run_dir=runs/news-test"]
    )
    assert result.exit_code == 2
    assert "the test file data/news/test.csv has no 'Class Index' column" in result.output, result.output
