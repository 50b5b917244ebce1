"""`finetune recipes`: list the shipped recipes (or a folder's), explain a stage's keys, copy a shipped recipe to edit.

A group of its own (cli/__init__.py adds it as `recipes`) so that `finetune recipes` alone still lists, with `copy`
beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import _fail
from finetune.errors import UserError

recipes_app = typer.Typer(no_args_is_help=False, add_completion=False, rich_markup_mode="rich")


@recipes_app.callback(invoke_without_command=True)
def recipes(
    context: typer.Context,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="List this folder's recipes (by path) instead of the shipped ones.", show_default=False
        ),
    ] = None,
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys",
            help="Instead of listing recipes, explain every key of a stage's "
            "recipes: pretrain, finetune, eval, ulmfit or intermediate.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """List the recipes with one line each, or explain every recipe key of a stage (--keys STAGE).

    The shipped recipes are listed by name, e.g. finetune/minilm-sst2-lora: every command that takes a recipe file
    takes that name too (a file of that path, when there is one, comes first), and `finetune recipes copy NAME FILE`
    copies one to edit. Relative paths inside a recipe are read from the folder the command runs in.
    """
    if context.invoked_subcommand is not None:
        return
    from rich.console import Console

    from finetune.recipes import RECIPE_TYPES, describe_keys

    console = Console()
    if keys is not None:
        if keys not in RECIPE_TYPES:
            _fail(f"--keys: expected one of {', '.join(RECIPE_TYPES)} (got '{keys}')")
        if keys == "ulmfit":  # a flow: its sections' keys are listed under their stages
            from finetune.stages.ulmfit import describe_flow_keys

            rows = describe_flow_keys()
        elif keys == "intermediate":
            from finetune.stages.intermediate import describe_flow_keys as describe_intermediate_keys

            rows = describe_intermediate_keys()
        else:
            rows = describe_keys(RECIPE_TYPES[keys])
        _print_table(console, ("key", "type", "default", "meaning"), rows, f"{keys} recipe keys")
        return
    if directory is not None:
        if not directory.is_dir():
            _fail(f"--dir: no such folder: {directory}")
        listed = {str(path): path for path in sorted(directory.rglob("*.yaml"))}
    else:
        from finetune.recipes.shipped import shipped_recipes

        try:
            listed = shipped_recipes()
        except UserError as error:
            _fail(str(error))
    _print_table(console, ("recipe", "stage", "description"), [_summary(name, path) for name, path in listed.items()])


def _summary(name: str, path: Path) -> tuple[str, str, str]:
    """(name, stage, description) of a recipe file; one that cannot be read shows its error, marked by stage ?."""
    from finetune.recipes import read_yaml

    try:
        data = read_yaml(path)
    except UserError as error:
        return name, "?", str(error)
    return name, str(data.get("stage", "?")), str(data.get("description", ""))


@recipes_app.command()
def copy(
    name: Annotated[
        str, typer.Argument(help="A shipped recipe's name, e.g. finetune/minilm-sst2-lora.", show_default=False)
    ],
    destination: Annotated[
        Path, typer.Argument(help="The file to write, or a folder to write it in.", show_default=False)
    ],
    force: Annotated[bool, typer.Option("--force", help="Overwrite the file if it exists.")] = False,
) -> None:
    """Copy a shipped recipe to a file of yours to edit; run it with the command on its first line."""
    from finetune.recipes.shipped import copy_recipe

    try:
        written = copy_recipe(name, destination, force=force)
    except UserError as error:
        _fail(str(error))
    command = written.read_text(encoding="utf-8").partition("\n")[0].removeprefix("# ")
    typer.echo(f"wrote {written}" + (f"; run it with: {command}" if command.startswith("finetune ") else ""))


def _print_table(console, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]], title: str | None = None) -> None:
    """A table on a terminal (the first column never cut: it is copied from there); piped or redirected, one
    tab-separated line per row with every value whole, for grep and cut."""
    from rich.table import Table

    if not console.is_terminal:
        for row in [columns, *rows]:
            typer.echo("\t".join(" ".join(value.split()) for value in row))
        return
    table = Table(*columns, title=title)
    table.columns[0].no_wrap = True
    for row in rows:
        table.add_row(*row, style="red" if row[1] == "?" else None)
    console.print(table)
