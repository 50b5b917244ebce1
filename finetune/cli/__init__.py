"""The `finetune` command: thin typer wrappers that load a recipe and call one stage or command.

One module per group (training, evaluation, model_tools, runs, recipes; common holds what they share); this one
builds the app and registers every command, in the order `finetune --help` lists them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from finetune._version import __version__
from finetune.cli import evaluation, export, model_tools, recipes, runs, search, serve, training

app = typer.Typer(
    help="Transfer learning for NLP: pretrain a language model, fine-tune it with ULMFiT's techniques, "
    "evaluate on GLUE. Every command takes a recipe YAML file and optional dotted key=value overrides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

app.command()(training.pretrain)
app.command()(training.finetune)
app.command()(training.ulmfit)
app.command()(training.intermediate)
app.command()(training.multitask)
app.command(name="lr-find")(training.lr_find)
app.command()(training.profile)
app.command()(search.search)
app.command()(search.cv)
app.command(name="predict")(evaluation.predict_command)
app.command()(serve.serve)
app.command()(model_tools.generate)
app.command()(model_tools.score)
app.command(name="push")(model_tools.push)
app.command()(model_tools.merge)
app.command()(export.export)
app.command()(export.bench)
app.command(name="eval")(evaluation.evaluate)
app.command(name="validate-submission")(evaluation.validate_submission_command)
app.add_typer(recipes.recipes_app, name="recipes")
app.command()(runs.plot)

runs_app = typer.Typer(no_args_is_help=True)
runs_app.callback()(runs.runs)
runs_app.command()(runs.compare)
app.add_typer(runs_app, name="runs")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"finetune {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = None,
) -> None:
    """Transfer learning for NLP in the line of ULMFiT, GPT and BERT."""
