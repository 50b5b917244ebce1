"""`finetune runs compare`: runs side by side: the recipe keys that differ, final metrics, wall time, throughput;
for two runs, whether they differ beyond noise (reporting/paired_tests.py).

Reads only what every run directory holds (recipe.yaml, metrics.jsonl, and result.json / timing.json /
dev_predictions.jsonl when present; a folder of several runs, seeds or draws: recipe.yaml and seeds.json, its
metrics the means and 95% intervals over the runs; a self-training run: its last round's metrics and timing, the
training of the model it saved) and draws the runs' loss and evaluation curves over each other.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

from finetune.errors import UserError
from finetune.reporting.finish import read_timing
from finetune.reporting.paired_tests import paired_section
from finetune.reporting.plots import evaluation_metrics, is_number, new_figure, records_of, save_figure
from finetune.run_dir import METRICS_FILE, RECIPE_FILE, flatten_keys, read_metrics, round_folder

IGNORED_KEYS = ("run_dir", "overwrite", "description")  # where a run went and how it is described, not what it did
RESULT_FILE = "result.json"  # a finetune run's dev scores; its main_metric picks the curve to overlay
SEVERAL_RUNS_FILE = "seeds.json"  # a folder of several runs (seeds, draws): each dev metric over them
SELF_TRAINING_FILE = "self_training.json"  # a self-training run (stages/self_training.py): its final round
MISSING = object()  # a key one run's recipe does not have


@dataclass
class Run:
    """What the comparison reads from one run directory."""

    label: str  # the path as given on the command line
    recipe: dict[str, Any]  # dotted keys: {"training.lr": 0.002, ...}
    records: list[dict[str, Any]]
    timing: dict[str, Any] | None
    main_metric: str | None  # the evaluation key to overlay: dev_<main metric> or validation_loss
    summary: dict[str, Any] | None = None  # a folder of several runs: its seeds.json (no records of its own)

    @property
    def train(self) -> list[dict[str, Any]]:
        return records_of(self.records, "train")

    @property
    def last_evaluation(self) -> dict[str, Any]:
        if self.summary is not None:  # the means over the runs
            return {name: values["mean"] for name, values in self.summary["metrics"].items()}
        evaluations = records_of(self.records, "eval")
        return evaluations[-1] if evaluations else {}

    @property
    def shown_label(self) -> str:
        return self.label if self.summary is None else f"{self.label} ({len(self.summary['runs'])} runs)"


def load_run(path: Path) -> Run:
    """Read a run directory; a missing folder or one that holds no run is a UserError naming the path."""
    if not path.is_dir():
        raise UserError(f"{path}: no such folder")
    several = (path / SEVERAL_RUNS_FILE).is_file() and not (path / METRICS_FILE).is_file()
    needed = (RECIPE_FILE, SEVERAL_RUNS_FILE if several else METRICS_FILE)
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        raise UserError(f"{path}: not a run directory (no {' and no '.join(missing)})")
    try:
        recipe = yaml.safe_load((path / RECIPE_FILE).read_text(encoding="utf-8"))
        trained = trained_folder(path)
        records = [] if several else read_metrics(trained / METRICS_FILE)  # names a bad line itself
        summary = json.loads((path / SEVERAL_RUNS_FILE).read_text(encoding="utf-8")) if several else None
    except (yaml.YAMLError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: unreadable run files ({type(error).__name__})") from None
    if not isinstance(recipe, dict):
        raise UserError(f"{path / RECIPE_FILE}: not a recipe")
    evaluations = records_of(records, "eval")
    main_metric = None
    if (path / RESULT_FILE).is_file():
        main_metric = "dev_" + json.loads((path / RESULT_FILE).read_text(encoding="utf-8"))["main_metric"]
    elif any("validation_loss" in record for record in evaluations):
        main_metric = "validation_loss"
    elif evaluation_metrics(evaluations):
        main_metric = evaluation_metrics(evaluations)[0]
    return Run(str(path), flatten_keys(recipe), records, read_timing(trained), main_metric, summary)


def trained_folder(path: Path) -> Path:
    """The folder of the training a run's saved model came from: the run itself, or a self-training run's last
    round."""
    if not (path / SELF_TRAINING_FILE).is_file():
        return path
    return round_folder(path, json.loads((path / SELF_TRAINING_FILE).read_text(encoding="utf-8"))["final_round"])


def differing_keys(runs: list[Run]) -> list[str]:
    """The dotted recipe keys whose values are not the same in every run, in recipe order."""
    keys = list(dict.fromkeys(key for run in runs for key in run.recipe))
    return [
        key
        for key in keys
        if key not in IGNORED_KEYS and len({json.dumps(run.recipe.get(key, MISSING), default=str) for run in runs}) > 1
    ]


def recipe_cell(value: Any) -> str:
    """A recipe value as a table cell: null, 0.002, [1, 2], text."""
    if value is MISSING:
        return "(absent)"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)


def duration(seconds: float) -> str:
    """12.3 s, 4.5 min, 2.1 h."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def throughput(run: Run) -> str:
    """Mean items per second over the run's logged windows, with the unit (examples or tokens)."""
    keys = [key for key in (run.train[0] if run.train else {}) if key.endswith("_per_s")]
    values = [record[keys[0]] for record in run.train if is_number(record.get(keys[0]))] if keys else []
    return f"{statistics.fmean(values):,.0f} {keys[0].removesuffix('_per_s')}/s" if values else "-"


def markdown_table(runs: list[Run]) -> str:
    """One row per run: the differing recipe keys, the final training loss, the last evaluation, time and speed."""
    keys = differing_keys(runs)
    metrics = list(
        dict.fromkeys(
            name
            for run in runs
            for name in (["validation_loss"] if "validation_loss" in run.last_evaluation else [])
            + evaluation_metrics([run.last_evaluation])
        )
    )
    header = ["run", *keys, "steps", "final training loss", *metrics, "training wall time", "throughput"]
    rows = []
    for run in runs:
        steps = max((record["step"] for record in run.records if is_number(record.get("step"))), default=0)
        loss = run.train[-1]["loss"] if run.train else None
        wall = duration(run.timing["training_wall_time_s"]) if run.timing else "-"
        cells = [
            run.shown_label,
            *(recipe_cell(run.recipe.get(key, MISSING)) for key in keys),
            str(steps) if run.summary is None else "-",
            f"{loss:.4f}" if is_number(loss) else "-",
            *(metric_cell(run, name) for name in metrics),
            wall,
            throughput(run),
        ]
        rows.append(cells)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def metric_cell(run: Run, name: str) -> str:
    """A run's last evaluation of a metric; of several runs, their mean and its 95% interval."""
    value = run.last_evaluation.get(name)
    if not is_number(value):
        return "-"
    interval = run.summary["metrics"][name].get("interval") if run.summary is not None else None
    return f"{value:.4f}" + (f" ({interval[0]:.4f} to {interval[1]:.4f})" if interval else "")


def overlay_figure(runs: list[Run]) -> Figure:
    """Training loss (left) and each run's main evaluation metric (right) of every run, over optimizer steps."""
    figure, (loss_axes, evaluation_axes) = new_figure(2)
    for run in runs:
        (line,) = loss_axes.plot(
            [record["step"] for record in run.train], [record["loss"] for record in run.train], label=run.label
        )
        metric = run.main_metric  # None: the run has no evaluations to overlay
        points = (
            [
                (record["step"], record[metric])
                for record in records_of(run.records, "eval")
                if is_number(record.get(metric))
            ]
            if metric is not None
            else []
        )
        if points:
            evaluation_axes.plot(
                [step for step, _ in points],
                [value for _, value in points],
                marker="o",
                color=line.get_color(),
                label=run.label,
            )
    names = sorted({run.main_metric for run in runs if run.main_metric})
    loss_axes.set(xlabel="optimizer step", ylabel="loss", title="training loss")
    evaluation_axes.set(xlabel="optimizer step", title=", ".join(names) or "no evaluations")
    for axes in (loss_axes, evaluation_axes):
        axes.grid(alpha=0.3)
    if any(run.train for run in runs):  # folders of several runs draw no curves of their own
        loss_axes.legend(fontsize=8)
    return figure


def curves_path(output: Path | None) -> Path:
    """Where the overlay PNG goes: beside the report (report.md -> report.png), else runs/runs-compare.png (runs/ is
    where runs live, and what a checkout ignores)."""
    if output is None:
        return Path("runs") / "runs-compare.png"
    return output.with_name(output.stem + "-curves.png") if output.suffix == ".png" else output.with_suffix(".png")


def compare_runs(paths: list[Path], output: Path | None = None) -> tuple[str, Path]:
    """The Markdown report of the runs and the overlay PNG it links (written); the report is written to `output`."""
    runs = [load_run(Path(path)) for path in paths]
    # Before anything is written: two runs of different dev rows are refused.
    paired = paired_section([run.label for run in runs], [Path(path) for path in paths], [run.summary for run in runs])
    curves = curves_path(output)
    curves.parent.mkdir(parents=True, exist_ok=True)  # the report's folder, or runs/
    save_figure(overlay_figure(runs), curves)
    link = curves.name if output is not None else str(curves)
    note = (
        ("Recipe keys not shown are the same in every run" if differing_keys(runs) else "The recipes are the same")
        + f" ({', '.join(IGNORED_KEYS)} left out). Metrics: the last training "
        "window's loss and the last evaluation (of several runs: the mean of their saved checkpoints' scores and its "
        "95% interval); wall time from the start of training to the saved checkpoint."
    )
    markdown = (
        f"# Runs compared\n\n{markdown_table(runs)}\n\n{note}\n{paired}\n![training loss and evaluations]({link})\n"
    )
    if output is not None:
        output.write_text(markdown, encoding="utf-8")
    return markdown, curves
