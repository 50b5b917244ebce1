"""`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's three techniques.

The run of every task kind is stages/task_stage.py's (setup -> train -> save); this module holds the command, the
choice of kind (classification here; tagging.py, choices.py, spans.py) and classification's own parts.
With `seeds`, the whole stage runs once per seed and the dev scores are summarised across seeds. `resume=True`
continues from the newest periodic checkpoint (`checkpoint_every`) bit for bit: weights, optimizer,
random states, unfreezing stage, data position, best score so far (and its weights), patience.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from finetune.console import console
from finetune.data.long_documents import WINDOW_DOCUMENT, DocumentReading, classification_loss, windowed_logits
from finetune.data.reverse import reads_backwards, reads_both_directions
from finetune.data.step_batches import REAL_EXAMPLES
from finetune.data.tasks import EncodedTask, read_labelled_split, task_collator
from finetune.errors import UserError
from finetune.glue.metrics import best_threshold, compute_metrics, multilabel_metrics
from finetune.inference.predict import LengthSortedPrediction, logits_loss, logits_to_predictions, predict_logits
from finetune.models.families import reads_left_to_right
from finetune.models.heads import fitted_max_length, load_classifier
from finetune.models.multilabel import DEFAULT_THRESHOLD, THRESHOLD_KEY
from finetune.recipes import FinetuneRecipe
from finetune.run_dir import guarded_stage
from finetune.stages.choices import ChoicesStage
from finetune.stages.classifier_keys import classifier_keys
from finetune.stages.seeds import run_each_seed
from finetune.stages.spans import SpansStage
from finetune.stages.tagging import TaggingStage
from finetune.stages.task_stage import RESULT_FILE, TaskStage
from finetune.training.driver import run_training
from finetune.training.multilabel import binary_cross_entropy, label_probabilities
from finetune.training.techniques import describe_backbone, resolve_techniques


@guarded_stage
def run_finetune(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """Run the stage (once, or once per seed); returns the checkpoint folder (the run directory for seeds).

    `resume`: continue a stopped run from its newest periodic checkpoint; with seeds, finished seeds are kept.
    The techniques the recipe leaves open are decided by the backbone first (training/techniques.py), so the saved
    recipe, the model card and a resumed run's check all see the values in force.
    """
    recipe = resolve_techniques(
        recipe, describe_backbone(recipe.model.checkpoint, recipe.model.trust_remote_code)
    ).recipe
    if recipe.seeds is not None:
        return run_each_seed(recipe, run_single_seed, RESULT_FILE, resume)
    return run_single_seed(recipe, resume)


def run_single_seed(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """One fine-tuning run (or the rest of a stopped one, `resume`); returns the checkpoint folder."""
    stages: dict[str, type[TaskStage]] = {
        "tokens": TaggingStage,
        "choices": ChoicesStage,
        "spans": SpansStage,
        "multilabel": MultilabelStage,
    }
    return run_training(stages.get(recipe.task.kind, FinetuneStage)(recipe), resume)


class FinetuneStage(TaskStage):
    """Classification (or regression): a class per example, from its text or sentence pair (task kind
    classification), with long documents read as task.long_documents says."""

    def read_task(self) -> tuple[int, int]:
        """Read the training and dev splits; returns their sizes."""
        self.train_examples = read_labelled_split(self.spec, self.recipe.task.data_dir, "train")
        self.dev_examples = read_labelled_split(self.spec, self.recipe.task.data_dir, "dev")
        return len(self.train_examples.texts), len(self.dev_examples.texts)

    def task_model(self):
        """The backbone with its task head, and how it reads an example (max_length, long documents)."""
        recipe = self.recipe
        with classifier_keys():
            model = load_classifier(recipe.model, self.spec, recipe.classifier_dropout, recipe.pooling)
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
        train_data = EncodedTask(self.train_examples, self.tokenizer, self.reading, **directions, name="training")
        note = gradient_window_note(model.config, train_data.lengths, whole=self.reading.max_length is None)
        if note:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        self.dev_batches = LengthSortedPrediction(
            EncodedTask(self.dev_examples, self.tokenizer, self.reading, **directions, name="dev"),
            self.tokenizer,
            self.recipe.training.batch_size * 2,
        )
        return train_data, task_collator(self.tokenizer, train_data), self.dev_batches.loader

    def _loss(self, model, batch):
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        if WINDOW_DOCUMENT in batch:  # chunks: the loss of each document's pooled logits, not of its windows
            logits = windowed_logits(model, batch, self.reading.pool)
            return classification_loss(logits, batch["labels"]), examples, examples
        return model(**batch).loss, examples, examples

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Dev scores, and the dev loss for metrics.jsonl (the loss plot) only."""
        logits = self.dev_batches.in_file_order(
            predict_logits(self.accelerator, self.model, self.dev_loader, self.reading.pool)
        )
        predictions, labels = logits_to_predictions(self.spec, logits), self.dev_labels()
        scores = {f"dev_{name}": value for name, value in compute_metrics(self.spec, predictions, labels).items()}
        return scores, {"validation_loss": logits_loss(self.spec, logits, labels)}

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


class MultilabelStage(FinetuneStage):
    """`finetune finetune` for a task of kind multilabel: the classifier's data, model and machinery with a sigmoid
    per label and binary cross-entropy (the head's problem_type), scored by micro F1 at a decision threshold that
    is given (task.threshold) or chosen on dev at each evaluation, and saved with the checkpoint.

    The loss is transformers' BCEWithLogitsLoss, the mean over example x label terms, and a batch counts its
    examples as its loss terms: every example has the same number of labels, so weighing by examples weighs every
    example x label term alike (accumulated steps and processes included).
    """

    def _loss(self, model, batch):
        if WINDOW_DOCUMENT not in batch:
            return super()._loss(model, batch)
        examples = batch.pop(REAL_EXAMPLES)  # chunks: the loss of each document's pooled logits
        logits = windowed_logits(model, batch, self.reading.pool)
        return binary_cross_entropy(logits, batch["labels"]), examples, examples

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Dev scores at the threshold (the one chosen on dev, with threshold: dev) and the threshold itself, as
        dev_threshold: the best evaluation's travels with the best-so-far record (and through a resume) to the
        checkpoint and result.json. The dev loss goes to metrics.jsonl only."""
        logits = self.dev_batches.in_file_order(
            predict_logits(self.accelerator, self.model, self.dev_loader, self.reading.pool)
        )
        references, probabilities = self.dev_labels(), label_probabilities(logits)
        threshold = self.recipe.task.threshold or DEFAULT_THRESHOLD
        if threshold == "dev":
            threshold = best_threshold(references, probabilities)
        scores = multilabel_metrics(references, probabilities > threshold)
        loss = binary_cross_entropy(torch.from_numpy(logits), torch.from_numpy(references)).item()
        return (
            {f"dev_{name}": scores[name] for name in self.spec.metrics} | {"dev_threshold": float(threshold)},
            {"validation_loss": loss},
        )

    def _save(self, directory: Path) -> None:
        """The weights with the threshold of the evaluation they come from (the newest: a new best, or the last)."""
        config = self.accelerator.unwrap_model(self.model).config
        setattr(config, THRESHOLD_KEY, self.best.last["dev_threshold"])
        super()._save(directory)


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
