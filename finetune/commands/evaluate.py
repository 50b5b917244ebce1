"""`finetune eval`: score fine-tuned checkpoints; write report.json and report.md.

Two shapes of recipe. `task` + `models`: each model scored on one split of one task, by the task's kind
(kinds/K/evaluation.py; the sequence classifiers' also scores `ensembles`). `tasks`: GLUE
tasks mapped to checkpoints (several runs or seeds are aggregated): dev scores per task, the GLUE
score under each convention, the tasks missing and, with `submission`, the leaderboard archive
predicted by each task's best checkpoint on dev. Every file is read before any model runs, and the
run directory is written only once everything has worked.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

from finetune.console import console
from finetune.data.examples import TaskExamples
from finetune.data.run_data import staged_task
from finetune.data.task_files import read_labelled_split, read_task_split
from finetune.errors import UserError, recipe_key
from finetune.glue.report import glue_report_markdown
from finetune.glue.score import glue_scores
from finetune.glue.specs import GLUE_TASKS, predicted_with
from finetune.glue.submission import missing_submission_tasks, validate_submission, write_submission
from finetune.inference.calibration import temperature_of
from finetune.inference.ensemble import check_one_task, ensemble_outputs
from finetune.inference.predict import example_logits, logits_to_predictions
from finetune.kinds.classification.evaluation import named_finetuned
from finetune.kinds.evaluation import one_task
from finetune.kinds.registry import kind_of
from finetune.models.hub import HUB_NAME, load_tokenizer, resolve_checkpoint
from finetune.recipes import EvalRecipe, GlueTaskEntry
from finetune.reporting.eval_report import write_report
from finetune.run_dir import check_run_dir_free, guarded_stage, prepare_run_dir
from finetune.stages.seeds import summarise_values
from finetune.tasks.metrics import compute_metrics
from finetune.tasks.specs import TaskSpec, task_spec
from finetune.training.checkpoints import checkpoint_reading
from finetune.training.driver import processes_ready

SUBMISSION_FILE = "submission.zip"  # with submission: the leaderboard archive


@guarded_stage
def run_eval(recipe: EvalRecipe) -> dict:
    """Score the recipe's checkpoints (one task, or a map of GLUE tasks); returns the report written."""
    recipe = staged_task(recipe)  # a custom task of source hub: its dataset's rows written to RUN_DIR/data
    check_run_dir_free(recipe)
    accelerator = processes_ready(Accelerator(cpu=recipe.device == "cpu" or not torch.cuda.is_available()))
    return run_glue_eval(recipe, accelerator) if recipe.tasks is not None else run_task_eval(recipe, accelerator)


def predict(
    accelerator, model, tokenizer, spec: TaskSpec, examples: TaskExamples, max_length: int, batch_size: int
) -> np.ndarray:
    """Class indices (or scores) of a model for every example, in order."""
    return logits_to_predictions(spec, example_logits(accelerator, model, tokenizer, examples, max_length, batch_size))


def run_task_eval(recipe: EvalRecipe, accelerator) -> dict:
    """One task: its kind's evaluation (kinds/K/evaluation.py), models (and, for the sequence classifiers,
    ensembles) scored on a split."""
    spec = task_spec(one_task(recipe))
    return kind_of(spec).evaluate(recipe, spec, accelerator)


# ---------------------------------------------------------------------------------------------
# GLUE: a map of tasks to checkpoints
# ---------------------------------------------------------------------------------------------


@dataclass
class GlueTask:
    """A task of the map: the checkpoints of its model and the data of every task that model predicts."""

    name: str
    checkpoints: list[str]
    specs: dict[str, TaskSpec]  # this task and those its model also predicts (mnli: mnli-mm, ax)
    dev: dict[str, TaskExamples]  # by task, for the tasks with a dev split
    test: dict[str, TaskExamples]  # by task, with submission: the test files present
    ensemble: list[str]  # instead of checkpoints: members averaged into one model


def read_glue_task(recipe: EvalRecipe, name: str) -> GlueTask:
    """The task's dev files (and test files for a submission); a missing test file leaves its task out."""
    entry = glue_tasks(recipe)[name]
    specs, dev, test = {}, {}, {}
    for spec in predicted_with(name):
        spec, data_dir = task_data(recipe, entry, spec)
        files = spec.files
        assert files is not None  # every GLUE task names its files
        specs[spec.name] = spec
        if "dev" in files:
            dev[spec.name] = read_labelled_split(spec, data_dir, "dev")
        if recipe.submission and spec.submission_file and (data_dir is None or (data_dir / files["test"]).is_file()):
            test[spec.name] = read_task_split(spec, data_dir, "test")
    return GlueTask(name, list(entry.checkpoints), specs, dev, test, list(entry.ensemble or []))


def task_data(recipe: EvalRecipe, entry: GlueTaskEntry, spec: TaskSpec) -> tuple[TaskSpec, Path | None]:
    """Where a task of the map reads its files: the hub (no folder), its own data_dir, or its folder in glue_dir."""
    if recipe.source == "hub":
        return replace(spec, source="hub"), None
    if entry.data_dir is not None:
        return spec, Path(entry.data_dir)
    # EvalRecipe's validator: glue_dir where a task has no data_dir; every GLUE task has its folder
    assert recipe.glue_dir is not None and spec.glue_folder is not None
    return spec, Path(recipe.glue_dir) / spec.glue_folder


def tasks_present(recipe: EvalRecipe, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """allow_incomplete: the listed tasks whose dev files and checkpoints are all there, and why each other one is
    left out (announced in one line). A checkpoint folder that exists but is broken still fails: that is a mistake
    to fix, not a task not trained yet."""
    left_out = {name: reason for name in names if (reason := absent_part(recipe, name))}
    present = [name for name in names if name not in left_out]
    if left_out:
        reasons = "; ".join(f"{name} ({why})" for name, why in left_out.items())
        console.print(f"allow_incomplete: left out {reasons}", soft_wrap=True, markup=False)  # one line, as written
    if not present:
        raise UserError("tasks: no task has both its dev data and its checkpoints; nothing to score")
    return present, left_out


def absent_part(recipe: EvalRecipe, name: str) -> str | None:
    """What a listed task lacks to be scored (its first missing checkpoint or dev file), or None."""
    entry = glue_tasks(recipe)[name]
    for checkpoint in entry.checkpoints + list(entry.ensemble or []):
        if not Path(checkpoint).exists() and not HUB_NAME.match(checkpoint):
            return f"no checkpoint {checkpoint}"
    for spec in predicted_with(name):
        spec, data_dir = task_data(recipe, entry, spec)
        assert spec.files is not None  # every GLUE task names its files
        if data_dir is not None and "dev" in spec.files and not (data_dir / spec.files["dev"]).is_file():
            return f"no dev file {data_dir / spec.files['dev']}"
    return None


def glue_tasks(recipe: EvalRecipe) -> dict[str, GlueTaskEntry]:
    """`tasks` of a GLUE recipe (run_eval sends a recipe without them to run_task_eval)."""
    assert recipe.tasks is not None
    return recipe.tasks


def run_glue_eval(recipe: EvalRecipe, accelerator) -> dict:
    """Dev scores of every task's checkpoints, the GLUE scores, and with `submission` the archive."""
    # 1. read everything that can fail on user input before any model runs
    names = [name for name in GLUE_TASKS if name in glue_tasks(recipe)]
    left_out: dict[str, str] = {}
    if recipe.allow_incomplete:
        names, left_out = tasks_present(recipe, names)
    tasks = [read_glue_task(recipe, name) for name in names]
    if recipe.submission:
        missing = missing_submission_tasks([spec_name for task in tasks for spec_name in task.test])
        if missing and not recipe.allow_incomplete:
            raise UserError(
                f"submission: no test predictions for {', '.join(missing)} (no checkpoint or no test "
                "file); set allow_incomplete=true to write the archive without them"
            )
    for task in tasks:
        for checkpoint in task.checkpoints + task.ensemble:
            with recipe_key(f"tasks.{task.name}"):
                resolve_checkpoint(checkpoint)
        check_one_task(f"tasks.{task.name}.ensemble", task.ensemble)

    # 2. every checkpoint on the dev files; the best one (first metric of the task), or the ensemble, predicts the
    # test files
    results: dict[str, dict] = {}  # by task (and those its model also predicts)
    submitted, test_predictions = {}, {}
    for task in tasks:
        dev = {(spec_name, "dev"): examples for spec_name, examples in task.dev.items()}
        test = {(spec_name, "test"): examples for spec_name, examples in task.test.items()}
        score = score_ensemble if task.ensemble else score_runs
        predictions, predicted_by = score(recipe, accelerator, task, dev, test, results)
        for spec_name, examples in task.test.items():
            test_predictions[spec_name] = (examples.ids, predictions[spec_name, "test"])
            submitted[spec_name] = predicted_by

    # 3. the GLUE scores from the mean over runs, the archive, the report
    report = {
        "split": "dev",
        "tasks": results,
        "glue_scores": glue_scores(
            {
                name: {metric: summary["mean"] for metric, summary in result["summary"].items()}
                for name, result in results.items()
            }
        ),
        "missing_tasks": [name for name in GLUE_TASKS if not any(name in task.specs for task in tasks)],
        "left_out": left_out,
        "submission": None,
    }
    if not accelerator.is_main_process:
        return report
    with tempfile.TemporaryDirectory() as scratch:
        if recipe.submission:
            report["submission"] = build_submission(
                Path(scratch) / SUBMISSION_FILE, tasks, test_predictions, submitted, recipe.allow_incomplete
            )
        run_dir = prepare_run_dir(recipe)
        if recipe.submission:
            (Path(scratch) / SUBMISSION_FILE).replace(run_dir / SUBMISSION_FILE)
    write_report(run_dir, report, glue_report_markdown(report))
    return report


def score_runs(
    recipe: EvalRecipe, accelerator, task: GlueTask, dev: dict, test: dict, results: dict
) -> tuple[dict[tuple[str, str], np.ndarray], str]:
    """Each run's dev scores into `results` (per task it predicts); the best run's test predictions, and its name."""
    single = len(task.checkpoints) == 1  # the best by definition: dev and test in one pass
    runs: dict[str, list[dict]] = {spec_name: [] for spec_name in task.dev}
    for checkpoint in task.checkpoints:
        predictions = predict_task(recipe, accelerator, task, checkpoint, {**dev, **test} if single else dev)
        for spec_name, examples in task.dev.items():
            scores = compute_metrics(task.specs[spec_name], predictions[spec_name, "dev"], dev_labels(examples))
            runs[spec_name].append({"checkpoint": checkpoint, **scores})
    for spec_name, task_runs in runs.items():
        results[spec_name] = summarise_runs(task.specs[spec_name], task_runs, len(task.dev[spec_name].texts))
    main_metric = task.specs[task.name].main_metric
    best = max(runs[task.name], key=lambda run: run[main_metric])["checkpoint"]
    if test and not single:
        predictions = predict_task(recipe, accelerator, task, best, test)
    return predictions, best


def score_ensemble(
    recipe: EvalRecipe, accelerator, task: GlueTask, dev: dict, test: dict, results: dict
) -> tuple[dict[tuple[str, str], np.ndarray], str]:
    """The ensemble's dev scores (the task's result, as one run) and each member's into `results`; the ensemble's
    test predictions, and its name."""

    def as_predictions(outputs: dict) -> dict:
        return {key: logits_to_predictions(task.specs[key[0]], value) for key, value in outputs.items()}

    members = [task_outputs(recipe, accelerator, task, checkpoint, {**dev, **test}) for checkpoint in task.ensemble]
    predictions = as_predictions(
        {key: ensemble_outputs(task.specs[key[0]], [outputs[key] for outputs in members]) for key in members[0]}
    )
    member_predictions = [as_predictions(outputs) for outputs in members]
    for spec_name, examples in task.dev.items():
        spec = task.specs[spec_name]
        scores = [
            compute_metrics(spec, found[spec_name, "dev"], dev_labels(examples))
            for found in (predictions, *member_predictions)
        ]
        results[spec_name] = summarise_runs(spec, [{"ensemble": task.ensemble, **scores[0]}], len(examples.texts))
        results[spec_name]["members"] = [
            {"checkpoint": checkpoint, **member_scores} for checkpoint, member_scores in zip(task.ensemble, scores[1:])
        ]
    return predictions, "ensemble of " + " + ".join(task.ensemble)


def dev_labels(examples: TaskExamples) -> np.ndarray:
    """The labels of a dev split (read_labelled_split refuses one without them)."""
    assert examples.labels is not None
    return examples.labels


def predict_task(
    recipe: EvalRecipe, accelerator, task: GlueTask, checkpoint: str, splits: dict[tuple[str, str], TaskExamples]
) -> dict[tuple[str, str], np.ndarray]:
    """One checkpoint's predictions for the examples of each (task, split) in `splits`."""
    return {
        (spec_name, split): logits_to_predictions(task.specs[spec_name], outputs)
        for (spec_name, split), outputs in task_outputs(recipe, accelerator, task, checkpoint, splits).items()
    }


def task_outputs(
    recipe: EvalRecipe, accelerator, task: GlueTask, checkpoint: str, splits: dict[tuple[str, str], TaskExamples]
) -> dict[tuple[str, str], np.ndarray]:
    """One checkpoint's logits (regression: scores) for the examples of each (task, split) in `splits`, over its
    calibration temperature (an ensemble averages its members' probabilities as each predicts them)."""
    key = f"tasks.{task.name}"
    console.print(f"{task.name}: predicting {', '.join(f'{name} {split}' for name, split in splits)} with {checkpoint}")
    # The stored label mapping is checked against the task; the tasks it also predicts share its labels.
    model = named_finetuned(checkpoint, task.specs[task.name], key, recipe.trust_remote_code)
    with recipe_key(key):
        tokenizer = load_tokenizer(checkpoint, trust_remote_code=recipe.trust_remote_code)
    reading = checkpoint_reading(checkpoint, recipe.max_length)  # as it was trained, unless max_length is given
    return {
        (spec_name, split): example_logits(
            accelerator, model, tokenizer, examples, reading, recipe.batch_size, name=f"{spec_name} {split}"
        )
        / temperature_of(model.config)
        for (spec_name, split), examples in splits.items()
    }


def summarise_runs(spec: TaskSpec, runs: list[dict], examples: int) -> dict:
    """A task's dev result: every run's scores and, per metric, their mean, median and spread."""
    return {
        "display_name": spec.display_name,
        "examples": examples,
        "metrics": list(spec.metrics),
        "runs": runs,
        "summary": {metric: summarise_values([run[metric] for run in runs]) for metric in spec.metrics},
    }


def build_submission(
    path: Path, tasks: list[GlueTask], predictions: dict, submitted: dict[str, str], allow_incomplete: bool
) -> dict:
    """Write the archive and check it against the test files it was predicted from."""
    with recipe_key("submission"):
        missing = write_submission(path, predictions, allow_incomplete)
    test_ids = {spec_name: examples.ids for task in tasks for spec_name, examples in task.test.items()}
    check = validate_submission(path, test_ids)
    if check.problems:  # e.g. a test file whose index repeats
        raise UserError(f"submission: the archive fails validation: {'; '.join(check.problems)}")
    return {
        "archive": SUBMISSION_FILE,
        "files": {
            GLUE_TASKS[name].submission_file: {
                "task": name,
                "checkpoint": submitted[name],
                "rows": len(predictions[name][0]),
            }
            for name in GLUE_TASKS
            if name in predictions
        },
        "missing": missing,
    }
