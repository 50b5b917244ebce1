"""A fine-tuned classifier ready to predict (`finetune predict`, `finetune.predict`): a label and a probability per
class of each example, calibrated when the checkpoint keeps a temperature (regression's, kinds/regression/predictor.py,
a score)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from finetune.data.examples import TaskExamples
from finetune.data.long_documents import DocumentReading
from finetune.errors import UserError
from finetune.inference.calibration import calibrated_probabilities, temperature_of
from finetune.inference.predict import example_logits
from finetune.kinds.predictor import TextPredictor
from finetune.tasks.specs import TaskSpec


@dataclass
class Predictor(TextPredictor):
    """A fine-tuned checkpoint ready to predict: its model, tokenizer, task and how it reads an example."""

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec
    reading: DocumentReading  # task.max_length and task.long_documents, as the checkpoint was trained
    batch_size: int = 64

    def predict(self, texts: Sequence[str | Sequence[str]]) -> list[dict]:
        """One result per example: {"label", "probabilities"} ({"score"}: regression's); a task of several text
        columns takes a tuple of its columns' texts."""
        examples = TaskExamples(
            [self._example(text, index) for index, text in enumerate(texts)],
            None,
            [str(index) for index in range(len(texts))],
        )
        return self.predict_examples(examples)

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        """Results for examples already read (the texts of the task's columns, in its column order)."""
        if not examples.texts:
            return []
        return self.results(self.logits(examples))

    def logits(self, examples: TaskExamples, name: str | None = "input") -> np.ndarray:
        """The model's logits of examples already read, in their order (`name`: what the line on examples longer
        than max_length calls them)."""
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=not torch.cuda.is_available())
        examples = replace(examples, texts=[self.spec.model_texts(texts) for texts in examples.texts])
        return example_logits(accelerator, self.model, self.tokenizer, examples, self.reading, self.batch_size, name)

    def class_probabilities(self, examples: TaskExamples, name: str = "input") -> np.ndarray:
        """Each example's probability of each class (rows in the examples' order, columns in label order), calibrated
        as `results` gives them."""
        return calibrated_probabilities(self.logits(examples, name), temperature_of(self.model.config))

    def results(self, logits: np.ndarray) -> list[dict]:
        """One result per row of logits: the label of the highest and every class's probability, softmax(logits /
        T) with the temperature the checkpoint was calibrated with (recipe key calibration; T = 1 without)."""
        labels = self.spec.labels
        assert labels is not None  # a classification spec has its classes (kinds/classification/recipe.py)
        probabilities = calibrated_probabilities(logits, temperature_of(self.model.config))
        return [
            {"label": labels[int(row.argmax())], "probabilities": {label: float(p) for label, p in zip(labels, row)}}
            for row in probabilities
        ]

    def _example(self, text: str | Sequence[str], index: int) -> tuple[str, ...]:
        columns = self.spec.text_columns
        parts = (text,) if isinstance(text, str) else tuple(text)
        if len(parts) != len(columns) or not all(isinstance(part, str) for part in parts):
            raise UserError(
                f"example {index}: task '{self.spec.name}' reads {len(columns)} text(s) "
                f"({', '.join(columns)}), got {parts!r:.80}"
            )
        return parts
