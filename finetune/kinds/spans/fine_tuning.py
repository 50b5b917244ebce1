"""`finetune finetune` for task kind spans: extractive question answering on SQuAD v1.1 / v2.0 JSON files."""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import DataLoader, Dataset
from transformers import DataCollatorWithPadding

from finetune.console import console
from finetune.data.step_batches import REAL_EXAMPLES
from finetune.data.task_files import task_file
from finetune.errors import recipe_key
from finetune.kinds.fine_tuning import TaskFineTuning
from finetune.kinds.spans.data import EncodedSpans, SpanReading, read_squad
from finetune.kinds.spans.metrics import squad_scores
from finetune.kinds.spans.model import load_qa_model
from finetune.kinds.spans.training import best_answers, gold_answers, span_max_length, window_logits


class SpansFineTuning(TaskFineTuning):
    """`finetune finetune` for extractive question answering (task kind spans): SQuAD JSON files, each window of a
    question's context one training example (its answer's first and last token, or [CLS]); dev scores are SQuAD's
    F1 (choosing the best checkpoint) and exact match over questions, after post-processing (kinds/spans/training.py).
    A model trained on a file with unanswerable questions (SQuAD 2.0) may answer nothing."""

    def read_task(self) -> tuple[int, int]:
        data_dir = self.recipe.task.data_dir
        self.train_questions, self.dev_questions = self.train_and_dev(
            lambda split: read_squad(task_file(self.spec, data_dir, split))
        )
        # SQuAD 2.0-style data (unanswerable questions in training) makes a model that may answer nothing.
        self.no_answer = self.train_questions.has_unanswerable
        return len(self.train_questions.questions), len(self.dev_questions.questions)

    def task_model(self):
        with recipe_key("model.checkpoint"):
            model = load_qa_model(self.recipe.model, self.no_answer)
        self.span_reading = SpanReading.of(self.recipe.task, span_max_length(self.recipe.task.max_length, model))
        return model

    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        reading = self.span_reading
        train_data = EncodedSpans(self.train_questions, self.tokenizer, reading)
        self.dev_data = EncodedSpans(self.dev_questions, self.tokenizer, reading)
        console.print(
            f"the model {reading.describe()}: {len(train_data):,} training and {len(self.dev_data):,} dev "
            f"windows; {'answers or no answer (SQuAD 2.0)' if self.no_answer else 'always answers'}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        collate = DataCollatorWithPadding(self.tokenizer)
        # Every process scores the whole dev set (a question's windows must meet), from a loader of its own:
        # accelerate would share the one returned here out among them.
        self.spans_dev_loader = DataLoader(
            self.dev_data, batch_size=self.recipe.training.batch_size * 2, collate_fn=collate
        )
        return train_data, collate, self.spans_dev_loader

    def _loss(self, model, batch):
        """The model's loss (the mean of the start and end cross-entropies) over the batch's windows."""
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        return model(**batch).loss, examples, examples

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """SQuAD's F1 and exact match over the dev questions; the dev loss (mean over windows) and, for SQuAD
        2.0-style dev data, the HasAns / NoAns scores for metrics.jsonl only."""
        model = self.accelerator.unwrap_model(self.model)
        starts, ends, loss = window_logits(model, self.spans_dev_loader, self.accelerator.device, with_loss=True)
        answers = best_answers(self.dev_data, starts, ends, self.span_reading, self.no_answer)
        scores = squad_scores(gold_answers(self.dev_questions), [answer.text for answer in answers])
        extras = {
            f"dev_{name}": value
            for name, value in scores.items()
            if name.startswith(("HasAns_", "NoAns_")) and not name.endswith("_total")
        }
        return {f"dev_{name}": scores[name] for name in self.spec.metrics}, {"validation_loss": loss, **extras}
