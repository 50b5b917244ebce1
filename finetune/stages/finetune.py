"""`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's three techniques.

The run of every task kind is kinds/fine_tuning.py's (setup -> train -> save), with its kind's parts
(kinds/K/fine_tuning.py); this module holds the command, which asks the task's kind for its job (kinds/registry.py).
With `seeds`, the whole stage runs once per seed, with `draws` once per draw of the labelled rows and seed, and the
dev scores are summarised across the runs (stages/seeds.py); with `unlabelled_text`, each run self-trains in rounds
(stages/self_training.py); with `distillation`, a teacher labels it instead (kinds/distillation.py). `resume=True`
continues from the newest periodic checkpoint (`checkpoint_every`) bit for bit: weights, optimizer,
random states, unfreezing stage, data position, best score so far (and its weights), patience.
"""

from __future__ import annotations

import functools
from pathlib import Path

from finetune.data.examples import TaskExamples
from finetune.data.run_data import staged_task
from finetune.kinds.fine_tuning import RESULT_FILE
from finetune.kinds.labelled_rows import check_draws
from finetune.kinds.registry import kind_named
from finetune.recipes import FinetuneRecipe
from finetune.run_dir import guarded_stage
from finetune.stages.seeds import run_each, several_runs
from finetune.stages.self_training import read_unlabelled, run_self_training, self_training_plan
from finetune.training.driver import run_training
from finetune.training.techniques import describe_backbone, resolve_techniques


@guarded_stage
def run_finetune(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """Run the stage (once, or once per seed or draw x seed); returns the checkpoint folder (the run directory of
    several runs).

    `resume`: continue a stopped run from its newest periodic checkpoint; of several runs, finished runs are kept.
    A custom task of `source: hub` reads its dataset's rows, written to RUN_DIR/data first (kept by --resume).
    The techniques the recipe leaves open are decided by the backbone first (training/techniques.py), so the saved
    recipe, the model card and a resumed run's check all see the values in force.
    """
    recipe = staged_task(recipe, resume=resume)  # source hub: the dataset's rows written to RUN_DIR/data, read there
    recipe = resolve_techniques(
        recipe, describe_backbone(recipe.model.checkpoint, recipe.model.trust_remote_code)
    ).recipe
    if recipe.draws is not None:
        check_draws(recipe)  # every draw's rows, before the first run trains
    unlabelled = read_unlabelled(recipe)  # read once for every run, before any folder is made
    run_one = functools.partial(run_single_seed, unlabelled=unlabelled)
    if several_runs(recipe):
        return run_each(recipe, run_one, RESULT_FILE, resume)
    return run_one(recipe, resume)


def run_single_seed(recipe: FinetuneRecipe, resume: bool = False, unlabelled: TaskExamples | None = None) -> Path:
    """One fine-tuning run (or the rest of a stopped one, `resume`), self-trained in rounds where `unlabelled` text
    and the recipe say so; returns the checkpoint folder."""
    job = kind_named(recipe.task.kind).fine_tuning(recipe)
    if recipe.distillation is not None:  # the teacher labels the unlabelled text (kinds/distillation.py)
        job.distill_unlabelled = unlabelled
        return run_training(job, resume)
    plan = self_training_plan(recipe, unlabelled)
    if plan is not None and plan.choice.rounds > 0:
        return run_self_training(recipe, plan, resume)
    return run_training(job, resume)
