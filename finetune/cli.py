"""The `finetune` command: thin typer wrappers that load a recipe and call one stage."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from finetune import __version__
from finetune.errors import UserError

app = typer.Typer(
    help="Transfer learning for NLP: pretrain a language model, fine-tune it with ULMFiT's techniques, "
    "evaluate on GLUE. Every command takes a recipe YAML file and optional dotted key=value overrides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

RecipeArgument = Annotated[Path, typer.Argument(help="Recipe YAML file (see `finetune recipes`).", show_default=False)]
OverridesArgument = Annotated[
    Optional[list[str]],
    typer.Argument(help="Dotted key=value overrides applied on top of the recipe, e.g. training.lr=1e-3 "
                   "run_dir=runs/try2. Values are parsed as YAML.", show_default=False),
]


def _fail(message: str) -> None:
    """Print a one-line error to stderr and exit with code 2 (a user mistake, not a crash)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _quiet_libraries() -> None:
    """Silence library chatter that does not concern the user (expected missing-head weights, hub hints)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TRANSFORMERS_CACHE.*")


def _run_stage(stage: str, recipe_path: Path, overrides: Optional[list[str]], runner: Callable) -> None:
    """Validate the recipe completely, then run the stage; user mistakes become one-line errors."""
    from finetune.recipes import load_recipe

    try:
        recipe = load_recipe(recipe_path, overrides or [], expected_stage=stage)
        _quiet_libraries()
        runner(recipe)
    except UserError as error:
        _fail(str(error))


@app.command()
def pretrain(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in the recipe's run_dir from its newest "
                                         "periodic checkpoint (see checkpoint_every).")] = False,
) -> None:
    """Pretrain a language model on text files: masked (bert), causal (gpt2) or ULMFiT's AWD-LSTM.

    Trains a tokenizer on the corpus (WordPiece for bert, byte-level BPE for the causal families) or
    reuses one, packs the text into blocks (BPTT streams for awd_lstm), and writes a Hugging Face
    checkpoint to RUN_DIR/checkpoint.
    """
    from finetune.stages.pretrain import run_pretrain

    _run_stage("pretrain", recipe, overrides, lambda loaded: run_pretrain(loaded, resume=resume))


@app.command()
def finetune(recipe: RecipeArgument, overrides: OverridesArgument = None) -> None:
    """Fine-tune a pretrained checkpoint on a classification or regression task.

    Uses ULMFiT's discriminative learning rates, gradual unfreezing and slanted triangular
    learning rates, each set in the recipe; writes a Hugging Face checkpoint to RUN_DIR/checkpoint.
    """
    from finetune.stages.finetune import run_finetune

    _run_stage("finetune", recipe, overrides, run_finetune)


@app.command(name="eval")
def evaluate(recipe: RecipeArgument, overrides: OverridesArgument = None) -> None:
    """Score fine-tuned checkpoints on a task split, or on GLUE tasks; write RUN_DIR/report.json and report.md.

    With `tasks` (GLUE task -> checkpoints) the report has each task's dev scores over its runs, the
    GLUE score under each convention and the missing tasks; `submission: true` also writes
    RUN_DIR/submission.zip for the leaderboard (check it with `finetune validate-submission`).
    """
    from finetune.stages.evaluate import run_eval

    _run_stage("eval", recipe, overrides, run_eval)


@app.command(name="validate-submission")
def validate_submission_command(
    archive: Annotated[Path, typer.Argument(help="The GLUE submission zip, e.g. RUN_DIR/submission.zip.",
                                            show_default=False)],
    glue_dir: Annotated[Optional[Path], typer.Option(
        "--glue-dir", help="GLUE root (download_glue_data.py's layout): rows are checked against its test files, "
        "index by index; without it, against the official test-set sizes.", show_default=False)] = None,
    allow_incomplete: Annotated[bool, typer.Option(
        "--allow-incomplete", help="Accept an archive without some tasks' files (they are listed).")] = False,
) -> None:
    """Check a GLUE leaderboard archive: file names at its root, headers, labels, row counts, index coverage.

    Exits 0 when the archive is valid, 1 when it has problems or lacks tasks (each one printed).
    """
    from finetune.glue.specs import GLUE_TASKS
    from finetune.glue.submission import glue_test_ids, validate_submission

    try:
        if not archive.is_file():
            raise UserError(f"{archive}: no such file")
        if glue_dir is not None and not glue_dir.is_dir():
            raise UserError(f"--glue-dir: no such folder: {glue_dir}")
        test_ids = glue_test_ids(glue_dir) if glue_dir is not None else {}
        check = validate_submission(archive, test_ids)
    except UserError as error:
        _fail(str(error))
    for name in check.present:
        file_name = GLUE_TASKS[name].submission_file
        against = "test file" if name in test_ids else "official test-set size"
        typer.echo(f"{file_name}: {check.rows[file_name]} rows (checked against the {against})")
    if check.missing:
        typer.echo("missing: " + ", ".join(GLUE_TASKS[name].submission_file for name in check.missing))
    for problem in check.problems:
        typer.echo(f"problem: {problem}", err=True)
    if not check.accepted(allow_incomplete):
        typer.echo(f"{archive}: not valid" + ("" if check.problems else " (incomplete; --allow-incomplete "
                                                                         "accepts it)"), err=True)
        raise typer.Exit(code=1)
    typer.echo(f"{archive}: valid" + (f", {len(check.missing)} task(s) missing" if check.missing else ", complete"))


@app.command()
def recipes(
    directory: Annotated[Path, typer.Option("--dir", help="Folder of recipes to list.")] = Path("recipes"),
    keys: Annotated[
        Optional[str], typer.Option("--keys", help="Instead of listing recipes, explain every key of a stage's "
                                    "recipes: pretrain, finetune or eval.", show_default=False)
    ] = None,
) -> None:
    """List the recipes with one line each, or explain every recipe key of a stage (--keys STAGE)."""
    from rich.console import Console
    from rich.table import Table

    from finetune.recipes import RECIPE_TYPES, describe_keys, read_yaml

    console = Console()
    if keys is not None:
        if keys not in RECIPE_TYPES:
            _fail(f"--keys: expected one of {', '.join(RECIPE_TYPES)} (got '{keys}')")
        table = Table("key", "type", "default", "meaning", title=f"{keys} recipe keys")
        table.columns[0].no_wrap = True
        for row in describe_keys(RECIPE_TYPES[keys]):
            table.add_row(*row)
        console.print(table)
        return
    if not directory.is_dir():
        _fail(f"--dir: no such folder: {directory} (run from the project root or pass --dir)")
    table = Table("recipe", "stage", "description")
    table.columns[0].no_wrap = True  # paths are copied from here: never cut them
    for path in sorted(directory.rglob("*.yaml")):
        try:
            data = read_yaml(path)
        except UserError as error:
            table.add_row(str(path), "?", f"[red]{error}")
            continue
        table.add_row(str(path), str(data.get("stage", "?")), str(data.get("description", "")))
    console.print(table)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"finetune {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = None,
) -> None:
    """Transfer learning for NLP in the line of ULMFiT, GPT and BERT."""
