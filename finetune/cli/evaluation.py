"""The commands that score or use a fine-tuned checkpoint: predict, eval, validate-submission."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import OverridesArgument, RecipeArgument, _fail, _run_stage, refuse_missing_model_folder
from finetune.errors import UserError


def predict_command(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="A checkpoint fine-tuned by `finetune finetune` (its checkpoint/ folder), or a hub name.",
            show_default=False,
        ),
    ],
    input_file: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="Plain text, one example per line (a pair "
            "task: two texts separated by a tab), or a .tsv/.csv/.jsonl file "
            "with the task's text columns; - reads stdin.",
        ),
    ] = "-",
    output_file: Annotated[
        str, typer.Option("--output", "-o", help="A .jsonl, .tsv or .csv file; - writes JSON lines to stdout.")
    ] = "-",
    batch_size: Annotated[int, typer.Option(min=1, help="Examples per batch.")] = 64,
    max_length: Annotated[
        int | None, typer.Option(min=1, help="Tokens per example; default: the checkpoint's task.max_length.")
    ] = None,
) -> None:
    """Predict labels and probabilities (scores for regression) for raw text with a fine-tuned checkpoint."""
    refuse_missing_model_folder(checkpoint)
    from finetune.commands.predict import run_predict
    from finetune.console import console, quiet_library_chatter

    try:
        quiet_library_chatter()
        count = run_predict(checkpoint, input_file, output_file, batch_size, max_length)
    except UserError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        typer.echo("interrupted; nothing was written", err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message
    if output_file != "-":
        console.print(f"{count:,} predictions written to {output_file}")


def evaluate(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    allow_incomplete: Annotated[
        bool,
        typer.Option(
            "--allow-incomplete",
            help="GLUE tasks: leave out those without data or checkpoints (allow_incomplete=true).",
        ),
    ] = False,
) -> None:
    """Score fine-tuned checkpoints on a task split, or on GLUE tasks; write RUN_DIR/report.json and report.md.

    With `tasks` (GLUE task -> checkpoints) the report has each task's dev scores over its runs, the
    GLUE score under each convention and the missing tasks; `submission: true` also writes
    RUN_DIR/submission.zip for the leaderboard (check it with `finetune validate-submission`).
    """
    from finetune.data.task_paths import check_task_files

    def check(loaded) -> None:  # one task's split file; GLUE's tasks are found (or allowed missing) as they are read
        if loaded.task is not None:
            check_task_files(loaded.task, (loaded.split,))

    def run(loaded) -> None:
        from finetune.commands.evaluate import run_eval  # after the recipe is checked: a mistake needs no torch

        run_eval(loaded)

    given = [*(overrides or []), *(["allow_incomplete=true"] if allow_incomplete else [])]
    _run_stage("eval", recipe, given, run, check=check)


def validate_submission_command(
    archive: Annotated[
        Path, typer.Argument(help="The GLUE submission zip, e.g. RUN_DIR/submission.zip.", show_default=False)
    ],
    glue_dir: Annotated[
        Path | None,
        typer.Option(
            "--glue-dir",
            help="GLUE root (download_glue_data.py's layout): rows are checked against its test files, "
            "index by index; without it, against the official test-set sizes.",
            show_default=False,
        ),
    ] = None,
    allow_incomplete: Annotated[
        bool, typer.Option("--allow-incomplete", help="Accept an archive without some tasks' files (they are listed).")
    ] = False,
) -> None:
    """Check a GLUE leaderboard archive: file names at its root, headers, labels, row counts, index coverage.

    Exits 0 when the archive is valid, 1 when it has problems or lacks tasks (each one printed).
    """
    from finetune.glue.specs import SUBMISSION_FILES
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
    file_of = {spec.name: file_name for file_name, spec in SUBMISSION_FILES.items()}  # the tasks an archive holds
    for name in check.present:
        file_name = file_of[name]
        against = "test file" if name in test_ids else "official test-set size"
        if file_name not in check.rows:  # too large or unreadable: its problem below says why
            typer.echo(f"{file_name}: not read (see its problem below)")
            continue
        typer.echo(f"{file_name}: {check.rows[file_name]} rows (checked against the {against})")
    if check.missing:
        typer.echo("missing: " + ", ".join(file_of[name] for name in check.missing))
    for problem in check.problems:
        typer.echo(f"problem: {problem}", err=True)
    if not check.accepted(allow_incomplete):
        typer.echo(
            f"{archive}: not valid" + ("" if check.problems else " (incomplete; --allow-incomplete accepts it)"),
            err=True,
        )
        raise typer.Exit(code=1)
    typer.echo(f"{archive}: valid" + (f", {len(check.missing)} task(s) missing" if check.missing else ", complete"))
