"""The commands that look at finished runs: plot, runs compare."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import _fail
from finetune.errors import UserError


def plot(
    run_dir: Annotated[
        Path, typer.Argument(help="A pretrain or finetune run directory (it holds metrics.jsonl).", show_default=False)
    ],
) -> None:
    """Draw a run's plots again from its metrics.jsonl into RUN_DIR/plots/: loss, LRs, evaluations, throughput (and
    a classifier's reliability diagram, from its result.json).

    Every run draws them when it ends; a run directory of several runs gets the plots of each seed-N (draw-D/seed-S)
    folder.
    """
    from finetune.reporting.plots import write_plots
    from finetune.run_dir import METRICS_FILE

    if not run_dir.is_dir():
        _fail(f"{run_dir}: no such folder")
    runs = [*run_dir.glob(f"seed-*/{METRICS_FILE}"), *run_dir.glob(f"draw-*/seed-*/{METRICS_FILE}")]
    targets = [run_dir] if (run_dir / METRICS_FILE).is_file() else sorted(path.parent for path in runs)
    if not targets:
        _fail(f"{run_dir}: not a run directory (no {METRICS_FILE})")
    for target in targets:
        try:
            written = write_plots(target)
        except UserError as error:  # a metrics.jsonl line that is not a JSON object, named by read_metrics
            _fail(str(error))
        for path in written:
            typer.echo(str(path))


def runs() -> None:
    """Look at finished runs side by side (`finetune runs compare`)."""


def compare(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories (pretrain or finetune) to compare.", show_default=False)
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the Markdown report to this file and the overlay PNG beside it (report.md -> "
            "report.png); without it the report is printed and the PNG written to runs/runs-compare.png.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Compare runs: a Markdown table of the recipe keys that differ, final metrics, wall time and throughput.

    Also draws the runs' training loss and main evaluation metric over each other in one PNG.
    """
    from finetune.reporting.compare import compare_runs

    try:
        markdown, curves = compare_runs(run_dirs, output)
    except UserError as error:
        _fail(str(error))
    if output is None:
        typer.echo(markdown, nl=False)
    else:
        typer.echo(f"report written to {output}", err=True)
    typer.echo(f"curves written to {curves}", err=True)
