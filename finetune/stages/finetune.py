"""`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's three techniques.

setup (data, model, layer groups, discriminative LRs, STLR) -> train (thaw groups epoch by epoch or every
N optimizer steps, evaluate, keep the best, stop early) -> save (HF checkpoint with the label mapping).
With `seeds`, the whole stage runs once per seed and the dev scores are summarised across seeds. `resume=True`
continues from the newest periodic checkpoint (`checkpoint_every`) bit for bit: weights, optimizer,
random states, unfreezing stage, data position, best score so far (and its weights), patience.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import DataCollatorForTokenClassification

from finetune.console import console
from finetune.data.reverse import reads_backwards, reads_both_directions
from finetune.data.sampling import ResumableSampler
from finetune.data.step_batches import REAL_EXAMPLES, CountingCollator, PaddableDataset, StepBatches
from finetune.data.long_documents import WINDOW_DOCUMENT, DocumentReading, classification_loss, windowed_logits
from finetune.data.tagging import IGNORED, EncodedTagging, read_conll, tag_set
from finetune.data.tasks import EncodedTask, LengthGroupedSampler, read_labelled_split, task_collator, task_file
from finetune.glue.metrics import best_threshold, compute_metrics, multilabel_metrics, tagging_metrics
from finetune.glue.specs import task_spec
from finetune.models.backbones import layer_groups
from finetune.models.heads import fitted_max_length, load_classifier
from finetune.models.multilabel import DEFAULT_THRESHOLD, THRESHOLD_KEY
from finetune.models.taggers import load_tagger
from finetune.models.hub import load_tokenizer
from finetune.recipes import FinetuneRecipe
from finetune.reporting.model_card import classifier_card, write_card
from finetune.run_dir import CHECKPOINT_DIR, METRICS_FILE, guarded_stage, read_metrics
from finetune.stages.seeds import run_each_seed
from finetune.training.checkpoints import commit_checkpoint, save_checkpoint
from finetune.training.driver import RunContext, TrainingSetup, TrainingStage, run_training
from finetune.training.loop import make_accelerator, total_optimizer_steps
from finetune.training.optim import build_optimizer, discriminative_lrs
from finetune.training.predict import LengthSortedPrediction, logits_loss, logits_to_predictions, predict_logits
from finetune.training.multilabel import binary_cross_entropy, label_probabilities
from finetune.training.tagging import sentence_logits
from finetune.training.state import BestSoFar
from finetune.training.techniques import describe_backbone, resolve_techniques, techniques_summary
from finetune.training.unfreezing import (freeze_below, thaw_interval, trainable_group_count,
                                         trainable_group_count_at_step)

RESULT_FILE = "result.json"  # the dev scores of the saved checkpoint and of the last evaluation
BEST_DIR = Path("checkpoints") / "best"  # inside the run directory: the best evaluation's weights until the end


@guarded_stage
def run_finetune(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """Run the stage (once, or once per seed); returns the checkpoint folder (the run directory for seeds).

    `resume`: continue a stopped run from its newest periodic checkpoint; with seeds, finished seeds are kept.
    The techniques the recipe leaves open are decided by the backbone first (training/techniques.py), so the saved
    recipe, the model card and a resumed run's check all see the values in force.
    """
    recipe = resolve_techniques(recipe, describe_backbone(recipe.model.checkpoint,
                                                          recipe.model.trust_remote_code)).recipe
    if recipe.seeds is not None:
        return run_each_seed(recipe, run_single_seed, RESULT_FILE, resume)
    return run_single_seed(recipe, resume)


def run_single_seed(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """One fine-tuning run (or the rest of a stopped one, `resume`); returns the checkpoint folder."""
    stage = {"tokens": TaggingStage, "multilabel": MultilabelStage}.get(recipe.task.kind, FinetuneStage)
    return run_training(stage(recipe), resume)


class FinetuneStage(TrainingStage):
    """A classifier (or regressor) on a pretrained backbone: discriminative LRs over its layer groups, STLR, gradual
    unfreezing per epoch or every N steps, dev evaluation with keep-best and early stopping."""

    result_file = RESULT_FILE

    def create_accelerator(self):
        # Gradual unfreezing freezes parameters after DDP has wrapped the model.
        unfreezes = self.recipe.unfreezing.mode != "none"
        return make_accelerator(self.recipe.training, parameters_change_trainability=unfreezes,
                                run_dir=self.recipe.run_dir)

    def setup(self, accelerator, resume_from: Optional[Path]) -> TrainingSetup:
        recipe = self.recipe
        self.accelerator, self.spec = accelerator, task_spec(recipe.task)
        self.tokenizer = load_tokenizer(recipe.model.checkpoint, trust_remote_code=recipe.model.trust_remote_code)
        if self.tokenizer.pad_token is None and self.tokenizer.eos_token is not None:
            # GPT-2's tokenizer has no pad token; batches pad with end-of-text, which the attention mask hides.
            self.tokenizer.pad_token = self.tokenizer.eos_token
        train_count, dev_count = self.read_task()
        model = self.task_model()
        if model.config.pad_token_id is None:  # decoders pool at the last non-pad token: they must know which it is
            model.config.pad_token_id = self.tokenizer.pad_token_id
        # Layer groups -> discriminative learning rates -> optimizer.
        self.groups = layer_groups(model)
        lrs = discriminative_lrs(len(self.groups), recipe.training.lr, recipe.discriminative.factor)
        optimizer = build_optimizer(model, self.groups, lrs, recipe.training.weight_decay, recipe.training.adam_betas)
        console.print(f"task {self.spec.name}: {train_count:,} training and {dev_count:,} dev examples; backbone "
                      f"{recipe.model.checkpoint} ({recipe.model.init} weights), seed {recipe.seed}")
        console.print(techniques_summary(recipe), markup=False, highlight=False, soft_wrap=True)
        train_data, collate, dev_loader = self.encoded_task(model)
        self.model, optimizer, self.train_loader, self.dev_loader = accelerator.prepare(
            model, optimizer, self._training_batches(train_data, collate), dev_loader)
        self.best = BestSoFar(f"dev_{self.spec.main_metric}", recipe.early_stopping_patience)
        unfreezing, total_steps = recipe.unfreezing, total_optimizer_steps(len(self.train_loader), recipe.training)
        # Optimizer steps between two thaws when unfreezing goes by steps; None when it goes by epochs.
        self.thaw_every = thaw_interval(total_steps, unfreezing.every_steps, unfreezing.every_fraction)
        return TrainingSetup(self.model, optimizer, self.train_loader, self._loss, "examples", self.tokenizer,
                             saved_model=lambda: accelerator.unwrap_model(self.model),
                             before_step=None if self.thaw_every is None else self._thaw_by_steps)

    # What the task's kind decides (a tagging task overrides these: stages/tagging.py).

    def read_task(self) -> tuple[int, int]:
        """Read the training and dev splits; returns their sizes."""
        self.train_examples = read_labelled_split(self.spec, self.recipe.task.data_dir, "train")
        self.dev_examples = read_labelled_split(self.spec, self.recipe.task.data_dir, "dev")
        return len(self.train_examples.texts), len(self.dev_examples.texts)

    def task_model(self):
        """The backbone with its task head, and how it reads an example (max_length, long documents)."""
        recipe = self.recipe
        model = load_classifier(recipe.model, self.spec, recipe.classifier_dropout, recipe.pooling)
        self.reading = DocumentReading.of(fitted_max_length(recipe.task.max_length, model), recipe.task.long_documents)
        return model

    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        """The encoded training examples (with their `lengths`), how to collate them, and the dev batches."""
        # A backward LM's classifier reads its text backwards too; a bidirectional one (two LMs) both ways.
        directions = {"backwards": reads_backwards(model.config),
                      "both_directions": reads_both_directions(model.config)}
        console.print(f"the classifier {self.reading.describe()}", markup=False, highlight=False, soft_wrap=True)
        train_data = EncodedTask(self.train_examples, self.tokenizer, self.reading, **directions, name="training")
        note = gradient_window_note(model.config, train_data.lengths, whole=self.reading.max_length is None)
        if note:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        self.dev_batches = LengthSortedPrediction(
            EncodedTask(self.dev_examples, self.tokenizer, self.reading, **directions, name="dev"), self.tokenizer,
            self.recipe.training.batch_size * 2)
        return train_data, task_collator(self.tokenizer, train_data), self.dev_batches.loader

    def _training_batches(self, train_data, collate) -> DataLoader:
        """Training batches, grouped by length per optimizer step where asked."""
        recipe, accelerator, training = self.recipe, self.accelerator, self.recipe.training
        # Grouped by the examples of a whole optimizer step, so its split into processes and micro-batches changes
        # nothing.
        step_examples = training.batch_size * accelerator.num_processes * training.gradient_accumulation_steps
        self.order = LengthGroupedSampler(train_data.lengths, step_examples, recipe.seed) \
            if training.group_by_length else ResumableSampler(len(train_data), recipe.seed)
        # Each step holds the same examples on any number of processes, and no example comes twice an epoch.
        batches = StepBatches(self.order, training.batch_size, accelerator.num_processes,
                              training.gradient_accumulation_steps)
        # A private generator for the workers' seed: starting an epoch then leaves the global random state (dropout)
        # untouched, so a resumed run draws the same dropout masks as one that never stopped.
        return DataLoader(PaddableDataset(train_data), batch_sampler=batches, collate_fn=CountingCollator(collate),
                          num_workers=training.num_workers, generator=torch.Generator().manual_seed(recipe.seed))

    def _loss(self, model, batch):
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        if WINDOW_DOCUMENT in batch:  # chunks: the loss of each document's pooled logits, not of its windows
            logits = windowed_logits(model, batch, self.reading.pool)
            return classification_loss(logits, batch["labels"]), examples, examples
        return model(**batch).loss, examples, examples

    def start(self, context: RunContext) -> None:
        self.context = context
        self.best_dir = context.run_dir / BEST_DIR
        unfreezing, groups = self.recipe.unfreezing, len(self.groups)
        if self.thaw_every is None and unfreezing.mode == "gradual" and not context.resumed:
            steps_per_epoch = math.ceil(len(self.train_loader) / self.recipe.training.gradient_accumulation_steps)
            epochs = math.ceil(context.total_steps / steps_per_epoch)
            thawed = trainable_group_count(epochs - 1, groups, "gradual", unfreezing.initial_groups,
                                           unfreezing.groups_per_epoch, unfreezing.schedule)
            if thawed < groups:  # said, not silently left: the lower groups keep their pretrained weights
                console.print(f"note: gradual unfreezing thaws one more group per epoch; in {epochs} epoch(s) "
                              f"{thawed} of the {groups} layer groups train and the lowest {groups - thawed} never do "
                              "(more epochs, or unfreezing.every_fraction to thaw by steps)", markup=False)

    def best_so_far(self) -> BestSoFar:
        return self.best

    def attachments(self, run_dir: Path) -> dict[str, Path]:
        return {"best": run_dir / BEST_DIR}  # the best evaluation's weights travel with every periodic checkpoint

    # Gradual unfreezing decides, per epoch or per optimizer step, how many layer groups from the top learn.

    def _trainable_at_step(self, step: int) -> int:
        return trainable_group_count_at_step(step, len(self.groups), self.recipe.unfreezing.initial_groups,
                                             self.thaw_every)

    def _thaw_by_steps(self, step: int, epoch: int) -> None:
        """The loop's before_step: freeze to the count of this step, with a record at step 0 and at each change.

        Written from the step alone (not from what this process did before), so a resumed run freezes and logs
        exactly what the stopped one would have: the stopped run wrote the record of its checkpoint's step, if
        any, only after that checkpoint.
        """
        trainable = self._trainable_at_step(step)
        freeze_below(self.groups, trainable)  # idempotent, and cheap next to a step: one flag per parameter
        if step == 0 or trainable != self._trainable_at_step(step - 1):
            self._log_unfreezing(step, epoch, trainable)

    def _log_unfreezing(self, step: int, epoch: int, trainable: int) -> None:
        # `step`: the steps taken before the change; it holds from step + 1 on (what plots.is_trainable reads).
        self.context.log.write({"phase": "unfreeze", "step": step, "epoch": epoch, "trainable_groups": trainable,
                                "total_groups": len(self.groups)})

    def before_epoch(self, epoch: int, step: int, batches_done: int) -> None:
        unfreezing = self.recipe.unfreezing
        if self.thaw_every is None:  # per epoch; step-wise unfreezing happens in the loop
            self.epoch_trainable = trainable_group_count(epoch, len(self.groups), unfreezing.mode,
                                                         unfreezing.initial_groups, unfreezing.groups_per_epoch,
                                                         unfreezing.schedule)
            freeze_below(self.groups, self.epoch_trainable)
            if not batches_done:  # a resumed epoch logged its unfreezing before
                self._log_unfreezing(step, epoch, self.epoch_trainable)
        self.train_loader.set_epoch(epoch)
        self.order.set_epoch(epoch)
        self.order.skip_batches(batches_done, self.recipe.training.batch_size, self.accelerator.num_processes)

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Dev scores, and the dev loss for metrics.jsonl (the loss plot) only."""
        logits = self.dev_batches.in_file_order(predict_logits(self.accelerator, self.model, self.dev_loader,
                                                               self.reading.pool))
        predictions = logits_to_predictions(self.spec, logits)
        scores = {f"dev_{name}": value
                  for name, value in compute_metrics(self.spec, predictions, self.dev_examples.labels).items()}
        return scores, {"validation_loss": logits_loss(self.spec, logits, self.dev_examples.labels)}

    def on_new_best(self) -> None:
        if self.recipe.keep_best:
            self._save(self.best_dir)

    def end_of_epoch(self, epoch: int, step: int, record: dict) -> None:
        groups = len(self.groups)
        # By steps: the groups that trained in the epoch's last step.
        trainable = self.epoch_trainable if self.thaw_every is None else self._trainable_at_step(max(step - 1, 0))
        scores = ", ".join(f"{name.removeprefix('dev_')} {value:.4f}" for name, value in self.best.last.items())
        console.print(f"epoch {epoch + 1}: {trainable}/{groups} groups trainable; dev {scores}")
        if self.best.patience_exhausted:
            console.print(f"early stopping: no better dev {self.spec.main_metric} in "
                          f"{self.recipe.early_stopping_patience} evaluations")

    def _save(self, directory: Path) -> None:
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            save_checkpoint(self.accelerator.unwrap_model(self.model), self.tokenizer, directory, self.recipe)

    def finish(self, context: RunContext, step: int) -> Path:
        """The best evaluation's weights (in RUN_DIR/checkpoints/best until now), or the last ones; result.json and
        the model card."""
        recipe, accelerator, best, run_dir = self.recipe, self.accelerator, self.best, context.run_dir
        checkpoint = run_dir / CHECKPOINT_DIR
        freeze_below(self.groups, len(self.groups))  # every parameter trainable again, as in any loaded checkpoint
        if recipe.keep_best:
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                commit_checkpoint(self.best_dir, checkpoint)  # every run ends with an evaluation: the best exists
                with contextlib.suppress(OSError):  # the folder stays when it holds periodic checkpoints
                    self.best_dir.parent.rmdir()
        else:
            self._save(checkpoint)
        if accelerator.is_main_process:
            metric = self.spec.main_metric
            result = {"main_metric": metric, "saved": "best" if recipe.keep_best else "last",
                      "best_step": best.step, "best": best.scores, "last_step": step, "last": best.last}
            (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
            card = classifier_card(recipe, self.spec, result, read_metrics(run_dir / METRICS_FILE),
                                   accelerator.unwrap_model(self.model).config.model_type)
            write_card(card, checkpoint)  # README.md: the Hugging Face model card
            which = f"best dev {metric} {best.scores['dev_' + metric]:.4f} at step {best.step}" \
                if recipe.keep_best else "after the last step"
            console.print(f"checkpoint ({which}) saved to {checkpoint}")
        return checkpoint

    def finished_result(self, run_dir: Path) -> Path:
        return run_dir / CHECKPOINT_DIR


class TaggingStage(FinetuneStage):
    """`finetune finetune` for a task of kind tokens (see the module docstring)."""

    def read_task(self) -> tuple[int, int]:
        data_dir, column = self.recipe.task.data_dir, self.spec.tag_column
        self.train_sentences = read_conll(task_file(self.spec, data_dir, "train"), column)
        self.dev_sentences = read_conll(task_file(self.spec, data_dir, "dev"), column)
        tags = self.spec.labels or tag_set(self.train_sentences)  # the recipe's task.labels, else the training file's
        self.spec = replace(self.spec, labels=tuple(tags))
        return len(self.train_sentences.words), len(self.dev_sentences.words)

    def task_model(self):
        model = load_tagger(self.recipe.model, self.spec.labels, self.recipe.classifier_dropout)
        self.max_length = fitted_max_length(self.recipe.task.max_length, model)
        return model

    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        console.print(f"the tagger reads at most {self.max_length} tokens of a sentence; {len(self.spec.labels)} tags: "
                      f"{', '.join(self.spec.labels)}", markup=False, highlight=False, soft_wrap=True)
        train_data = EncodedTagging(self.train_sentences, self.tokenizer, self.max_length, self.spec.labels)
        self.dev_data = EncodedTagging(self.dev_sentences, self.tokenizer, self.max_length, self.spec.labels, "dev")
        collate = DataCollatorForTokenClassification(self.tokenizer, label_pad_token_id=IGNORED)
        # Every process scores the whole dev set (sentences of any length do not gather across processes), from a
        # loader of its own: accelerate would share the one returned here out among them.
        self.tagging_dev_loader = DataLoader(self.dev_data, batch_size=self.recipe.training.batch_size * 2,
                                             collate_fn=collate)
        return train_data, collate, self.tagging_dev_loader

    def _loss(self, model, batch):
        """The mean cross-entropy over the batch's tagged words (first sub-tokens), counted as that many terms so
        accumulated steps and processes weigh every word alike."""
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        words = (batch["labels"] != IGNORED).sum() if examples else 0
        return model(**batch).loss, words, examples

    def evaluate(self) -> tuple[dict[str, float], dict]:
        """Entity-level dev scores, and the dev loss (mean over tagged words) for metrics.jsonl only."""
        model = self.accelerator.unwrap_model(self.model)
        logits, loss = sentence_logits(model, self.tagging_dev_loader, self.accelerator.device, with_loss=True)
        predicted = self.dev_data.word_tags(logits, self.spec.labels)
        scores = tagging_metrics(self.dev_sentences.tags, predicted)
        return {f"dev_{name}": scores[name] for name in self.spec.metrics}, {"validation_loss": loss}


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
        logits = self.dev_batches.in_file_order(predict_logits(self.accelerator, self.model, self.dev_loader,
                                                               self.reading.pool))
        references, probabilities = self.dev_examples.labels, label_probabilities(logits)
        threshold = self.recipe.task.threshold or DEFAULT_THRESHOLD
        if threshold == "dev":
            threshold = best_threshold(references, probabilities)
        scores = multilabel_metrics(references, probabilities > threshold)
        loss = binary_cross_entropy(torch.from_numpy(logits), torch.from_numpy(references)).item()
        return ({f"dev_{name}": scores[name] for name in self.spec.metrics} | {"dev_threshold": float(threshold)},
                {"validation_loss": loss})

    def _save(self, directory: Path) -> None:
        """The weights with the threshold of the evaluation they come from (the newest: a new best, or the last)."""
        config = self.accelerator.unwrap_model(self.model).config
        setattr(config, THRESHOLD_KEY, self.best.last["dev_threshold"])
        super()._save(directory)


def gradient_window_note(config, lengths: list[int], whole: bool = True) -> Optional[str]:
    """For a classifier that reads documents in chunks with a bounded gradient (the AWD-LSTM's BPT3C): how much of
    the training documents it reads (`whole`: every token, no task.max_length), and how many are longer than the
    tokens its gradients reach."""
    window = getattr(config, "classifier_max_len", None)
    if window is None or not lengths:
        return None
    lengths = np.asarray(lengths)
    longer = int((lengths > window).sum())
    reach = f"; gradients reach the encoder through the last {window:,} tokens of each ({longer:,} documents are " \
            "longer: their start is read, not trained through)" if longer else ""
    median = np.median(lengths)
    return (f"the classifier reads {'every token of ' if whole else ''}the {len(lengths):,} training examples (median "
            f"{median:,.0f}, longest {lengths.max():,} tokens{'' if whole else ' as task.max_length leaves them'}), "
            f"{config.classifier_bptt} at a time (BPT3C){reach}")
