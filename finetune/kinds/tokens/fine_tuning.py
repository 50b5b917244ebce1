"""`finetune finetune` for task kind tokens: a tag per word (named entities, parts of speech), from CoNLL files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import DataCollatorForTokenClassification

from finetune.console import console
from finetune.data.step_batches import REAL_EXAMPLES
from finetune.errors import recipe_key
from finetune.kinds.distillation import (
    TEACHER_LOGITS,
    TeacherTargets,
    load_teacher,
    saved_targets,
    tagged_word_targets,
    tagging_distillation_loss,
    with_teacher_logits,
)
from finetune.kinds.fine_tuning import TaskFineTuning, say
from finetune.kinds.tokens.data import IGNORED, EncodedTagging, read_tagged_split, tag_set
from finetune.kinds.tokens.metrics import entity_types_table, tagging_metrics
from finetune.kinds.tokens.model import load_tagger
from finetune.kinds.tokens.training import sentence_logits
from finetune.models.families import reads_left_to_right
from finetune.models.heads import fitted_max_length
from finetune.reporting.class_report import classes_of


class TaggingFineTuning(TaskFineTuning):
    """`finetune finetune` for a task of kind tokens (see the module docstring)."""

    def read_task(self) -> tuple[int, int]:
        data_dir = self.recipe.task.data_dir
        self.train_sentences, self.dev_sentences = self.train_and_dev(
            lambda split: read_tagged_split(self.spec, data_dir, split)
        )
        tags = self.spec.labels or tag_set(self.train_sentences)  # the recipe's task.labels, else the training file's
        self.tags = tuple(tags)
        self.spec = replace(self.spec, labels=self.tags)
        if (distillation := self.recipe.distillation) is not None:  # its tags must be these, in this order
            batch = self.recipe.training.batch_size * 2
            self.teacher = load_teacher(distillation.teacher, self.spec, batch, self.kind.predictor)
        return len(self.train_sentences.words), len(self.dev_sentences.words)

    def task_model(self):
        with recipe_key("model.checkpoint"):
            model = load_tagger(self.recipe.model, self.tags, self.recipe.classifier_dropout)
        self.max_length = fitted_max_length(self.recipe.task.max_length, model)
        return model

    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        reads = (
            "every token of a sentence"
            if self.max_length is None
            else f"at most {self.max_length} tokens of a sentence"
        )
        console.print(
            f"the tagger reads {reads}; {len(self.tags)} tags: {', '.join(self.tags)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        last = reads_left_to_right(model.config)  # then each word's tag sits on its last token
        train_data = EncodedTagging(self.train_sentences, self.tokenizer, self.max_length, self.tags, last_token=last)
        tagged = sum(sum(label != IGNORED for label in item["labels"]) for item in train_data.items)
        self.words_per_sentence = max(tagged, 1) / max(len(train_data.items), 1)  # see _loss
        self.dev_data = EncodedTagging(
            self.dev_sentences, self.tokenizer, self.max_length, self.tags, "dev", last_token=last
        )
        collate = DataCollatorForTokenClassification(self.tokenizer, label_pad_token_id=IGNORED)
        # Every process scores the whole dev set (sentences of any length do not gather across processes), from a
        # loader of its own: accelerate would share the one returned here out among them.
        self.tagging_dev_loader = DataLoader(
            self.dev_data, batch_size=self.recipe.training.batch_size * 2, collate_fn=collate
        )
        if self.teacher is not None:  # each sentence's targets, of the words this model tags, travel with it
            self.teacher_targets = self.targets_of_the_teacher(self.teacher, train_data)
            taught = TeacherTargets(train_data, self.teacher_targets)
            return taught, with_teacher_logits(collate), self.tagging_dev_loader
        return train_data, collate, self.tagging_dev_loader

    def targets_of_the_teacher(self, teacher, train_data: EncodedTagging) -> np.ndarray:
        """The teacher's logits of each training word this model tags (read back from the run folder on --resume);
        its entity-level scores on the dev sentences."""
        dev_words = teacher.predictor.word_logits(self.dev_sentences, "dev")
        predicted = [[self.tags[int(index)] for index in np.nan_to_num(words).argmax(-1)] for words in dev_words]
        predicted = [["O" if np.isnan(row).any() else tag for row, tag in zip(words, tags)]
                     for words, tags in zip(dev_words, predicted)]  # fmt: skip
        assert self.dev_sentences.tags is not None
        scores = tagging_metrics(self.dev_sentences.tags, predicted)
        self.teacher_dev = {f"dev_{name}": scores[name] for name in self.spec.metrics}
        shown = ", ".join(f"{name.removeprefix('dev_')} {value:.4f}" for name, value in self.teacher_dev.items())
        say(f"distillation: teacher {teacher.folder}, on this run's dev sentences: {shown}")
        rows = len(train_data.items)
        saved = saved_targets(self.recipe.run_dir, rows) if self.resuming else None
        if saved is not None:
            return saved
        return tagged_word_targets(teacher.predictor.word_logits(self.train_sentences), train_data.word_positions)

    def splits_by_length(self, train_data) -> bool:
        return True

    def batching_note(self, grouped: bool) -> str | None:
        """Grouped batches cost taggers quality on CoNLL-2003 (its short lines, headlines and datelines, differ in
        content from its long ones): said at the start of the run, with the batching that does not."""
        if not grouped:
            return None
        return (
            "grouped batches: taggers on CoNLL-2003 scored below shuffled batches with them (dev F1 -3.9 at 2,000 "
            "sentences over 5 seeds, test F1 -0.7 at all 14,041 in one); training.group_by_length=false trains on "
            "shuffled batches, at nearly grouped speed where the model skips padding (training.skip_padding: BERT "
            "family), else with training.split_by_length=true at 1.65x their speed (docs/finetuning.md)"
        )

    def _loss(self, model, batch):
        """The summed cross-entropy of the batch's tagged words (first sub-tokens) over its sentences' expected
        word count (sentences x the training set's mean tagged words a sentence), counted as that many terms.

        Not the mean over the batch's own words: batches grouped by length (training.group_by_length) hold 32
        four-word headlines or 32 forty-word sentences, and a per-batch mean would give a headline's word ten
        times the weight of a long sentence's. Over expected words every word weighs alike, as in shuffled
        batches (the gradient of a batch of long sentences is larger, of short ones smaller). CoNLL-2003 test F1
        with grouped batches, one seed each (bench/README.md): 84.3 with the per-batch mean, 84.6 with this; 85.3
        with shuffled batches.
        """
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        teacher = batch.pop(TEACHER_LOGITS, None)
        logits = model(**{key: value for key, value in batch.items() if key != "labels"}).logits
        summed = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORED, reduction="sum"
        )
        if teacher is not None:  # distillation: the teacher's soft targets of the same words, mixed in
            config = self.recipe.distillation
            soft = tagging_distillation_loss(logits, teacher, batch["labels"], config.temperature)
            summed = config.soft_weight * soft + (1 - config.soft_weight) * summed
        terms = examples * self.words_per_sentence
        return summed / max(terms, 1e-9), terms, examples

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Entity-level dev scores, and the dev loss (mean over tagged words) for metrics.jsonl only."""
        model = self.accelerator.unwrap_model(self.model)
        logits, loss = sentence_logits(model, self.tagging_dev_loader, self.accelerator.device, with_loss=True)
        predicted = self.dev_data.word_tags(logits, self.tags)
        assert self.dev_sentences.tags is not None  # read_conll reads the tags (with_tags) or refuses the file
        scores = tagging_metrics(self.dev_sentences.tags, predicted)
        table = entity_types_table(self.dev_sentences.tags, predicted)  # per entity type, seqeval's
        self.last_classes = classes_of(table, "entities")
        return {f"dev_{name}": scores[name] for name in self.spec.metrics}, {"validation_loss": loss}
