"""Multi-task fine-tuning (`finetune multitask`): one encoder, a head per task, each optimizer step one task's batch.

Each task is its kind's own fine-tuning job (kinds/K/fine_tuning.py), built from its finetune recipe (the multitask
recipe's shared keys with the task's section): it reads and encodes the task, builds its model and computes its loss
and dev scores exactly as `finetune finetune` does. This job joins them: the tasks' models share one encoder
(models/shared_encoder.py), ULMFiT's layer groups are the encoder's with every head in the top group, the training
batches come from data/task_mixing.py (each step one task, drawn by the sampling rule, its loss times its weight),
and each evaluation scores every task; the mean of their main metrics (or one task's) picks the kept checkpoint and
stops early. The checkpoint folder holds one Hugging Face checkpoint per task (the shared encoder with that task's
head: loadable alone by transformers, predicted by `finetune predict`, continued by `finetune finetune`) and
multitask.json, the list of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from finetune.console import console
from finetune.data.step_batches import CountingCollator, PaddableDataset, StepBatches
from finetune.data.task_mixing import TASK_KEY, MixedCollator, MixedTaskOrder, MixedTasks, steps_per_epoch, task_shares
from finetune.errors import recipe_key
from finetune.kinds.fine_tuning import RESULT_FILE, TaskFineTuning
from finetune.kinds.head_training import HeadTrainingJob, say
from finetune.kinds.multitask_checkpoint import SavedTasks, write_task_cards
from finetune.kinds.registry import kind_named
from finetune.models.hub import load_tokenizer
from finetune.models.padding import give_a_padding_token
from finetune.models.shared_encoder import MultiTaskModel, TaskView, share_encoder, shared_layer_groups
from finetune.recipes.multitask import MEAN, MultiTaskRecipe
from finetune.tasks.specs import task_spec
from finetune.training.budget import few_steps_note, plan_steps, steps_summary
from finetune.training.driver import RunContext, TrainingSetup
from finetune.training.loop import make_accelerator, total_optimizer_steps
from finetune.training.optim import training_optimizer
from finetune.training.state import BestSoFar
from finetune.training.techniques import techniques_summary
from finetune.training.unfreezing import GradualUnfreezing, thaw_interval


class MultiTaskFineTuning(HeadTrainingJob):
    """The tasks' fine-tuning jobs on one shared encoder (see the module docstring)."""

    result_file = RESULT_FILE
    recipe: MultiTaskRecipe

    def __init__(self, recipe: MultiTaskRecipe):
        super().__init__(recipe)
        self.names = recipe.task_names()
        self.members: list[TaskFineTuning] = [kind_named(task.task.kind).fine_tuning(task) for task in recipe.tasks]

    def create_accelerator(self):
        # A step trains one task: the other heads get no gradient, which DDP must be told of.
        return make_accelerator(self.recipe.training, parameters_change_trainability=True, run_dir=self.recipe.run_dir)

    def setup(self, accelerator, resume_from: Path | None) -> TrainingSetup:
        recipe, self.accelerator = self.recipe, accelerator
        with recipe_key("model.checkpoint"):
            self.tokenizer = load_tokenizer(recipe.model.checkpoint, trust_remote_code=recipe.model.trust_remote_code)
        give_a_padding_token(self.tokenizer, recipe.model.checkpoint)
        models = [self._task_model(index, resume_from is not None) for index in range(len(self.members))]
        with recipe_key("tasks"):  # tasks whose models cannot share their encoder are refused
            shared = share_encoder(models)
            self.groups = shared_layer_groups(models)
        self.models = models
        say(f"multi-task: {len(models)} tasks share the encoder's {shared:,} parameters; each has its own head")
        console.print(techniques_summary(recipe.tasks[0]), markup=False, highlight=False, soft_wrap=True)
        wrapper = MultiTaskModel(models)  # one module over the tasks' models: what accelerate prepares
        optimizer = training_optimizer(wrapper, self.groups, recipe.tasks[0])
        encoded = [self._encoded(member, model) for member, model in zip(self.members, models)]
        if resume_from is None:  # a resumed run's checkpoint holds what this gave the models
            for member, model, (train_data, collate, _) in zip(self.members, models, encoded):
                member.before_training(model, train_data, collate)
        loader = self._mixed_batches([len(train_data) for train_data, _, _ in encoded], encoded)
        prepared, optimizer, self.train_loader, *dev_loaders = accelerator.prepare(
            wrapper, optimizer, loader, *(dev_loader for _, _, dev_loader in encoded)
        )
        self.model = prepared
        for member, model, dev_loader in zip(self.members, models, dev_loaders):
            member.model, member.dev_loader = model, dev_loader  # evaluation runs no backward: the task's own model
            member.metric = member.recipe.selection_metric()
        self.metric = (
            MEAN if recipe.metric_for_best == MEAN else f"{recipe.metric_for_best}_{self._main(recipe.metric_for_best)}"
        )
        self.best = BestSoFar(f"dev_{self.metric}", recipe.early_stopping_patience)
        total_steps = total_optimizer_steps(len(self.train_loader), recipe.training, self.plan.epochs)
        say(steps_summary(total_steps, self.plan))
        if note := few_steps_note(total_steps):
            say(note)
        thaw_every = thaw_interval(total_steps, recipe.unfreezing.every_steps, recipe.unfreezing.every_fraction)
        self.unfreezing = GradualUnfreezing(self.groups, recipe.unfreezing, thaw_every)
        return TrainingSetup(
            prepared, optimizer, self.train_loader, self._loss, "examples", self.tokenizer,
            saved_model=self._saved_model, epochs=self.plan.epochs,
        )  # fmt: skip

    def _task_model(self, index: int, resuming: bool):
        """Task `index`'s data read and its model built, by its kind's job."""
        member, name = self.members[index], self.names[index]
        member.accelerator, member.spec, member.resuming = self.accelerator, task_spec(member.recipe.task), resuming
        member.tokenizer = self.tokenizer
        with recipe_key(f"tasks.{index}"):
            train_count, dev_count = member.read_task()
        member.recipe = member.training_method()
        model = member._model()
        say(f"task {name} ({member.spec.kind}): {train_count:,} training and {dev_count:,} dev examples, loss weight "
            f"{self.recipe.loss_weight(name):g}")  # fmt: skip
        return model

    def _encoded(self, member: TaskFineTuning, model):
        member.skips_padding = member._skip_padding(model)
        with recipe_key("task.long_documents"):
            return member.encoded_task(model)

    def _mixed_batches(self, sizes: list[int], encoded) -> DataLoader:
        """Each optimizer step one task's examples, the task drawn by the sampling rule (data/task_mixing.py)."""
        recipe, accelerator, training = self.recipe, self.accelerator, self.recipe.training
        step_examples = self.step_examples()
        self.plan = plan_steps(sum(sizes), step_examples, training.epochs, training.max_steps, training.min_steps)
        shares = task_shares(sizes, recipe.sampling.rule, recipe.sampling.temperature)
        steps = steps_per_epoch(sizes, step_examples, self.plan.passes)
        say("sampling " + recipe.sampling.rule + ": " + ", ".join(
            f"{name} {share:.1%} of the steps ({size:,} rows)" for name, share, size in zip(self.names, shares, sizes)
        ))  # fmt: skip
        if training.group_by_length or training.split_by_length:
            say("training.group_by_length / split_by_length: a multi-task run's batches are shuffled within each task")
        self.order = MixedTaskOrder(sizes, shares, recipe.seed, step_examples, steps)
        batches = StepBatches(
            self.order, training.batch_size, accelerator.num_processes, training.gradient_accumulation_steps
        )
        mixed = MixedTasks([train_data for train_data, _, _ in encoded])
        return DataLoader(
            PaddableDataset(mixed),
            batch_sampler=batches,
            collate_fn=CountingCollator(MixedCollator([collate for _, collate, _ in encoded])),
            num_workers=training.num_workers,
            generator=torch.Generator().manual_seed(recipe.seed),
        )

    def _loss(self, model, batch):
        """The batch's task's loss (its kind's), times the task's loss weight."""
        index = batch.pop(TASK_KEY)
        member = self.members[index]
        loss, terms, examples = member._loss(TaskView(model, index, self.models[index]), batch)
        return loss * self.recipe.loss_weight(self.names[index]), terms, examples

    def _main(self, name: str) -> str:
        return self.members[self.names.index(name)].recipe.selection_metric()

    def _saved_model(self) -> Any:  # SavedTasks: saved as a model is (save_pretrained)
        return SavedTasks(
            self.names, self.models, [member.recipe for member in self.members], self.tokenizer, self.recipe
        )

    def evaluate(self) -> tuple[dict[str, float], dict[str, Any]]:
        """Every task's dev scores (dev_TASK_METRIC) and the mean of their main metrics (dev_mean)."""
        scores: dict[str, float] = {}
        others: dict[str, Any] = {}
        mains = []
        for name, member in zip(self.names, self.members):
            own, rest = member.evaluate()
            scores |= {f"dev_{name}_{key.removeprefix('dev_')}": value for key, value in own.items()}
            others |= {f"{name}_{key}": value for key, value in rest.items()}
            mains.append(own[f"dev_{member.metric}"])
        self.model.train()
        scores["dev_mean"] = sum(mains) / len(mains)
        return scores, others

    def on_epoch_end(self, loop, control, epoch: int, record: dict) -> None:
        last = self.best.last
        scores = ", ".join(
            f"{name} {last[f'dev_{name}_{member.metric}']:.4f}" for name, member in zip(self.names, self.members)
        )
        console.print(f"epoch {epoch + 1}: dev {scores}; mean {last['dev_mean']:.4f}", markup=False, highlight=False)
        self.say_early_stopping()

    def finish(self, context: RunContext, step: int) -> Path:
        """The best evaluation's checkpoints (or the last ones), result.json with every task's scores, each task's
        model card."""
        recipe, accelerator, best, run_dir = self.recipe, self.accelerator, self.best, context.run_dir
        checkpoint = self.kept_checkpoint(run_dir)
        if accelerator.is_main_process:
            result = self._result(step)
            (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
            write_task_cards(checkpoint, self.members, self.names, result, run_dir)
            which = (
                f"best dev {self.metric} {best.scores['dev_' + self.metric]:.4f} at step {best.step}"
                if recipe.keep_best
                else "after the last step"
            )
            console.print(
                f"checkpoints of {len(self.names)} tasks ({which}) saved to {checkpoint}/TASK", soft_wrap=True
            )
        return checkpoint

    def _result(self, step: int) -> dict:
        """result.json: the run's selection and, per task, its main metric and scores at the saved and last
        evaluations."""
        best, saved = self.best, "best" if self.recipe.keep_best else "last"
        tasks = {}
        for name, member in zip(self.names, self.members):
            tasks[name] = {"kind": member.spec.kind, "main_metric": member.metric, "saved": saved,
                           "best_step": best.step, "best": task_scores(best.scores, name), "last_step": step,
                           "last": task_scores(best.last, name)}  # fmt: skip
        return {
            "main_metric": self.metric, "saved": saved, "best_step": best.step, "best": best.scores, "last_step": step,
            "last": best.last, "tasks": tasks,
        }  # fmt: skip


def task_scores(scores: dict[str, float], name: str) -> dict[str, float]:
    """Task `name`'s scores of an evaluation (dev_NAME_METRIC), named as its own run names them (dev_METRIC)."""
    prefix = f"dev_{name}_"
    return {f"dev_{key.removeprefix(prefix)}": value for key, value in scores.items() if key.startswith(prefix)}
