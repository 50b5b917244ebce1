"""Prediction runs longest-first in batches and gives every example its own output, in file order."""

from __future__ import annotations

import random

import numpy as np
import torch
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.commands.evaluate import predict
from finetune.data.examples import TaskExamples
from finetune.data.task_encoding import EncodedTask
from finetune.inference.predict import LengthSortedPrediction, predict_logits
from finetune.tasks.specs import TaskSpec
from tests.conftest import make_sentence, save_tiny_masked_lm

SPEC = TaskSpec(
    name="custom", text_columns=("sentence",), label_column="label", labels=("a", "b", "c"), metrics=("accuracy",)
)


def varied_examples(count: int = 37) -> TaskExamples:
    rng = random.Random(5)
    texts = [
        (" ".join(make_sentence(rng, rng.random() < 0.5) for _ in range(rng.randint(1, 4))),) for _ in range(count)
    ]
    return TaskExamples(
        texts=texts, labels=np.array([index % 3 for index in range(count)]), ids=[str(index) for index in range(count)]
    )


def test_loader_runs_longest_first_and_restores_file_order(tmp_path):
    checkpoint = save_tiny_masked_lm(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    encoded = EncodedTask(varied_examples(), tokenizer, 32)
    batches = LengthSortedPrediction(encoded, tokenizer, batch_size=8)
    lengths = [len(item["input_ids"]) for item in batches.loader.dataset]
    assert lengths == sorted(encoded.lengths, reverse=True) and len(set(lengths)) > 3
    assert next(batch["input_ids"].shape[1] for batch in batches.loader) == max(encoded.lengths)
    outputs = np.arange(len(encoded))[:, None] * 1.0  # the loader's k-th output is k
    assert batches.in_file_order(outputs)[:, 0].tolist() == np.argsort(batches.order).tolist()


def test_batched_predictions_equal_one_example_at_a_time(tmp_path):
    checkpoint = save_tiny_masked_lm(tmp_path)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=3).eval()
    with torch.no_grad():  # a head that tells the rows apart (a fresh one gives every row nearly the same logits)
        model.classifier.weight.normal_(0, 30)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    examples = varied_examples()
    accelerator = Accelerator(cpu=True)
    encoded = EncodedTask(examples, tokenizer, 32)

    def one_at_a_time() -> np.ndarray:  # no padding at all: each example alone
        with torch.no_grad():
            return np.stack(
                [
                    model(**{key: torch.tensor([values]) for key, values in encoded[index].items() if key != "labels"})
                    .logits[0]
                    .numpy()
                    for index in range(len(encoded))
                ]
            )

    with torch.no_grad():  # centred logits, so that the rows' classes differ
        model.classifier.bias -= torch.from_numpy(one_at_a_time().mean(axis=0))
    alone = one_at_a_time()
    batches = LengthSortedPrediction(encoded, tokenizer, batch_size=8)
    batched = batches.in_file_order(predict_logits(accelerator, model, batches.loader))
    np.testing.assert_allclose(batched, alone, rtol=1e-4, atol=1e-4)
    assert np.ptp(alone, axis=0).min() > 0.05  # far apart compared with the tolerance
    assert len(set(alone.argmax(axis=1))) > 1  # the classes differ between rows, so a mix-up would show
    assert predict(accelerator, model, tokenizer, SPEC, examples, 32, 8).tolist() == alone.argmax(axis=1).tolist()
