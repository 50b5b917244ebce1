"""`finetune search`: a hyperparameter search over a finetune recipe's keys with optuna.

Each trial is an ordinary run folder (SEARCH_DIR/trial-000, ...: the recipe with the trial's values as overrides),
drawn by a seeded TPE sampler; a median pruner compares the dev metric at each evaluation with the earlier trials'
at the same step and stops a trial that falls behind (the trial's folder keeps its metrics up to there; the trial
is marked pruned). The study lives in SEARCH_DIR/study.db (sqlite), so `--resume` continues a stopped search to its
number of trials (a trial that was running when it stopped continues from its newest periodic checkpoint, or
starts again). After every trial: SEARCH_DIR/search.md (every trial's values and score; printed at the end),
search.json and search.png (the score per trial and the best so far); at the end best.yaml (the best trial's complete
recipe, to run with `finetune finetune`).

The score is the dev metric of the task's first metric (or the recipe's `metric_for_best`), of the saved checkpoint
(the best evaluation with keep_best); metrics read as losses (loss, mse, ...) are minimized, the others maximized.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.console import console
from finetune.errors import RunFailed, UserError
from finetune.kinds.fine_tuning import RESULT_FILE
from finetune.recipes import load_recipe
from finetune.recipes.loader import recipe_to_yaml
from finetune.stages.finetune import run_finetune
from finetune.stages.search_report import search_markdown, write_search_plot
from finetune.stages.search_space import Dimension, overrides_for, read_space, yaml_value
from finetune.training.checkpoints import latest_training_checkpoint
from finetune.training.listeners import evaluations_reported_to

STUDY_FILE, SUMMARY_MARKDOWN, SUMMARY_JSON, PLOT_FILE, BEST_RECIPE = (
    "study.db",
    "search.md",
    "search.json",
    "search.png",
    "best.yaml",
)
LOSS_LIKE = ("loss", "mse", "rmse", "mae", "perplexity", "error")
INSTALL_HINT = "`finetune search` needs optuna: pip install 'finetune[search]' (or pip install 'optuna>=4')"


def optimized_metric(recipe) -> tuple[str, str]:
    """The dev metric a search (or cv) scores a run by, and its direction (maximize or minimize)."""
    name = recipe.selection_metric()  # metric_for_best, else the task's first metric: as keep_best picks
    name = str(name).removeprefix("dev_")
    return name, ("minimize" if is_loss_like(name) else "maximize")


def is_loss_like(metric: str) -> bool:
    """A metric that is better lower (a loss or an error)."""
    return any(metric == word or metric.endswith("_" + word) for word in LOSS_LIKE)


def refuse_several_processes(command: str) -> None:
    """Search and cv run their trials one after another in one process (a trial may still use one GPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(
            f"`finetune {command}` runs in one process: start it with `finetune {command} ...`, not `accelerate launch`"
        )


def run_score(run_dir: Path, metric: str) -> float:
    """The dev `metric` of a finished run's saved checkpoint (result.json: the best evaluation with keep_best)."""
    result = json.loads((run_dir / RESULT_FILE).read_text(encoding="utf-8"))
    scores = result["best" if result["saved"] == "best" else "last"]
    if f"dev_{metric}" not in scores:
        raise UserError(f"{run_dir}: no dev {metric} among the run's scores ({', '.join(scores)})")
    return float(scores[f"dev_{metric}"])


@dataclass
class Search:
    """A search's inputs: the recipe file and overrides each trial starts from, the space, and where it goes."""

    recipe_path: Path
    overrides: list[str]
    space_path: Path
    trials: int
    run_dir: Path | None = None  # default: the recipe's run_dir + "-search"
    resume: bool = False
    baseline: bool = False  # trial 0: the recipe's own values of the space's keys
    seed: int | None = None  # the sampler's; default: the recipe's seed
    pruner: Any = None  # default: optuna's MedianPruner
    dimensions: list[Dimension] = field(default_factory=list)  # the space, read: empty reads space_path

    def recipe(self, extra: list[str]):
        return load_recipe(self.recipe_path, [*self.overrides, *extra], expected_stage="finetune")


def run_search(search: Search) -> Path:
    """Run (or `resume`) the search; returns its folder."""
    optuna = _optuna()
    refuse_several_processes("search")
    recipe = search.recipe([])
    if recipe.seeds is not None:
        raise UserError(f"recipe {search.recipe_path}: seeds: a search trial is one run; remove seeds (or use cv)")
    if recipe.draws is not None:
        raise UserError(f"recipe {search.recipe_path}: draws: a search trial is one run; remove draws")
    if not search.dimensions:  # the command line reads the space before it imports this module (and torch)
        search.dimensions = read_space(search.space_path, "finetune", lambda override: search.recipe([override]))
    folder = Path(search.run_dir or f"{recipe.run_dir}-search")
    study_path = folder / STUDY_FILE
    if search.resume and not study_path.is_file():
        raise UserError(f"--resume: {folder} holds no search to continue (no {STUDY_FILE})")
    if not search.resume and study_path.is_file():
        raise UserError(f"{folder} holds a search already: continue it with --resume, or choose another --run-dir")
    metric, direction = optimized_metric(recipe)
    folder.mkdir(parents=True, exist_ok=True)
    seed = recipe.seed if search.seed is None else search.seed
    optuna.logging.set_verbosity(logging.WARNING)
    study = optuna.create_study(
        study_name="search",
        storage=f"sqlite:///{study_path.resolve()}",
        load_if_exists=search.resume,
        direction=direction,
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=search.pruner or optuna.pruners.MedianPruner(),
    )
    _check_same_search(study, search, folder)
    if search.resume:  # a sampler seeded as at the start would draw the first trials' values again
        study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials))
        _continue_stopped_trials(study, search, folder, metric)
    if search.baseline and not study.trials:
        study.enqueue_trial(_recipe_values(recipe, search.dimensions))
    states = optuna.trial.TrialState
    counted = (states.COMPLETE, states.PRUNED, states.FAIL)  # every trial that ended: a diverging space still ends
    console.print(f"search: {metric} ({direction}) over {', '.join(d.key for d in search.dimensions)} into {folder}")
    while len(study.get_trials(deepcopy=False, states=counted)) < search.trials:
        _run_trial(study, study.ask(_distributions(search.dimensions)), search, folder, metric)
        _write_summary(study, search, folder, metric, direction)  # after each trial: the search so far
    return _finish(study, search, folder, metric, direction)


def _check_same_search(study, search: Search, folder: Path) -> None:
    """A new study records its space and overrides; a resumed one must have the same (the trials' values and scores
    would mean something else)."""
    started = {
        "space": {dimension.key: dimension.describe() for dimension in search.dimensions},
        "overrides": search.overrides,
    }
    if not search.resume:
        for name, value in started.items():
            study.set_user_attr(name, value)
        return
    for name, value in started.items():
        before = study.user_attrs.get(name)
        if before is not None and before != value:
            raise UserError(
                f"--resume: the search in {folder} started with other {name} ({before}); "
                "resume it with the same ones, or start a new search in another --run-dir"
            )


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return optuna


def _continue_stopped_trials(study, search: Search, folder: Path, metric: str) -> None:
    """Trials a stopped search left running: each continues in its folder (from its newest periodic checkpoint, or
    anew), or, finished before the search stopped, is scored."""
    optuna = _optuna()
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        console.print(f"trial {frozen.number} was stopped: it continues")
        _run_trial(study, optuna.trial.Trial(study, frozen._trial_id), search, folder, metric, resume=True)


def _recipe_values(recipe, dimensions: list[Dimension]) -> dict[str, Any]:
    """The recipe's own values of the space's keys (the baseline trial), each one the space can draw."""
    values, data = {}, recipe.model_dump(mode="json")
    for dimension in dimensions:
        value: Any = data
        for part in dimension.key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            example = dimension.choices[0] if dimension.choices is not None else dimension.low
            raise UserError(
                f"--baseline: the recipe leaves {dimension.key} unset (null: a default decided later); give the "
                f"baseline its value as an override, e.g. {dimension.key}={yaml_value(example)}"
            )
        if not dimension.contains(value):
            raise UserError(
                f"--baseline: the recipe's {dimension.key} ({value}) is not in the space ({dimension.describe()})"
            )
        values[dimension.key] = value
    return values


def _distributions(dimensions: list[Dimension]) -> dict[str, Any]:
    distributions = _optuna().distributions
    result: dict[str, Any] = {}
    for dimension in dimensions:
        if dimension.choices is not None:
            result[dimension.key] = distributions.CategoricalDistribution(dimension.choices)
        elif dimension.is_int:
            result[dimension.key] = distributions.IntDistribution(
                int(dimension.low or 0), int(dimension.high or 0), log=dimension.log, step=int(dimension.step or 1)
            )
        else:
            result[dimension.key] = distributions.FloatDistribution(
                float(dimension.low or 0), float(dimension.high or 0), log=dimension.log, step=dimension.step
            )
    return result


def _run_trial(study, trial, search: Search, folder: Path, metric: str, resume: bool = False) -> None:
    """Run a trial's fine-tuning with its drawn values (pruned when the pruner says so), tell the study its score.

    `resume`: the trial was running when its search stopped: a finished run is scored, a run with a periodic
    checkpoint continues from it, any other starts again."""
    optuna = _optuna()
    run_dir = folder / f"trial-{trial.number:03d}"
    overrides = overrides_for(trial.params)
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("overrides", overrides)
    console.print(f"[bold]trial {trial.number}[/bold]: {' '.join(overrides)}")
    recipe = search.recipe([*overrides, f"run_dir={run_dir}", f"overwrite={str(resume).lower()}"])
    from_checkpoint = resume and latest_training_checkpoint(run_dir) is not None

    def prune_if_behind(step: int, record: dict[str, Any]) -> None:
        if f"dev_{metric}" in record:
            trial.report(float(record[f"dev_{metric}"]), step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step}")

    try:
        with evaluations_reported_to(prune_if_behind):
            if not (resume and (run_dir / RESULT_FILE).is_file()):
                run_finetune(
                    recipe.model_copy(update={"overwrite": False}) if from_checkpoint else recipe, from_checkpoint
                )
    except optuna.TrialPruned as pruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        console.print(f"trial {trial.number} {pruned}: dev {metric} behind the median of the earlier trials")
        return
    except RunFailed as error:  # e.g. a diverged LR: the search goes on without this trial
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        console.print(f"trial {trial.number} failed: {error}", markup=False)
        return
    score = run_score(run_dir, metric)
    study.tell(trial, score)
    console.print(f"trial {trial.number}: dev {metric} {score:.4f}")


def _write_summary(study, search: Search, folder: Path, metric: str, direction: str) -> str:
    """search.md, search.json and search.png of the trials so far; the Markdown."""
    optuna = _optuna()
    rows = [
        {
            "trial": trial.number,
            "state": trial.state.name.lower(),
            "value": trial.value,  # a pruned trial's: its last reported dev score (optuna's rule)
            "stopped_at_step": trial.last_step if trial.state == optuna.trial.TrialState.PRUNED else None,
            "params": trial.params,
            "run_dir": trial.user_attrs.get("run_dir"),
        }
        for trial in study.get_trials(deepcopy=False)
    ]
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    best = study.best_trial if completed else None
    summary = {
        "metric": f"dev_{metric}",
        "direction": direction,
        "space": {dimension.key: dimension.describe() for dimension in search.dimensions},
        "best_trial": best.number if best else None,
        "best_value": best.value if best else None,
        "best_params": best.params if best else None,
        "trials": rows,
    }
    (folder / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    markdown = search_markdown(summary)
    (folder / SUMMARY_MARKDOWN).write_text(markdown, encoding="utf-8")
    write_search_plot(summary, folder / PLOT_FILE)
    return markdown


def _finish(study, search: Search, folder: Path, metric: str, direction: str) -> Path:
    """The summary (printed) and best.yaml; RunFailed when no trial finished."""
    console.print(
        _write_summary(study, search, folder, metric, direction), markup=False, highlight=False, soft_wrap=True
    )
    completed = study.get_trials(deepcopy=False, states=(_optuna().trial.TrialState.COMPLETE,))
    best = study.best_trial if completed else None
    if best is None:
        raise RunFailed(f"search {folder}: no trial finished (every one was pruned or failed); see {SUMMARY_MARKDOWN}")
    best_recipe = search.recipe([*overrides_for(best.params), f"run_dir={folder / 'best'}"])
    (folder / BEST_RECIPE).write_text(
        f"# the best trial ({best.number}, dev {metric} {best.value:.4f}) of the search in {folder}\n"
        + recipe_to_yaml(best_recipe),
        encoding="utf-8",
    )
    console.print(f"best recipe written to {folder / BEST_RECIPE}: finetune finetune {folder / BEST_RECIPE}")
    return folder
