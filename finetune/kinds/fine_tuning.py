"""What every task kind's fine-tuning shares: a task head on a pretrained backbone, trained with ULMFiT's three
techniques and run by the driver (training/driver.py).

setup (the kind's data and head; layer groups, discriminative LRs, STLR) -> train (thaw groups epoch by epoch or
every N optimizer steps, evaluate, keep the best, stop early) -> save (HF checkpoint, result.json, model card). A
kind (finetune/kinds/K/fine_tuning.py) supplies its `read_task`,
`task_model`, `encoded_task`, `_loss` and `evaluate`.
"""

from __future__ import annotations

import json
import shutil
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from finetune.console import console
from finetune.data.examples import TaskExamples
from finetune.data.long_documents import ReadingError
from finetune.data.sampling import ResumableSampler
from finetune.data.step_batches import CountingCollator, PaddableDataset, StepBatches
from finetune.data.task_batches import LengthGroupedSampler, batching_summary, length_pieces
from finetune.errors import recipe_key
from finetune.kinds.dev_split import DEV_SPLIT_FILE, Rows, write_split
from finetune.kinds.distillation import TEACHER_FILE, Teacher, card_section, distillation_record
from finetune.kinds.head_training import HeadTrainingJob, say
from finetune.kinds.labelled_rows import training_and_dev_rows, write_record
from finetune.kinds.method import MethodChoice
from finetune.models.adapters import attach_adapter, trainable_groups
from finetune.models.backbones import layer_groups
from finetune.models.families import is_recurrent
from finetune.models.hub import load_tokenizer
from finetune.models.mean_pooling import backbone_config
from finetune.models.packed_bert import train_without_padding
from finetune.models.padding import give_a_padding_token, name_the_padding_token
from finetune.models.student import keep_blocks
from finetune.models.task_heads import renew_head
from finetune.reporting.dev_predictions import write_rows
from finetune.reporting.model_card import add_card_section, classifier_card, write_card
from finetune.run_dir import DEV_PREDICTIONS_FILE, METRICS_FILE, read_metrics
from finetune.tasks.specs import task_spec
from finetune.training.budget import StepPlan, few_steps_note, plan_steps, steps_summary
from finetune.training.driver import RunContext, TrainingSetup
from finetune.training.loop import make_accelerator, total_optimizer_steps
from finetune.training.optim import training_optimizer
from finetune.training.self_training import PseudoLabelled
from finetune.training.state import BestSoFar
from finetune.training.techniques import techniques_summary
from finetune.training.unfreezing import GradualUnfreezing, thaw_interval

RESULT_FILE = "result.json"  # the dev scores of the saved checkpoint and of the last evaluation
# Beside the best weights until the end: their evaluation's per-class report, which a --resume reads back.
CLASSES_FILE = "best_classes.json"


class TaskFineTuning(HeadTrainingJob):
    """A task head on a pretrained backbone: discriminative LRs over its layer groups, STLR, gradual unfreezing per
    epoch or every N steps, dev evaluation with keep-best and early stopping. Subclasses are the task kinds."""

    result_file = RESULT_FILE
    adapter = None  # with model.adapter: the PeftModel around the model (trained in place), what checkpoints save
    # The per-class report (tasks/metrics.py's class_report) of the last dev evaluation and of the best one, for the
    # kinds whose evaluate() sets last_classes; result.json and the model card show the saved checkpoint's.
    last_classes: dict | None = None
    best_classes: dict | None = None
    # The last dev evaluation's prediction of each row (reporting/dev_predictions.py), for the kinds whose evaluate()
    # sets it: the saved checkpoint's go to RUN_DIR/dev_predictions.jsonl, which `finetune runs compare` pairs runs by.
    last_predictions: list[dict] | None = None
    predicts_rows = False  # whether evaluate() sets last_predictions
    held_out: dict | None = None  # with task.dev_split: the rows held out as dev (kinds/dev_split.py's record)
    method: MethodChoice | None = None  # how the kind trains, where it chooses (kinds/method.py)
    method_records: tuple[dict, ...] = ()  # what before_training logs (method contrastive: its pair losses)
    drawn: dict | None = None  # with task.labels_per_class: the training rows drawn (kinds/labelled_rows.py's record)
    # Self-training's rows for the round (stages/self_training.py), in the kinds that self-train (classification).
    pseudo_labelled: PseudoLabelled | None = None
    resuming = False  # whether setup() continues a stopped run
    # With distillation (kinds/distillation.py): the rows of unlabelled_text the teacher labels (the stage reads them
    # once for every seed), the teacher, its scores on the run's dev rows and the training rows' targets.
    distill_unlabelled: TaskExamples | None = None
    teacher: Teacher | None = None
    teacher_dev: dict[str, float] | None = None
    teacher_targets: np.ndarray | None = None

    def __init__(self, recipe, kind):
        super().__init__(recipe)
        self.kind = kind  # its TaskKind (kinds/base.py): what the model card says of the kind

    def create_accelerator(self):
        # Gradual unfreezing freezes parameters after DDP has wrapped the model.
        unfreezes = self.recipe.unfreezing.mode != "none"
        return make_accelerator(
            self.recipe.training, parameters_change_trainability=unfreezes, run_dir=self.recipe.run_dir
        )

    def setup(self, accelerator, resume_from: Path | None) -> TrainingSetup:
        recipe = self.recipe
        self.accelerator, self.spec = accelerator, task_spec(recipe.task)
        self.resuming = resume_from is not None
        with recipe_key("model.checkpoint"):
            self.tokenizer = load_tokenizer(recipe.model.checkpoint, trust_remote_code=recipe.model.trust_remote_code)
        give_a_padding_token(self.tokenizer, recipe.model.checkpoint)  # GPT-2's and Llama's have none
        train_count, dev_count = self.read_task()
        self.recipe = recipe = self.training_method()  # method auto decided on the rows read; its techniques
        model = self._model()
        self.skips_padding = self._skip_padding(model)
        # Layer groups -> discriminative learning rates -> optimizer; with an adapter, what it trains of each group.
        with recipe_key("model.checkpoint"):  # a family whose layers cannot be grouped is refused
            self.groups = layer_groups(model)
        if recipe.model.adapter is not None:
            with recipe_key("model.adapter"):
                recurrent = is_recurrent(backbone_config(model.config))
                self.adapter, summary = attach_adapter(
                    model, recipe.model.adapter, self.groups, recipe.model.checkpoint, recurrent
                )
            console.print(summary, markup=False, highlight=False, soft_wrap=True)
            self.groups = trainable_groups(layer_groups(model))  # LoRA's matrices and the head's copy are new
        optimizer = training_optimizer(model, self.groups, recipe)
        console.print(
            f"task {self.spec.name} ({self.spec.kind}): {train_count:,} training and {dev_count:,} dev examples; "
            f"backbone {recipe.model.checkpoint} ({recipe.model.init} weights), seed {recipe.seed}"
        )
        if self.method is not None:  # the kinds that choose one (method auto decided on the rows read)
            say(f"method: {self.method.method} ({self.method.reason})")
        console.print(techniques_summary(recipe), markup=False, highlight=False, soft_wrap=True)
        with recipe_key("task.long_documents", ReadingError):  # a head or overlap too long for the examples
            train_data, collate, dev_loader = self.encoded_task(model)
        if resume_from is None:  # a resumed run's checkpoint holds what this gave the model
            self.before_training(model, train_data, collate)
        self.plan = self._step_plan(len(train_data.lengths))  # type: ignore[attr-defined]  # every kind's have them
        self.model, optimizer, self.train_loader, self.dev_loader = accelerator.prepare(
            model, optimizer, self._training_batches(train_data, collate), dev_loader
        )
        self.metric = recipe.selection_metric()  # what keep-best and early stopping compare (metric_for_best)
        self.best = BestSoFar(f"dev_{self.metric}", recipe.early_stopping_patience)
        unfreezing = recipe.unfreezing
        total_steps = total_optimizer_steps(len(self.train_loader), recipe.training, self.plan.epochs)
        say(steps_summary(total_steps, self.plan))
        if note := few_steps_note(total_steps):
            say(note)
        # Optimizer steps between two thaws when unfreezing goes by steps; None when it goes by epochs.
        thaw_every = thaw_interval(total_steps, unfreezing.every_steps, unfreezing.every_fraction)
        self.unfreezing = GradualUnfreezing(self.groups, unfreezing, thaw_every)
        return TrainingSetup(
            self.model,
            optimizer,
            self.train_loader,
            self._loss,
            "examples",
            self.tokenizer,
            saved_model=self._saved_model,
            epochs=self.plan.epochs,
        )

    def _model(self):
        """The kind's model on the backbone, of the blocks model.keep_layers keeps."""
        model = self.task_model()
        if self.recipe.model.new_head and not self.resuming:  # a resumed run's checkpoint holds the head it trained
            say(f"model.new_head: the head's {renew_head(model):,} parameters start anew; the backbone carries over")
        if (keep := self.recipe.model.keep_layers) is not None:  # a smaller model of some of the checkpoint's blocks
            with recipe_key("model.keep_layers"):
                say(f"model.keep_layers: {keep_blocks(model, keep)}")
        name_the_padding_token(model, self.tokenizer)  # decoders pool at the last non-pad token
        return model

    def _skip_padding(self, model) -> bool:
        """Whether the model computes its batches' real tokens only (models/packed_bert.py): with
        training.skip_padding, on a BERT-family classifier or tagger trained in fp32 without an adapter or compile."""
        training = self.recipe.training
        if not training.skip_padding or training.compile or self.recipe.model.adapter is not None:
            return False
        distillation = self.recipe.distillation
        if distillation is not None and distillation.hidden_weight > 0:  # compared token by token with the teacher's
            return False
        return self.accelerator.mixed_precision == "no" and train_without_padding(model)

    def _saved_model(self):
        """What a checkpoint holds: the model, or with an adapter the PeftModel (the adapter and the head)."""
        return self.adapter if self.adapter is not None else self.accelerator.unwrap_model(self.model)

    # What the task's kind decides.

    @abstractmethod
    def read_task(self) -> tuple[int, int]:
        """Read the training and dev splits; returns their sizes."""

    def train_and_dev(self, read: Callable[[str], Rows], strata: Callable[[Rows], Any] | None = None):
        """The kind's training and dev examples, `read` from their files (kinds/labelled_rows.py's
        training_and_dev_rows: task.dev_split's hold-out, written to the run folder at the start, and
        task.labels_per_class's draw)."""
        train, dev, self.held_out, self.drawn = training_and_dev_rows(
            self.spec, self.recipe, read, strata, self.resuming
        )
        return train, dev

    @abstractmethod
    def task_model(self):
        """The backbone with the kind's head."""

    @abstractmethod
    def encoded_task(self, model) -> tuple[Dataset, Callable, DataLoader]:
        """The encoded training examples (with their `lengths`), how to collate them, and the dev batches."""

    def splits_by_length(self, train_data) -> bool:
        """Whether training.split_by_length can cut this kind's batches into pieces: batches of flat token rows."""
        return False

    def _step_plan(self, rows: int) -> StepPlan:
        """The run's epochs and passes over its `rows` training rows (training/budget.py)."""
        training = self.recipe.training
        return plan_steps(rows, self.step_examples(), training.epochs, training.max_steps, training.min_steps)

    def training_method(self):
        """The recipe the run trains with once the task is read: method auto decided (plain for kinds without
        another), and the techniques the method changes."""
        return self.recipe

    def before_training(self, model, train_data, collate) -> None:
        """What the method does to the model before the training loop (not on --resume: the checkpoint holds it)."""

    def batching_note(self, grouped: bool) -> str | None:
        """What the run should know about how its batches are made for this kind (`grouped`: by length), if
        anything."""
        return None

    @abstractmethod
    def _loss(self, model, batch):
        """(mean loss of the batch, its number of loss terms, its examples), as the loop takes it."""

    def _training_batches(self, train_data, collate) -> DataLoader:
        """Training batches, grouped by length per optimizer step where asked."""
        recipe, accelerator, training = self.recipe, self.accelerator, self.recipe.training
        # Grouped by the examples of a whole optimizer step, so its split into processes and micro-batches changes
        # nothing.
        step_examples = self.step_examples()
        # By default grouped only where padding costs: a model that skips it gains little from grouping (attention
        # alone reads the padded layout) and would pay grouping's quality cost (bench/grouped_batches.py).
        self.grouped = not self.skips_padding if training.group_by_length is None else training.group_by_length
        self.order = (
            LengthGroupedSampler(
                train_data.lengths, step_examples, recipe.seed, training.group_chunk_batches, self.plan.passes
            )
            if self.grouped
            else ResumableSampler(len(train_data), recipe.seed, passes=self.plan.passes)
        )
        # Each step holds the same examples on any number of processes, and no example comes twice an epoch.
        batches = StepBatches(
            self.order, training.batch_size, accelerator.num_processes, training.gradient_accumulation_steps
        )
        split = training.split_by_length and self.splits_by_length(train_data) and not self.skips_padding
        if training.split_by_length and not split:
            why = (
                "the model computes their real tokens only (training.skip_padding), so pieces would save nothing"
                if self.skips_padding
                else "only classification without long_documents windows and tagging split"
            )
            say(f"training.split_by_length: {self.spec.kind} batches stay whole ({why})")
        say(batching_summary(training, self.grouped, split, self.skips_padding))
        if note := self.batching_note(self.grouped):
            say(note)
        input_name = self.tokenizer.model_input_names[0]
        # length_pieces is looked up at each call (tests replace it).
        collator = CountingCollator(
            collate, (lambda items: length_pieces([len(item[input_name]) for item in items])) if split else None
        )
        # A private generator for the workers' seed: starting an epoch then leaves the global random state (dropout)
        # untouched, so a resumed run draws the same dropout masks as one that never stopped.
        return DataLoader(
            PaddableDataset(train_data),
            batch_sampler=batches,
            collate_fn=collator,
            num_workers=training.num_workers,
            generator=torch.Generator().manual_seed(recipe.seed),
        )

    def start(self, context: RunContext) -> None:
        for record in self.method_records:  # the pair training's losses, before the loop's first record
            context.log.write(record)
        if self.held_out is not None and self.accelerator.is_main_process:  # the run folder is the run's now
            write_split(context.run_dir, self.held_out)
        if self.drawn is not None and self.accelerator.is_main_process:
            write_record(context.run_dir, self.drawn)
        if self.teacher_targets is not None and not context.resumed and self.accelerator.is_main_process:
            np.save(context.run_dir / TEACHER_FILE, self.teacher_targets)  # what a --resume trains on
        super().start(context)

    def on_new_best(self, loop, control) -> None:
        self.best_classes = self.last_classes
        super().on_new_best(loop, control)
        if self.recipe.keep_best:
            if self.accelerator.is_main_process and self.last_classes is not None:
                (self.best_dir / CLASSES_FILE).write_text(json.dumps(self.last_classes), encoding="utf-8")
            if self.accelerator.is_main_process and self.last_predictions is not None:  # travels with the weights
                write_rows(self.best_dir / DEV_PREDICTIONS_FILE, self.last_predictions)

    def on_epoch_end(self, loop, control, epoch: int, record: dict) -> None:
        groups = len(self.groups)
        trainable = self.unfreezing.trainable_in_last_step(loop.step)
        scores = ", ".join(f"{name.removeprefix('dev_')} {value:.4f}" for name, value in self.best.last.items())
        console.print(f"epoch {epoch + 1}: {trainable}/{groups} groups trainable; dev {scores}")
        self.say_early_stopping()

    def finish(self, context: RunContext, step: int) -> Path:
        """The best evaluation's weights (in RUN_DIR/checkpoints/best until now), or the last ones; result.json and
        the model card."""
        recipe, accelerator, best, run_dir = self.recipe, self.accelerator, self.best, context.run_dir
        checkpoint = self.kept_checkpoint(run_dir)
        calibration = self.calibration(checkpoint)  # every process: it may predict the dev set again
        self.write_dev_predictions(run_dir, checkpoint)
        if accelerator.is_main_process:
            saved_classes = checkpoint / CLASSES_FILE  # with keep_best, committed with the best weights
            if saved_classes.is_file():
                self.best_classes = json.loads(saved_classes.read_text(encoding="utf-8"))  # also after a resume
                saved_classes.unlink()
            metric = self.metric
            result = {
                "main_metric": metric,
                "saved": "best" if recipe.keep_best else "last",
                "best_step": best.step,
                "best": best.scores,
                "last_step": step,
                "last": best.last,
            }
            classes = self.best_classes if recipe.keep_best else self.last_classes
            if classes is not None:  # per class, of the saved checkpoint's evaluation (None after a resume)
                result["classes"] = classes
            if calibration is not None:
                result["calibration"] = calibration
            (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
            model_type = accelerator.unwrap_model(self.model).config.model_type
            card = classifier_card(
                recipe,
                self.spec,
                result,
                read_metrics(run_dir / METRICS_FILE),
                model_type,
                self.kind.card(recipe, self.spec, model_type, result),
            )
            write_card(card, checkpoint)  # README.md: the Hugging Face model card
            if (run_dir / DEV_SPLIT_FILE).is_file():  # the held-out dev rows travel with the checkpoint
                shutil.copyfile(run_dir / DEV_SPLIT_FILE, checkpoint / DEV_SPLIT_FILE)
            which = (
                f"best dev {metric} {best.scores['dev_' + metric]:.4f} at step {best.step}"
                if recipe.keep_best
                else "after the last step"
            )
            console.print(f"checkpoint ({which}) saved to {checkpoint}")
            self._distillation_report(context.run_dir, checkpoint)
        return checkpoint

    def _distillation_report(self, run_dir: Path, checkpoint: Path) -> None:
        """result.json's `distillation` and the card's Distillation section: the teacher's score, the student's, the
        retention."""
        if self.teacher is None or self.teacher_dev is None:
            return
        record = distillation_record(self.teacher, self.teacher_dev, self.best.scores, self.metric)
        result_path = run_dir / RESULT_FILE
        result = json.loads(result_path.read_text(encoding="utf-8"))
        result_path.write_text(json.dumps({**result, "distillation": record}, indent=2) + "\n", encoding="utf-8")
        add_card_section(checkpoint, "Distillation", card_section(record, self.recipe))
        if record["retention"] is not None:
            say(f"distillation: the student keeps {record['retention']:.1%} of the teacher's dev {self.metric}")

    def calibration(self, checkpoint: Path) -> dict | None:
        """result.json's `calibration` of the saved weights, on the main process (kinds/calibration.py), for the
        kinds that calibrate their probabilities; None for the others."""
        return None

    def write_dev_predictions(self, run_dir: Path, checkpoint: Path) -> None:
        """RUN_DIR/dev_predictions.jsonl: the saved checkpoint's dev predictions; with keep_best those kept beside the
        best weights (through a resume too), else the last evaluation's, made again when a resumed run's last
        evaluation came before its checkpoint (the weights are the last ones either way)."""
        kept = checkpoint / DEV_PREDICTIONS_FILE  # committed with the best weights
        if self.predicts_rows and not self.recipe.keep_best and self.last_predictions is None:
            self.evaluate()  # every process: the evaluation gathers the dev rows from all of them
        if not self.accelerator.is_main_process:
            return
        if kept.is_file():
            kept.replace(run_dir / DEV_PREDICTIONS_FILE)
        elif not self.recipe.keep_best and self.last_predictions is not None:
            write_rows(run_dir / DEV_PREDICTIONS_FILE, self.last_predictions)
