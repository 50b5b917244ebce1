"""`finetune finetune` for task kind choices: the right answer among each question's choices (ARC's layout)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch.utils.data import DataLoader, Dataset

from finetune.console import console
from finetune.data.step_batches import REAL_EXAMPLES
from finetune.data.task_files import task_file
from finetune.errors import recipe_key
from finetune.kinds.choices.data import collate_choices, read_choices
from finetune.kinds.choices.model import load_choice_model
from finetune.kinds.choices.training import choice_loss, encoded_questions, question_probabilities
from finetune.kinds.fine_tuning import TaskFineTuning
from finetune.models.heads import fitted_max_length
from finetune.tasks.metrics import compute_metrics


class ChoicesFineTuning(TaskFineTuning):
    """`finetune finetune` for a task of kind choices: a score per choice, a softmax over each question's own
    choices (3, 4 and 5 of them mix in a batch), trained with the classifier's machinery."""

    def read_task(self) -> tuple[int, int]:
        data_dir = self.recipe.task.data_dir
        self.train_questions, self.dev_questions = self.train_and_dev(
            lambda split: read_choices(task_file(self.spec, data_dir, split))
        )
        return len(self.train_questions.ids), len(self.dev_questions.ids)

    def task_model(self):
        with recipe_key("model.checkpoint"):
            model = load_choice_model(self.recipe.model, self.recipe.classifier_dropout)
        self.max_length = fitted_max_length(self.recipe.task.max_length, model)
        return model

    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        console.print(
            f"the model reads at most {self.max_length} tokens of a question with one of its choices",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        train_data = encoded_questions(model, self.tokenizer, self.train_questions, self.max_length)
        dev_data = encoded_questions(model, self.tokenizer, self.dev_questions, self.max_length)
        collate = collate_choices(self.tokenizer.pad_token_id)
        # Every process scores the whole dev set from a loader of its own (accelerate shares out the one returned).
        self.choices_dev_loader = DataLoader(
            dev_data, batch_size=self.recipe.training.batch_size * 2, collate_fn=collate
        )
        return train_data, collate, self.choices_dev_loader

    def _loss(self, model, batch):
        """The mean cross-entropy over the batch's questions, each over its own choices: a term per question."""
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        return choice_loss(model, batch, self.recipe.training.label_smoothing), examples, examples

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Dev accuracy, and the dev loss (mean over questions) for metrics.jsonl only."""
        model = self.accelerator.unwrap_model(self.model)
        probabilities, loss = question_probabilities(
            model, self.choices_dev_loader, self.accelerator.device, with_loss=True
        )
        predicted = [int(row.argmax()) for row in probabilities]
        scores = compute_metrics(self.spec, np.asarray(predicted), np.asarray(self.dev_questions.answers))
        return {f"dev_{name}": scores[name] for name in self.spec.metrics}, {"validation_loss": loss}
