"""What the CLI's commands share: the recipe arguments, the one-line error, and running a stage behind the boundary
that turns user mistakes, failed runs and Ctrl-C into one line and an exit code."""

from __future__ import annotations

import errno
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from finetune.errors import RunFailed, RunInterrupted, UserError
from finetune.recipes.loader import missing_model_folder


def refuse_missing_model_folder(name: str) -> None:
    """A command's first step with a CHECKPOINT argument: a local folder that is not there is refused in one line
    before torch and transformers load (seconds); a hub name goes on to the hub. (Not a typer callback: parsing a
    command line, as the docs' checks do, must not look at the disk.)"""
    if missing_model_folder(name):
        _fail(f"CHECKPOINT: no such model folder: {name}")


RecipeArgument = Annotated[
    Path,
    typer.Argument(
        help="Recipe YAML file, or a shipped recipe's name, e.g. finetune/minilm-sst2-lora (`finetune recipes` lists "
        "them).",
        show_default=False,
    ),
]
OverridesArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted key=value overrides applied on top of the recipe, e.g. training.lr=1e-3 "
        "run_dir=runs/try2. Values are parsed as YAML.",
        show_default=False,
    ),
]
FlowResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Finish a stopped flow: finished stages are kept (their sections unchanged), the stopped "
        "one continues from its newest periodic checkpoint, the later ones run.",
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue the stopped run in the recipe's run_dir from its newest periodic checkpoint (see "
        "checkpoint_every), exactly as if it had not stopped; the recipe must be the one it started with.",
    ),
]


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error to stderr and exit with `code`: 2 for a user mistake, 1 for a run that failed."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def _finished_stages_kept(stage: str, command: str) -> str:
    """What an interrupted flow (ulmfit, intermediate) still has: the stages it finished, which --resume keeps."""
    flows = ("ulmfit", "intermediate")
    return f"; the flow's finished stages are kept: continue with: {command}" if stage in flows else ""


def _run_stage(
    stage: str,
    recipe_path: Path,
    overrides: list[str] | None,
    runner: Callable,
    recipe_stages: tuple[str, ...] | None = None,
    resume_command: str | None = None,
    check: Callable | None = None,
) -> None:
    """Validate the recipe completely, then run the stage; user mistakes and failed runs become one-line errors.

    Exit codes: 2 a mistake in the input, 1 a run that failed (diverged, out of memory, disk full),
    130 interrupted with Ctrl-C (the line printed says how to resume). `recipe_stages`: the recipe stages a
    command other than a stage's own accepts (lr-find: pretrain and finetune). `resume_command`: the command that
    continues it, when the stage's name, recipe and overrides with --resume are not (a search's options).
    `check(recipe)`: the command's checks of its other inputs (the task's files, search's space file). Both run
    after the recipe is checked, `check` before the libraries load (`runner` imports the stage's code itself): a
    mistake is reported in about a second, not after the seconds torch and transformers take to import.
    """
    from finetune.console import quiet_library_chatter
    from finetune.recipes.given import load_given_recipe

    resume_command = resume_command or shlex.join(["finetune", stage, str(recipe_path), *(overrides or []), "--resume"])
    try:
        recipe = load_given_recipe(recipe_path, overrides, stage, recipe_stages)
        if check is not None:
            check(recipe)
        quiet_library_chatter()
        runner(recipe)
    except UserError as error:  # an InputError from data or model loading that no stage named a key for, too
        _fail(str(error))
    except RunFailed as error:
        _fail(str(error), code=1)
    except RunInterrupted as interrupted:
        if interrupted.checkpoint is None:
            typer.echo(
                f"interrupted at step {interrupted.step}; no checkpoint was saved"
                + _finished_stages_kept(stage, resume_command),
                err=True,
            )
        else:
            typer.echo(
                f"interrupted at step {interrupted.step}; checkpoint saved to {interrupted.checkpoint}; "
                f"continue with: {resume_command}",
                err=True,
            )
        raise typer.Exit(code=130) from None  # the message above says what happened
    except KeyboardInterrupt:
        typer.echo("interrupted" + (_finished_stages_kept(stage, resume_command) or "; nothing was saved"), err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message
    except OSError as error:  # a full disk outside the checkpoints (which report it themselves): metrics, reports
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _fail(f"no space left on the device writing {error.filename or 'the run directory'}", code=1)
