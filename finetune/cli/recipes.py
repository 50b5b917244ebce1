"""`finetune recipes`: the recipes listed one line each, or every key of a stage's recipes explained (--keys)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import _fail
from finetune.errors import UserError


def recipes(
    directory: Annotated[Path, typer.Option("--dir", help="Folder of recipes to list.")] = Path("recipes"),
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys",
            help="Instead of listing recipes, explain every key of a stage's "
            "recipes: pretrain, finetune, eval or ulmfit.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """List the recipes with one line each, or explain every recipe key of a stage (--keys STAGE)."""
    from rich.console import Console

    from finetune.recipes import RECIPE_TYPES, describe_keys, read_yaml

    console = Console()
    if keys is not None:
        if keys not in RECIPE_TYPES:
            _fail(f"--keys: expected one of {', '.join(RECIPE_TYPES)} (got '{keys}')")
        if keys == "ulmfit":  # its sections are whole stage recipes: their keys are listed under those stages
            from finetune.stages.ulmfit import describe_flow_keys

            rows = describe_flow_keys()
        else:
            rows = describe_keys(RECIPE_TYPES[keys])
        _print_table(console, ("key", "type", "default", "meaning"), rows, f"{keys} recipe keys")
        return
    if not directory.is_dir():
        _fail(f"--dir: no such folder: {directory} (run from the project root or pass --dir)")
    listed: list[tuple[str, str, str]] = []
    for path in sorted(directory.rglob("*.yaml")):
        try:
            data = read_yaml(path)
        except UserError as error:
            listed.append((str(path), "?", str(error)))
            continue
        listed.append((str(path), str(data.get("stage", "?")), str(data.get("description", ""))))
    _print_table(console, ("recipe", "stage", "description"), listed)


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
