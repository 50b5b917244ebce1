"""Classification's fine-tuning (and regression's, kinds/regression/): transformers' sequence classifier on the
backbone, its examples read from the task's files with long documents read as task.long_documents says."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from finetune.console import console
from finetune.data.long_documents import WINDOW_DOCUMENT, DocumentReading, classification_loss, windowed_logits
from finetune.data.reverse import reads_backwards, reads_both_directions
from finetune.data.step_batches import REAL_EXAMPLES
from finetune.data.task_batches import task_collator
from finetune.data.task_encoding import EncodedTask
from finetune.data.task_files import read_labelled_split
from finetune.errors import UserError
from finetune.inference.predict import LengthSortedPrediction, logits_loss, logits_to_predictions, predict_logits
from finetune.kinds.calibration import calibrate_checkpoint, keep_best_logits, take_best_logits
from finetune.kinds.classifier_keys import classifier_keys
from finetune.kinds.contrastive import decided_method, read_as_the_sentence_model, train_contrastively
from finetune.kinds.distillation import (
    TEACHER_LOGITS,
    Teacher,
    TeacherTargets,
    distillation_loss,
    hidden_cosine_loss,
    hidden_problem,
    joined,
    last_hidden_states,
    load_teacher,
    saved_targets,
    unlabelled_rows,
    with_teacher_logits,
)
from finetune.kinds.fine_tuning import TaskFineTuning, say
from finetune.models.families import reads_left_to_right
from finetune.models.heads import fitted_max_length, load_classifier
from finetune.reporting.dev_predictions import classifier_rows, row_keys, score_rows
from finetune.tasks.metrics import class_report, compute_metrics
from finetune.training.imbalance import Loss, class_weight_vector, cross_entropy_loss, described_weights, in_place_of
from finetune.training.self_training import PseudoLabelled


class ClassificationFineTuning(TaskFineTuning):
    """Classification (or regression): a class per example, from its text or sentence pair (task kind
    classification), with long documents read as task.long_documents says."""

    plain_loss: Callable = staticmethod(classification_loss)  # the model's own loss, from its logits and labels
    weighted_loss: Loss | None = None  # with class weights or label smoothing: the loss trained instead
    last_dev_logits: np.ndarray | None = None  # of the last dev evaluation, for a kind that calibrates
    predicts_rows = True

    def read_task(self) -> tuple[int, int]:
        """Read the training and dev splits (dev held out of train with task.dev_split, stratified by class);
        returns their sizes."""
        data_dir, spec = self.recipe.task.data_dir, self.spec
        by_class = spec.labels is not None and not spec.label_sets and not spec.is_regression
        self.train_examples, self.dev_examples = self.train_and_dev(
            lambda split: read_labelled_split(spec, data_dir, split),
            (lambda examples: examples.labels) if by_class else None,
        )
        self.weighted_loss = self.loss_of_the_recipe()
        self.dev_keys = row_keys(self.dev_examples.texts)  # what pairs two runs' predictions of a dev row
        if (distillation := self.recipe.distillation) is not None:
            batch = self.recipe.training.batch_size * 2
            self.teacher = load_teacher(distillation.teacher, self.spec, batch, self.kind.predictor)
            self.teacher.predictor.model.to(self.accelerator.device)  # hidden_weight runs it beside the student
        return len(self.train_examples.texts), len(self.dev_examples.texts)

    def training_method(self):
        """method auto decided on the training labels (kinds/method.py), and the recipe the method trains with
        (with a teacher: plain, the rows of unlabelled_text having no class to pair by)."""
        recipe = self.recipe
        if self.teacher is not None and recipe.method == "auto":
            recipe = recipe.model_copy(update={"method": "plain"})
        recipe, self.method = decided_method(recipe, self.spec, self.train_examples.labels)
        return recipe

    def before_training(self, model, train_data, collate) -> None:
        """Method contrastive: the encoder trained on pairs of the training rows, the head by logistic regression."""
        if self.method is not None and self.method.method == "contrastive":
            # Classes or labels: decided_method checked.
            assert self.train_examples.labels is not None and self.spec.labels is not None
            self.method_records = tuple(
                train_contrastively(
                    self.recipe,
                    model,
                    self.groups,
                    train_data,
                    collate,
                    self.train_examples.labels,
                    self.spec.labels,
                    self.accelerator.device,
                )
            )

    def loss_of_the_recipe(self) -> Loss | None:
        """The cross-entropy with training.class_weights (balanced: from the training labels) and
        training.label_smoothing; None when neither is set."""
        training, spec = self.recipe.training, self.spec
        weights = None
        if training.class_weights is not None:
            assert spec.labels is not None and self.train_examples.labels is not None  # kind classification
            weights = class_weight_vector(
                training.class_weights, spec.labels, self.train_examples.labels, spec.file_labels
            )
            say(f"class weights in the cross-entropy: {described_weights(spec.labels, weights)}")
        return cross_entropy_loss(weights, training.label_smoothing)

    def task_model(self):
        """The backbone with its task head, and how it reads an example (max_length, long documents)."""
        recipe = self.recipe
        with classifier_keys():
            model = load_classifier(recipe.model, self.spec, recipe.classifier_dropout, recipe.pooling)
        if self.method is not None and self.method.method == "contrastive":
            read_as_the_sentence_model(model, recipe.model.checkpoint)
        if recipe.task.both_orders and not adds_orders_exactly(model):
            raise UserError(
                f"task.both_orders: GPT's similarity transformation adds the two orders' representations "
                f"before a linear head; {recipe.model.checkpoint} is a '{model.config.model_type}' "
                "classifier, whose head is not one (use a decoder backbone: gpt2, llama, qwen2, ...)"
            )
        self.reading = DocumentReading.of(
            fitted_max_length(recipe.task.max_length, model), recipe.task.long_documents, recipe.task.both_orders
        )
        return model

    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        """The encoded training examples (with their `lengths`), how to collate them, and the dev batches."""
        # A backward LM's classifier reads its text backwards too; a bidirectional one (two LMs) both ways.
        directions = {
            "backwards": reads_backwards(model.config),
            "both_directions": reads_both_directions(model.config),
        }
        console.print(f"the classifier {self.reading.describe()}", markup=False, highlight=False, soft_wrap=True)
        if self.pseudo_labelled is not None:  # after the method and class weights were decided on the labelled rows
            self.join_pseudo_labelled(self.pseudo_labelled)
        if self.teacher is not None:  # the teacher reads the texts, which go below
            self.check_hidden_states(model)
            self.teacher_targets = self.targets_of_the_teacher(self.teacher)
        train_data = EncodedTask(self.train_examples, self.tokenizer, self.reading, **directions, name="training")
        # The token ids are all that training reads from here on: the texts (~1.8x the file's size) go now, not at
        # the end of the run. The labels stay (the class weights read them).
        self.train_examples = replace(self.train_examples, texts=[], ids=[])
        note = gradient_window_note(model.config, train_data.lengths, whole=self.reading.max_length is None)
        if note:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        self.dev_batches = LengthSortedPrediction(
            EncodedTask(self.dev_examples, self.tokenizer, self.reading, **directions, name="dev"),
            self.tokenizer,
            self.recipe.training.batch_size * 2,
        )
        collate = task_collator(self.tokenizer, train_data)
        if self.teacher_targets is not None:  # each row's teacher logits travel with it into its batch
            taught = TeacherTargets(train_data, self.teacher_targets)
            return taught, with_teacher_logits(collate), self.dev_batches.loader
        return train_data, collate, self.dev_batches.loader

    def check_hidden_states(self, model) -> None:
        """distillation.hidden_weight compares the two models' hidden states token by token: refused where it
        cannot."""
        config = self.recipe.distillation
        if self.teacher is None or config is None or config.hidden_weight == 0:
            return
        predictor = self.teacher.predictor
        problem = hidden_problem(predictor.model, predictor.tokenizer, model, self.tokenizer)
        if problem is not None:
            raise UserError(f"distillation.hidden_weight: {problem}; set it to 0")

    def targets_of_the_teacher(self, teacher: Teacher) -> np.ndarray:
        """The teacher's logits of every training row, the rows of unlabelled_text joined after the labelled ones
        (read back from the run folder on --resume: the same targets); its scores on the dev rows."""
        if self.distill_unlabelled is not None and len(self.distill_unlabelled.texts):
            extra = unlabelled_rows(self.distill_unlabelled, self.spec)
            say(f"distillation: the teacher labels {len(extra.texts):,} rows of unlabelled_text too")
            self.train_examples = joined(self.train_examples, extra)
        self.teacher_dev = self.teacher_scores(teacher.dev_logits(self.dev_examples), teacher)
        scores = ", ".join(f"{name.removeprefix('dev_')} {value:.4f}" for name, value in self.teacher_dev.items())
        say(f"distillation: teacher {teacher.folder}, on this run's dev rows: {scores}")
        rows = len(self.train_examples.texts)
        saved = saved_targets(self.recipe.run_dir, rows) if self.resuming else None
        # None: no line on rows longer than max_length: the student's EncodedTask says it of the same rows.
        return saved if saved is not None else teacher.logits(self.train_examples, None)

    def join_pseudo_labelled(self, rows: PseudoLabelled) -> None:
        """The pseudo-labelled rows after the labelled ones; resumed, they must be those the round started with."""
        assert self.spec.labels is not None  # kind classification: its classes
        if self.resuming:
            rows.check_recorded(self.recipe.run_dir, self.spec.text_columns, self.spec.labels)
        labelled = len(self.train_examples.texts)
        self.train_examples = rows.joined(self.train_examples)
        say(f"self-training: {len(rows.texts):,} pseudo-labelled rows join the {labelled:,} labelled ones")

    def teacher_scores(self, logits: np.ndarray, teacher: Teacher) -> dict[str, float]:
        """The teacher's scores of its dev `logits`, as evaluate() scores the run's own."""
        predictions = logits_to_predictions(self.spec, logits)
        return {
            f"dev_{name}": value for name, value in compute_metrics(self.spec, predictions, self.dev_labels()).items()
        }

    def start(self, context) -> None:
        super().start(context)
        rows = self.pseudo_labelled
        if rows is not None and not context.resumed and self.accelerator.is_main_process:
            assert self.spec.labels is not None
            rows.write(context.run_dir, self.spec.text_columns, self.spec.labels)
            context.log.write(rows.record)

    def splits_by_length(self, train_data) -> bool:
        return train_data.windows is None  # a document's windows stay together (WindowCollator)

    def _loss(self, model, batch):
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        if TEACHER_LOGITS in batch:
            return self._distillation_loss(model, batch), examples, examples
        if WINDOW_DOCUMENT in batch:  # chunks: the loss of each document's pooled logits, not of its windows
            logits = windowed_logits(model, batch, self.reading.pool)
            return (self.weighted_loss or self.plain_loss)(logits, batch["labels"]), examples, examples
        output = model(**batch)
        if self.weighted_loss is None:
            return output.loss, examples, examples
        logits, labels = output.logits, batch["labels"]
        loss = in_place_of(output.loss, self.plain_loss(logits, labels), self.weighted_loss(logits, labels))
        return loss, examples, examples

    def _distillation_loss(self, model, batch):
        """The soft targets' loss mixed with the hard labels' (kinds/distillation.py), and with hidden_weight
        DistilBERT's cosine loss between the two models' last hidden states."""
        teacher, labels = batch.pop(TEACHER_LOGITS), batch.pop("labels")
        config = self.recipe.distillation
        aligned = config.hidden_weight > 0 and self.teacher is not None
        capture: contextlib.AbstractContextManager[list[torch.Tensor]] = (
            last_hidden_states(self.accelerator.unwrap_model(model)) if aligned else contextlib.nullcontext([])
        )
        with capture as states:
            if WINDOW_DOCUMENT in batch:
                logits = windowed_logits(model, batch, self.reading.pool)
            else:
                logits = model(**batch).logits
        hard = self.weighted_loss or self.plain_loss
        loss = distillation_loss(logits, teacher, labels, hard, config.temperature, config.soft_weight)
        if aligned:
            assert self.teacher is not None
            inputs = {key: value for key, value in batch.items() if key != WINDOW_DOCUMENT}
            teacher_model = self.teacher.predictor.model
            with torch.no_grad(), last_hidden_states(teacher_model) as teacher_states:
                teacher_model(**inputs)
            mask = inputs.get("attention_mask")
            loss = loss + config.hidden_weight * hidden_cosine_loss(states[-1], teacher_states[-1], mask)
        return loss

    def dev_logits(self) -> np.ndarray:
        """The model's logits (or scores) for the dev examples, in file order."""
        return self.dev_batches.in_file_order(
            predict_logits(self.accelerator, self.model, self.dev_loader, self.reading.pool)
        )

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Dev scores, and the dev loss for metrics.jsonl (the loss plot) only."""
        logits = self.dev_logits()
        if self.recipe.task.calibrations:  # the saved weights' are what calibration fits (kinds/calibration.py)
            self.last_dev_logits = logits
        predictions, labels = logits_to_predictions(self.spec, logits), self.dev_labels()
        scores = {f"dev_{name}": value for name, value in compute_metrics(self.spec, predictions, labels).items()}
        if self.spec.labels is not None:  # classes, not a regression score
            self.last_classes = class_report(self.spec.labels, predictions, labels)
            probabilities = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
            self.last_predictions = classifier_rows(self.dev_keys, self.spec.labels, labels, predictions, probabilities)
        else:
            self.last_predictions = score_rows(self.dev_keys, labels, predictions)
        return scores, {"validation_loss": logits_loss(self.spec, logits, labels)}

    def on_new_best(self, loop, control) -> None:
        super().on_new_best(loop, control)
        if self.recipe.keep_best and self.accelerator.is_main_process and self.last_dev_logits is not None:
            keep_best_logits(self.best_dir, self.last_dev_logits)

    def calibration(self, checkpoint: Path) -> dict | None:
        """The calibration of the saved weights' dev probabilities (the recipe's method, or none: measured only)."""
        if not self.recipe.task.calibrations:
            return None
        main = self.accelerator.is_main_process
        if self.recipe.keep_best:
            logits = take_best_logits(checkpoint) if main else None
            if logits is None and main:
                say("calibration: skipped (the best weights were saved without their dev logits, by an older version)")
        else:  # the last weights; a run resumed after its last evaluation has not computed their logits yet
            logits = self.last_dev_logits if self.last_dev_logits is not None else self.dev_logits()
        if logits is None or not main:
            return None
        return calibrate_checkpoint(self.recipe.calibration, checkpoint, logits, self.dev_labels())

    def dev_labels(self) -> np.ndarray:
        """The dev split's labels (read_labelled_split refuses a split without them)."""
        assert self.dev_examples.labels is not None
        return self.dev_examples.labels


def adds_orders_exactly(model) -> bool:
    """Whether adding a classifier's logits of the two orders of a pair is adding their representations before its
    head, as GPT's similarity transformation does: a decoder (its state at the last token) under a linear head
    without bias (GPT-2's and Llama's `score`)."""
    head = getattr(model, "score", None)
    return reads_left_to_right(model.config) and isinstance(head, torch.nn.Linear) and head.bias is None


def gradient_window_note(config, lengths: list[int], whole: bool = True) -> str | None:
    """For a classifier that reads documents in chunks with a bounded gradient (the AWD-LSTM's BPT3C): how much of
    the training documents it reads (`whole`: every token, no task.max_length), and how many are longer than the
    tokens its gradients reach."""
    window = getattr(config, "classifier_max_len", None)
    if window is None or not lengths:
        return None
    sizes = np.asarray(lengths)
    longer = int((sizes > window).sum())
    reach = (
        f"; gradients reach the encoder through the last {window:,} tokens of each ({longer:,} documents are "
        "longer: their start is read, not trained through)"
        if longer
        else ""
    )
    median = np.median(sizes)
    return (
        f"the classifier reads {'every token of ' if whole else ''}the {len(sizes):,} training examples (median "
        f"{median:,.0f}, longest {sizes.max():,} tokens{'' if whole else ' as task.max_length leaves them'}), "
        f"{config.classifier_bptt} at a time (BPT3C){reach}"
    )
