"""What every flow of stages shares (`finetune ulmfit`, `finetune intermediate`): each stage run by its own stage code
into its folder inside the flow's run_dir, checked before the first one starts, kept, resumed or run anew by
`--resume`, and the flow's summary written at the end.

A flow's recipe gives `stage_recipes()` (section -> the stage's recipe as the flow runs it, None for a stage it
skips), `run_dir` and `overwrite`; its `FlowShape` says the rest: the stages' folders and titles, which stage each
starts from, how to run one, and the summary. Every stage's inputs are read before the first stage starts, so a
broken dev file is not found hours in. A user mistake that only a stage can find keeps the stages finished before
it; `--resume` keeps finished stages (their recipes unchanged), continues the stopped one from its periodic
checkpoint and runs the rest, and a stage runs anew when a stage it starts from does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from accelerate import PartialState

from finetune import run_lock
from finetune.console import console
from finetune.data.pretraining_text import SingleDocumentError
from finetune.data.task_files import read_labelled_split
from finetune.data.task_paths import training_splits
from finetune.errors import UserError, recipe_key
from finetune.recipes import (
    FinetuneRecipe,
    PretrainRecipe,
    TrainingRunRecipe,
    path_problems,
    read_yaml,
    recipe_to_yaml,
    type_label,
)
from finetune.run_dir import (
    METRICS_FILE,
    RECIPE_FILE,
    check_run_dir_free,
    claim_run_dir,
    flatten_keys,
    is_finished,
    prepare_run_dir,
    read_metrics,
    remove_own_entries,
)
from finetune.stages.finetune import RESULT_FILE
from finetune.stages.pretrain import CHECKPOINT_DIR, check_model_fits_in_memory
from finetune.stages.pretrain_data import read_corpus
from finetune.stages.seeds import SUMMARY_JSON, several_runs
from finetune.tasks.specs import task_spec
from finetune.training.checkpoints import latest_training_checkpoint
from finetune.training.techniques import describe_backbone, resolve_techniques

StageAction = Literal["keep", "resume", "run"]


@dataclass(frozen=True)
class FlowShape:
    """What tells one flow from another. `run_stage(section)` is the stage code that runs a section (looked up when
    it runs); `upstream` names the stage whose checkpoint a section starts from; `summarise(recipe)` and
    `summary_line(summary, run_dir)` make the flow's result.json and its last console line; `announce(recipe)`
    says, before the first stage, what the flow takes as given rather than training."""

    name: str  # the recipe's stage, the command
    folders: dict[str, str]  # section -> its folder inside run_dir, in the order the stages run
    titles: dict[str, str]  # section -> what the stage makes
    run_stage: Callable[[str], Callable[..., Path]]
    output: Callable[[Any], Path]  # what `run_flow` returns: the flow's main checkpoint (or run folder)
    summarise: Callable[[Any], dict]
    summary_line: Callable[[dict, Path], str]
    upstream: dict[str, str] = field(default_factory=dict)
    announce: Callable[[Any], None] | None = None


@dataclass
class StagePlan:
    """What the flow does with one stage: keep it (finished before), resume it, or run it (anew)."""

    section: str
    recipe: PretrainRecipe | FinetuneRecipe
    action: StageAction


def run_flow(recipe: Any, shape: FlowShape, resume: bool = False) -> Path:
    """Run the flow (or, `resume`, finish a stopped one); returns `shape.output(recipe)`."""
    # 1. decide and check everything before the first stage starts
    if resume:
        check_flow_resumable(recipe, shape.name)
    else:
        check_run_dir_free(recipe, functools.partial(latest_stage_checkpoint, folders=shape.folders))
    plans = plan_stages(recipe, shape, resume)
    check_inputs_early(plans)
    to_run = [plan for plan in plans if plan.action != "keep"]
    if not to_run and is_finished(recipe.run_dir):  # else it stopped after the last stage, before its summary
        console.print(f"{recipe.run_dir} finished before: nothing to resume")
        return shape.output(recipe)
    # Under several processes only the main one creates (or locks) the folder, after every process has checked it.
    device = (to_run or plans)[0].recipe.training.device
    state = PartialState(cpu=device == "cpu" or not torch.cuda.is_available())
    state.wait_for_everyone()
    main = state.is_main_process
    run_dir = open_flow_dir(recipe, resume, main)
    state.wait_for_everyone()

    # 2. the stages, each by its own stage code; 3. the summary
    if shape.announce is not None:
        shape.announce(recipe)
    try:
        present = [section for section, stage in recipe.stage_recipes().items() if stage is not None]
        last = max(list(shape.folders).index(section) for section in present) + 1  # "stage 2 of 3", a given one too
        for plan in plans:
            run_stage(plan, shape, last)
        if main:
            summary = shape.summarise(recipe)
            (run_dir / RESULT_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
            console.print(shape.summary_line(summary, run_dir))
    except UserError as error:
        raise flow_user_error(error, recipe, shape, resume, main) from None
    finally:
        if main:
            run_lock.release(run_dir)
    return shape.output(recipe)


def plan_stages(recipe: Any, shape: FlowShape, resume: bool) -> list[StagePlan]:
    """Each stage's action: with `resume`, finished stages are kept (unchanged ones only) and the stopped one
    continues; a stage that starts from one that runs runs anew (it would start from a checkpoint that changes)."""
    plans: list[StagePlan] = []
    runs_anew: set[str] = set()
    for section, stage in recipe.stage_recipes().items():
        if stage is None:  # a stage the flow takes as given (ulmfit's general_lm: {checkpoint: PATH})
            continue
        action: StageAction
        anew = not resume or shape.upstream.get(section) in runs_anew
        if not anew and is_finished(stage.run_dir):
            check_unchanged(section, stage)
            action = "keep"
        elif not anew and stage_resumable(stage):
            action = "resume"
        else:
            action = "run"
            # A stopped stage without a checkpoint to continue from, or one after a stage that runs: replaced.
            stage = stage.model_copy(update={"overwrite": recipe.overwrite or resume})
            check_run_dir_free(stage)
            runs_anew.add(section)
        plans.append(StagePlan(section, stage, action))
    return plans


def check_flow_resumable(recipe: Any, name: str) -> None:
    """For `--resume`: run_dir must hold a flow of this kind that no other run is using."""
    path = Path(recipe.run_dir)
    if not (path / RECIPE_FILE).is_file():
        raise UserError(f"--resume: run_dir {path} holds no run to resume (no {RECIPE_FILE})")
    stage = read_yaml(path / RECIPE_FILE).get("stage")
    if stage != name:
        raise UserError(
            f"--resume: run_dir {path} holds a {stage} run, not a {name} flow: run it with `finetune {stage}`"
        )
    run_lock.check_not_locked(path)


def check_unchanged(section: str, stage: TrainingRunRecipe) -> None:
    """A finished stage is kept only if its section still asks for what it did (or the flow would mix recipes).

    The stage's saved recipe is compared as written, not loaded again: a continued model's saved recipe holds the
    architecture keys with their defaults, which a recipe with model.checkpoint may not give.
    """
    path = Path(stage.run_dir)
    run_lock.check_not_locked(path)
    if isinstance(stage, FinetuneRecipe):  # the stage saved its techniques as its backbone decided them
        stage = resolve_techniques(
            stage, describe_backbone(stage.model.checkpoint, stage.model.trust_remote_code)
        ).recipe
    saved = flatten_keys(read_yaml(path / RECIPE_FILE))
    given = flatten_keys(stage.model_dump(mode="json"))
    changed = sorted(
        key for key in given.keys() | saved.keys() if key != "overwrite" and given.get(key) != saved.get(key)
    )
    if changed:
        keys = ", ".join(f"{section}.{key}" for key in changed[:5]) + (
            f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        raise UserError(
            f"--resume: {keys} changed since stage {path} finished; a finished stage is kept only "
            f"unchanged: overwrite=true runs every stage again, or delete {path} to run the flow again "
            "from there"
        )


def stage_resumable(stage: TrainingRunRecipe) -> bool:
    """True when the stage's own `--resume` can continue it: a periodic checkpoint, or (seeds, draws) a started
    run."""
    if several_runs(stage):  # run_each keeps finished runs and continues or restarts the others
        return (Path(stage.run_dir) / RECIPE_FILE).is_file()
    return latest_training_checkpoint(stage.run_dir) is not None


def latest_stage_checkpoint(run_dir: Path, folders: dict[str, str]) -> Path | None:
    """What `--resume` of a stopped flow would keep or continue from: the newest stage's periodic checkpoint or
    finished checkpoint (a seed's too), for the message that refuses a rerun into a used run_dir."""
    for folder in reversed(folders.values()):
        stage_dir = Path(run_dir) / folder
        runs = [*stage_dir.glob("seed-*"), *stage_dir.glob("draw-*/seed-*")]
        for candidate in (stage_dir, *sorted(runs, reverse=True)):
            checkpoint = latest_training_checkpoint(candidate)
            if checkpoint is None and (candidate / CHECKPOINT_DIR).is_dir():
                checkpoint = candidate / CHECKPOINT_DIR
            if checkpoint is not None:
                return checkpoint
    return None


def check_inputs_early(plans: list[StagePlan]) -> None:
    """The cheap checks of what each stage reads and writes, so that a mistake in the last stage's data stops the
    flow before the first ones train for hours, and none leaves the flow's folder behind (the text is read twice)."""
    for plan in plans:
        stage = plan.recipe
        if plan.action != "run":  # kept, or resumed: its inputs were read when it started
            continue
        for key, problem in path_problems(stage):  # e.g. a cache_dir that is a file
            raise UserError(f"{plan.section}.{key}: {problem}")
        if isinstance(stage, PretrainRecipe) and stage.model.checkpoint is None:
            check_model_fits_in_memory(stage)
        if isinstance(stage, PretrainRecipe) and stage.corpus.dataset is None:  # a dataset would be downloaded here
            with recipe_key("corpus.document", SingleDocumentError):
                read_corpus(stage).check()  # text files streamed once: not UTF-8, no text, a single document
        elif isinstance(stage, FinetuneRecipe) and stage.task.data_dir is not None:
            spec = task_spec(stage.task)
            for split in training_splits(stage.task):
                read_labelled_split(spec, stage.task.data_dir, split)


def open_flow_dir(recipe: Any, resume: bool, main: bool) -> Path:
    """Create (or, resuming, lock) the flow's folder and save the flow recipe: as this run uses it (a resumed flow
    may have changed the sections of the stages it had not finished)."""
    if not resume:
        return prepare_run_dir(recipe, main)
    path = claim_run_dir(recipe, main)
    if main:
        (path / RECIPE_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")
    return path


def run_stage(plan: StagePlan, shape: FlowShape, stages: int) -> Path:
    """One stage (of `stages`) by its own code (`run_pretrain` or `run_finetune`, which save their recipe in their
    folder)."""
    number = list(shape.folders).index(plan.section) + 1
    heading = (
        f"[bold]{shape.name} stage {number} of {stages}: {shape.titles[plan.section]}[/bold] ({plan.recipe.run_dir})"
    )
    if plan.action == "keep":
        console.print(f"{heading}: finished before, kept")
        return Path(plan.recipe.run_dir) / CHECKPOINT_DIR
    console.print(heading + (": resuming" if plan.action == "resume" else ""))
    return shape.run_stage(plan.section)(plan.recipe, resume=plan.action == "resume")


def flow_user_error(error: UserError, recipe: Any, shape: FlowShape, resume: bool, main: bool) -> UserError:
    """A user mistake found by a stage: a fresh flow that finished no stage leaves nothing behind; one that did
    keeps its finished stages, and the message says how to continue from them."""
    run_dir = Path(recipe.run_dir)
    stage_dirs = [run_dir / folder for folder in shape.folders.values()]
    if any(is_finished(folder) for folder in stage_dirs):
        return UserError(f"{error} (the finished stages are kept: fix this and continue with --resume)")
    if main and not resume and run_dir.is_dir() and not any(folder.exists() for folder in stage_dirs):
        run_lock.release(run_dir)
        remove_own_entries(run_dir)
        if not any(run_dir.iterdir()):
            run_dir.rmdir()
    return error


def fine_tuned_output(stage: FinetuneRecipe) -> Path:
    """What a fine-tuning stage leaves: its checkpoint folder, or with seeds (draws) its run directory (a checkpoint
    per seed-N, or draw-D/seed-S)."""
    run_dir = Path(stage.run_dir)
    return run_dir if several_runs(stage) else run_dir / CHECKPOINT_DIR


def last_validation(run_dir: Path) -> dict:
    """A language model's last evaluation in metrics.jsonl: validation loss, perplexity, accuracy."""
    evaluations = [record for record in read_metrics(run_dir / METRICS_FILE) if record.get("phase") == "eval"]
    if not evaluations:
        return {}
    return {key: value for key, value in evaluations[-1].items() if key not in ("phase", "epoch")}


def fine_tuned_scores(stage: FinetuneRecipe) -> dict:
    """A fine-tuning stage's saved checkpoint's dev scores (result.json), or with seeds (draws) the mean over the
    runs (seeds.json) and each metric's summary over them (`spread`)."""
    main_metric = stage.selection_metric()
    run_dir = Path(stage.run_dir)
    if several_runs(stage):
        seeds = json.loads((run_dir / SUMMARY_JSON).read_text(encoding="utf-8"))
        return {
            "checkpoint": None,
            "checkpoints": [str(run_dir / run / CHECKPOINT_DIR) for run in seeds["runs"]],
            "main_metric": main_metric,
            "dev": {name: values["mean"] for name, values in seeds["metrics"].items()},
            "dev_over": "mean of the seeds",
            "spread": seeds["metrics"],
        }
    result = json.loads((run_dir / RESULT_FILE).read_text(encoding="utf-8"))
    return {"main_metric": main_metric, "dev": result["best" if result["saved"] == "best" else "last"]}


def section_key_rows(recipe_class: Any, sections: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """Rows for `finetune recipes --keys FLOW`: the flow's own keys, and each section (`sections`: its name -> the
    stage whose recipe it is) pointing at its stage's keys (listing them again under every section would triple a
    long table)."""
    rows = []
    for name, described in recipe_class.model_fields.items():
        if name == "task":  # a whole task section: its keys are the finetune recipe's task.*
            keys = f"{described.description}; its keys: finetune recipes --keys finetune"
            rows.append(("task.*", "task section", repr(described.default), keys))
        elif name in sections:
            keys = f"{described.description}; its keys: finetune recipes --keys {sections[name]}"
            rows.append((f"{name}.*", f"{sections[name]} recipe", "(required)", keys))
        else:
            default = "(required)" if described.is_required() else repr(described.default)
            rows.append((name, type_label(described.annotation), default, described.description or ""))
    return rows
