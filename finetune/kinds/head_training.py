"""What the fine-tuning jobs share with the run driver, whatever their heads: one task's (kinds/fine_tuning.py) or
several tasks' on one encoder (kinds/multitask.py). Their layer groups thaw by gradual unfreezing, the best
evaluation's weights wait in RUN_DIR/checkpoints/best (travelling with every periodic checkpoint) until the end, and
an order of the training rows (a ResumableSampler) is set at each epoch's start, past what a resumed run has read."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

from finetune.console import console
from finetune.run_dir import CHECKPOINT_DIR
from finetune.training.checkpoints import commit_checkpoint, save_checkpoint
from finetune.training.driver import RunContext, TrainingJob
from finetune.training.state import BestSoFar
from finetune.training.unfreezing import GradualUnfreezing, freeze_below, frozen_groups_note

BEST_DIR = Path("checkpoints") / "best"  # inside the run directory: the best evaluation's weights until the end


class HeadTrainingJob(TrainingJob):
    """A fine-tuning job's life cycle around its model. Its setup sets `accelerator`, `tokenizer`, `groups`,
    `unfreezing`, `best`, `metric`, `train_loader` and `order`; `_saved_model` is what a checkpoint holds."""

    accelerator: Any
    tokenizer: Any
    groups: list
    unfreezing: GradualUnfreezing
    best: BestSoFar
    metric: str
    train_loader: Any  # prepared by accelerate
    order: Any  # a ResumableSampler: the training rows' order
    context: RunContext
    best_dir: Path

    def step_examples(self) -> int:
        """The training examples of one optimizer step: batch x processes x accumulation."""
        training = self.recipe.training
        return training.batch_size * self.accelerator.num_processes * training.gradient_accumulation_steps

    def start(self, context: RunContext) -> None:
        self.context, self.best_dir = context, context.run_dir / BEST_DIR
        steps_per_epoch = math.ceil(len(self.train_loader) / self.recipe.training.gradient_accumulation_steps)
        epochs = math.ceil(context.total_steps / steps_per_epoch)
        by_epoch = self.unfreezing.thaw_every is None and not context.resumed
        if by_epoch and (note := frozen_groups_note(self.recipe.unfreezing, len(self.groups), epochs)):
            say(note)  # said, not silently left: the lower groups keep their pretrained weights

    def best_so_far(self) -> BestSoFar:
        return self.best

    def subscribers(self) -> list:
        return [self.unfreezing]  # gradual unfreezing decides, per epoch or per step, how many groups learn

    def attachments(self, run_dir: Path) -> dict[str, Path]:
        return {"best": run_dir / BEST_DIR}  # the best evaluation's weights travel with every periodic checkpoint

    def on_epoch_begin(self, loop, control, epoch: int, batches_done: int) -> None:
        self.train_loader.set_epoch(epoch)
        self.order.set_epoch(epoch)
        self.order.skip_batches(batches_done, self.recipe.training.batch_size, self.accelerator.num_processes)

    def on_new_best(self, loop, control) -> None:
        if self.recipe.keep_best:
            self._save(self.best_dir)

    def say_early_stopping(self) -> None:
        """The line that says the run stops early, once patience is spent."""
        if self.best.patience_exhausted:
            console.print(
                f"early stopping: no better dev {self.metric} in {self.recipe.early_stopping_patience} evaluations"
            )

    def _save(self, directory: Path) -> None:
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            save_checkpoint(self._saved_model(), self.tokenizer, directory, self.recipe)

    def kept_checkpoint(self, run_dir: Path) -> Path:
        """RUN_DIR/checkpoint at the end: the best evaluation's weights (RUN_DIR/checkpoints/best until now) with
        keep_best, else the last ones, every parameter trainable again as in any loaded checkpoint."""
        checkpoint = run_dir / CHECKPOINT_DIR
        freeze_below(self.groups, len(self.groups))
        if not self.recipe.keep_best:
            self._save(checkpoint)
            return checkpoint
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            commit_checkpoint(self.best_dir, checkpoint)  # every run ends with an evaluation: the best exists
            with contextlib.suppress(OSError):  # the folder stays when it holds periodic checkpoints
                self.best_dir.parent.rmdir()
        return checkpoint

    def finished_result(self, run_dir: Path) -> Path:
        return run_dir / CHECKPOINT_DIR

    def _saved_model(self) -> Any:
        """What a checkpoint holds (a Hugging Face model, or what saves as one)."""
        raise NotImplementedError


def say(line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)
