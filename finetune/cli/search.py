"""The commands that run a recipe several times to choose or judge its settings: search and cv."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import OverridesArgument, RecipeArgument, _run_stage
from finetune.errors import UserError

RunDirOption = Annotated[
    Path | None,
    typer.Option(
        "--run-dir",
        help="The folder of the trials (or folds) and the summary; default: the recipe's "
        "run_dir with -search (or -cv) added.",
        show_default=False,
    ),
]


def search(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    space: Annotated[
        Path | None,
        typer.Option(
            "--space",
            help="YAML file: recipe key -> {low: L, high: H[, log: true]} or {choices: [...]}.",
            show_default=False,
        ),
    ] = None,
    trials: Annotated[int, typer.Option("--trials", min=1, help="Trials to run (pruned and failed ones count).")] = 10,
    run_dir: RunDirOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the search in the folder to --trials trials (its study.db).")
    ] = False,
    baseline: Annotated[
        bool, typer.Option("--baseline", help="Trial 0 runs the recipe's own values of the space's keys.")
    ] = False,
) -> None:
    """Search a finetune recipe's keys with optuna: TPE sampling, median pruning at each dev evaluation.

    Each trial is an ordinary run folder (RUN_DIR/trial-000, ...); RUN_DIR/search.md (printed), search.json and
    search.png summarise them and RUN_DIR/best.yaml is the best trial's complete recipe. The study is kept in
    RUN_DIR/study.db: --resume continues a stopped search, or adds trials to a finished one.
    Needs optuna: pip install optuna (the package's search extra).
    """
    from finetune.data.task_paths import check_task_files, training_splits
    from finetune.recipes.given import load_given_recipe
    from finetune.recipes.shipped import resolve_recipe
    from finetune.stages.search_space import read_space

    options = ["--space", str(space), "--trials", str(trials)] + (["--run-dir", str(run_dir)] if run_dir else [])
    options += ["--baseline"] if baseline else []
    again = shlex.join(["finetune", "search", str(recipe), *(overrides or []), *options, "--resume"])

    extra, dimensions = list(overrides or []), []

    def check_value(override: str) -> None:  # the recipe with one of the space's values
        load_given_recipe(recipe, [*extra, override], "search", ("finetune",))

    def check(loaded) -> None:
        if space is None:
            raise UserError("--space: name the search space file, e.g. --space space.yaml (see docs/search.md)")
        check_task_files(loaded.task, training_splits(loaded.task))
        dimensions.extend(read_space(space, "finetune", check_value))

    def run(loaded) -> None:
        from finetune.stages.search import Search, run_search  # after the space is checked: a mistake needs no torch

        assert space is not None  # check refused a search without one
        run_search(
            Search(resolve_recipe(recipe), extra, space, trials, run_dir, resume, baseline, dimensions=dimensions)
        )

    _run_stage("search", recipe, overrides, run, recipe_stages=("finetune",), resume_command=again, check=check)


def cv(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    folds: Annotated[int, typer.Option("--folds", min=2, help="Folds of the training file.")] = 5,
    run_dir: RunDirOption = None,
) -> None:
    """K-fold cross-validation of a finetune recipe on its training file: the mean and spread of the dev scores.

    Stratified by class for classification (scikit-learn's StratifiedKFold, else KFold), seeded by the recipe's
    seed. Fold i's task files go to RUN_DIR/fold-i/task, its run to RUN_DIR/fold-i/run; RUN_DIR/cv.md (printed)
    and cv.json hold each fold's dev scores with their mean and standard deviation.
    """
    from finetune.data.task_paths import check_task_files
    from finetune.recipes.shipped import resolve_recipe

    def run(loaded) -> None:
        from finetune.stages.cv import run_cv  # after the recipe is checked: a mistake needs no torch

        run_cv(resolve_recipe(recipe), list(overrides or []), folds, run_dir)

    def check(loaded) -> None:  # the folds are cut from the training file alone: the task's dev file is not read
        check_task_files(loaded.task, ("train",))

    _run_stage("cv", recipe, overrides, run, recipe_stages=("finetune",), check=check)
