"""GPT's similarity transformation (`task.both_orders`): a pair read as (a, b) and (b, a), the two representations
added before the linear head, in training, eval and predict alike, so a prediction is the same for either order."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.predict import predict
from finetune.data.corpus import read_documents
from finetune.data.examples import TaskExamples
from finetune.data.long_documents import DocumentReading, windowed_logits
from finetune.data.task_batches import task_collator
from finetune.data.task_encoding import EncodedTask
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.training.checkpoints import save_checkpoint
from tests.conftest import NEGATIVE, POSITIVE, one_error_line, save_tiny_masked_lm, write_corpus, write_yaml

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpt2")
    tokenizer = train_byte_level_bpe(read_documents([write_corpus(folder / "corpus")]), 300, min_frequency=1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=2,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    )
    return save_checkpoint(model, tokenizer, folder / "checkpoint")


@pytest.fixture(scope="module")
def pair_task(tmp_path_factory) -> Path:
    """Two short reviews; label 1 when both are positive or both negative (a symmetric relation)."""
    folder = tmp_path_factory.mktemp("pairs")
    rng = random.Random(3)
    for split, rows in (("train", 64), ("dev", 24)):
        lines = ["first\tsecond\tlabel"]
        for _ in range(rows):
            a, b = rng.random() < 0.5, rng.random() < 0.5
            words = [rng.choice(POSITIVE if side else NEGATIVE) for side in (a, b)]
            lines.append(f"the film was {words[0]} .\tthe plot was {words[1]} .\t{int(a == b)}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def pair_recipe(checkpoint: Path, task: Path, run_dir: Path, **task_keys) -> dict:
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"checkpoint": str(checkpoint)},
        "task": {
            "name": "same-sentiment",
            "data_dir": str(task),
            "text_columns": ["first", "second"],
            "label_column": "label",
            "labels": ["0", "1"],
            "max_length": 32,
            "both_orders": True,
            **task_keys,
        },
        "training": {"epochs": 2, "batch_size": 8, "lr": 1e-3, "log_every": 4, "device": "cpu"},
    }


def test_a_pair_is_one_document_of_both_orders(tiny_gpt2):
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    examples = TaskExamples([("the film was great .", "the plot was dull .")], np.array([1]), ["0"])
    encoded = EncodedTask(examples, tokenizer, DocumentReading.of(32, None, both_orders=True))
    item = encoded[0]
    first, second = (tokenizer.decode(ids) for ids in item["input_ids"])
    assert first == "the film was great .the plot was dull ." and second == "the plot was dull .the film was great ."
    assert item["labels"] == 1 and len(encoded) == 1


def test_summed_logits_are_the_head_of_the_summed_representations(tiny_gpt2):
    """GPT's transformation adds the two orders' last-token states before the linear head; with GPT-2's head (no
    bias) adding the logits is exactly that."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    tokenizer.pad_token = tokenizer.eos_token
    model = GPT2ForSequenceClassification.from_pretrained(tiny_gpt2, num_labels=2, pad_token_id=tokenizer.pad_token_id)
    model.eval()
    examples = TaskExamples(
        [("the film was great .", "the plot was so very dull ."), ("the cast was dull .", "the music was great .")],
        np.array([1, 0]),
        ["0", "1"],
    )
    encoded = EncodedTask(examples, tokenizer, DocumentReading.of(32, None, both_orders=True))
    batch = task_collator(tokenizer, encoded)([encoded[0], encoded[1]])
    with torch.no_grad():
        summed = windowed_logits(model, dict(batch), "sum")
        states = []
        for item in (encoded[0], encoded[1]):
            for ids in item["input_ids"]:
                hidden = model.transformer(torch.tensor([ids])).last_hidden_state[0, -1]
                states.append(hidden)
        by_hand = model.score(torch.stack([states[0] + states[1], states[2] + states[3]]))
    assert torch.allclose(summed, by_hand, atol=1e-5)


@pytest.fixture(scope="module")
def both_orders_run(tmp_path_factory, tiny_gpt2, pair_task) -> Path:
    folder = tmp_path_factory.mktemp("both-orders")
    recipe = write_yaml(folder / "recipe.yaml", pair_recipe(tiny_gpt2, pair_task, folder / "run"))
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "each pair in both orders with their logits added" in result.output
    return folder / "run"


def test_predict_and_eval_read_the_pair_both_ways_as_trained(both_orders_run, pair_task, tmp_path):
    checkpoint = both_orders_run / "checkpoint"
    forward, backward = predict(
        str(checkpoint),
        [("the film was great .", "the plot was dull ."), ("the plot was dull .", "the film was great .")],
    )
    assert forward["probabilities"] == pytest.approx(backward["probabilities"], abs=1e-6)  # either order, one answer
    recipe = write_yaml(
        tmp_path / "eval.yaml",
        {
            "stage": "eval",
            "run_dir": str(tmp_path / "eval"),
            "task": {
                "name": "same-sentiment",
                "data_dir": str(pair_task),
                "text_columns": ["first", "second"],
                "label_column": "label",
                "labels": ["0", "1"],
            },
            "models": {"both": str(checkpoint)},
        },
    )
    assert runner.invoke(app, ["eval", str(recipe)]).exit_code == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    result = json.loads((both_orders_run / "result.json").read_text())
    assert report["results"]["both"]["accuracy"] == pytest.approx(result["best"]["dev_accuracy"])
    assert "both orders" in (checkpoint / "README.md").read_text()


def test_an_encoder_with_a_non_linear_head_is_refused(tmp_path, pair_task):
    bert = save_tiny_masked_lm(tmp_path / "bert")
    recipe = write_yaml(tmp_path / "recipe.yaml", pair_recipe(bert, pair_task, tmp_path / "run"))
    message = one_error_line(runner.invoke(app, ["finetune", str(recipe)]))
    assert (
        "task.both_orders: GPT's similarity transformation adds the two orders' representations before a linear head"
        in message
        and "'bert' classifier" in message
    )


def test_both_orders_needs_a_pair_and_truncation(tmp_path, tiny_gpt2, pair_task):
    data = pair_recipe(tiny_gpt2, pair_task, tmp_path / "run", text="{first} {second}")
    del data["task"]["text_columns"]
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "one.yaml", data))]))
    assert "task.both_orders reads a sentence pair in both orders" in message
    data = pair_recipe(tiny_gpt2, pair_task, tmp_path / "run", long_documents="chunks")
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "two.yaml", data))]))
    assert "both_orders reads a sentence pair twice, each order truncated: not with long_documents chunks" in message


def test_profile_counts_both_orders(tmp_path, tiny_gpt2, pair_task):
    def profiled(both: bool) -> dict:
        data = pair_recipe(tiny_gpt2, pair_task, tmp_path / "run", both_orders=both)
        result = runner.invoke(
            app, ["profile", str(write_yaml(tmp_path / f"{both}.yaml", data)), "--json", "--matmul-gflops", "100"]
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    one, both = profiled(False), profiled(True)
    assert both["compute"]["tokens_per_step"] == 2 * one["compute"]["tokens_per_step"]
    assert both["compute"]["flops_per_step"] == pytest.approx(2 * one["compute"]["flops_per_step"])
