"""The stages called from Python (a notebook, a script), as the CLI runs them but without its exits: a recipe (a
file, a shipped recipe's name or a dict) with overrides, in-memory task data, and a RunResult back.

Errors are the toolkit's exceptions, with the CLI's one-line messages: UserError (a mistake in the input), RunFailed
(a run that could not go on), RunInterrupted (Ctrl-C; resume with `resume=True`). Imports are late: `import finetune`
stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from finetune.api.result import RunResult
from finetune.errors import UserError
from finetune.run_dir import CHECKPOINT_DIR

RecipeGiven = Path | str | Mapping[str, Any]
OverridesGiven = list[str] | tuple[str, ...] | Mapping[str, Any] | None


def _loaded(recipe: RecipeGiven, overrides: OverridesGiven, command: str, data_in_run_dir: bool = False) -> Any:
    """The recipe for `command`, validated as the CLI validates it; the libraries' chatter quietened."""
    from finetune.console import quiet_library_chatter
    from finetune.recipes.given import load_given_recipe

    loaded = load_given_recipe(recipe, overrides, command, data_in_run_dir=data_in_run_dir)
    quiet_library_chatter()
    return loaded


def pretrain(recipe: RecipeGiven, overrides: OverridesGiven = None, resume: bool = False) -> RunResult:
    """`finetune pretrain RECIPE [overrides] [--resume]`: a language model; the result's checkpoint is its folder."""
    from finetune.stages.pretrain import run_pretrain

    loaded = _loaded(recipe, overrides, "pretrain")
    return RunResult.of_run(loaded.run_dir, run_pretrain(loaded, resume=resume))


def finetune(
    recipe: RecipeGiven,
    overrides: OverridesGiven = None,
    *,
    train: Any = None,
    dev: Any = None,
    test: Any = None,
    resume: bool = False,
) -> RunResult:
    """`finetune finetune RECIPE [overrides] [--resume]`, the task's splits given as data or read as the recipe says.

    `train`, `dev`, `test`: a pandas DataFrame, a `datasets.Dataset` or a list of dicts with the task's columns
    (text_columns and label_column; test may leave the label out). Given any of them, the task reads its rows from
    RUN_DIR/data, where they are written (the recipe's data_dir is not read): give train and dev. `resume=True`
    continues a stopped run: give the same rows, or none (the written ones are read).
    """
    from finetune.data.run_data import staged_task
    from finetune.stages.finetune import run_finetune

    splits = {name: rows for name, rows in (("train", train), ("dev", dev), ("test", test)) if rows is not None}
    loaded = _loaded(recipe, overrides, "finetune", data_in_run_dir=bool(splits))
    staged = staged_task(loaded, splits, resume)
    return RunResult.of_run(staged.run_dir, run_finetune(staged, resume=resume))


def ulmfit(recipe: RecipeGiven, overrides: OverridesGiven = None, resume: bool = False) -> RunResult:
    """`finetune ulmfit RECIPE [overrides] [--resume]`: the three stages; the result is the classifier's (its
    checkpoint, dev scores and history), with the flow's folder as run_dir and its summary (RUN_DIR/result.json,
    every stage's scores) as report."""
    from finetune.stages.ulmfit import run_ulmfit

    loaded = _loaded(recipe, overrides, "ulmfit")
    return _flow_result(loaded.run_dir, run_ulmfit(loaded, resume=resume))


def _flow_result(run_dir: Path, checkpoint: Path) -> RunResult:
    """A flow's result: its last fine-tuning stage's (`checkpoint`, or with seeds that stage's folder), with the
    flow's folder as run_dir and its summary as report."""
    stage_dir = checkpoint.parent if checkpoint.name == CHECKPOINT_DIR else checkpoint  # seeds: the stage's
    flow = RunResult.of_run(run_dir, None)
    return replace(RunResult.of_run(stage_dir, checkpoint), run_dir=Path(run_dir), report=flow.metrics)


def intermediate(recipe: RecipeGiven, overrides: OverridesGiven = None, resume: bool = False) -> RunResult:
    """`finetune intermediate RECIPE [overrides] [--resume]`: the intermediate task, then the target from its
    encoder (and without it, to compare); the result is the target's (its checkpoint, dev scores and history), with
    the flow's folder as run_dir and its summary (RUN_DIR/result.json, every stage's scores and the gain) as
    report."""
    from finetune.stages.intermediate import run_intermediate

    loaded = _loaded(recipe, overrides, "intermediate")
    return _flow_result(loaded.run_dir, run_intermediate(loaded, resume=resume))


def multitask(recipe: RecipeGiven, overrides: OverridesGiven = None, resume: bool = False) -> RunResult:
    """`finetune multitask RECIPE [overrides] [--resume]`: one encoder, a head per task; the result's checkpoint is
    RUN_DIR/checkpoint (a folder per task in it), its metrics every task's dev scores (dev_TASK_METRIC) and their
    mean (dev_mean) at the kept evaluation."""
    from finetune.stages.multitask import run_multitask

    loaded = _loaded(recipe, overrides, "multitask")
    return RunResult.of_run(loaded.run_dir, run_multitask(loaded, resume=resume))


def evaluate(recipe: RecipeGiven | RunResult, overrides: OverridesGiven = None) -> RunResult:
    """`finetune eval RECIPE [overrides]`; or, given a finished finetune run (its RunResult or folder), its checkpoint
    scored on its own task's dev split (`overrides={"split": "test"}` for another), written to RUN_DIR-eval."""
    from finetune.commands.evaluate import run_eval

    if isinstance(recipe, RunResult):
        recipe = recipe.run_dir
    if not isinstance(recipe, Mapping) and Path(recipe).is_dir():
        recipe = _run_eval_recipe(Path(recipe))
    loaded = _loaded(recipe, overrides, "eval")
    return RunResult.of_evaluation(loaded.run_dir, run_eval(loaded))


def _run_eval_recipe(run_dir: Path) -> dict[str, Any]:
    """An eval recipe scoring a finetune run's checkpoint on its task (as saved in RUN_DIR/recipe.yaml)."""
    from finetune.recipes import load_recipe
    from finetune.run_dir import RECIPE_FILE

    if not (run_dir / RECIPE_FILE).is_file() or not (run_dir / CHECKPOINT_DIR).is_dir():
        raise UserError(f"{run_dir}: not a finished finetune run (no {RECIPE_FILE} and {CHECKPOINT_DIR}/)")
    saved = load_recipe(run_dir / RECIPE_FILE, check_paths=False)
    if saved.stage != "finetune":
        raise UserError(f"{run_dir}: a {saved.stage} run; evaluate scores a finetune run (or takes an eval recipe)")
    task = saved.task.model_dump(mode="json", exclude_none=True)
    return {
        "stage": "eval",
        "run_dir": f"{run_dir}-eval",
        "overwrite": True,  # the run's evaluation, made again each time it is asked for
        "task": task,
        "split": "dev",
        "models": {run_dir.name: str(run_dir / CHECKPOINT_DIR)},
        "device": saved.training.device,
    }
