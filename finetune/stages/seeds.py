"""Several runs of one recipe: one per seed (`seeds`), or one per draw of the labelled rows and seed (`draws`), then
the dev scores summarised across them.

Small tasks move by points from seed to seed, and few labels from one draw of the labelled rows to the next; a
single run says little. Each seed runs into RUN_DIR/seed-N; with draws each (draw, seed) into RUN_DIR/draw-D/seed-S,
draw D drawing task.labels_per_class's rows with seed D (kinds/labelled_rows.py), the same rows for each of its
seeds. RUN_DIR/seeds.json and seeds.md hold, per dev metric of the saved checkpoints, every run's value, their mean,
median, standard deviation, minimum and maximum and the 95% confidence interval of the mean (Student t over the runs,
n - 1 degrees of freedom, each run counted as an independent draw of the score), and with draws each draw's values
and mean. RUN_DIR/result.json holds the mean, standard deviation and interval (where tools read a run's scores), and
each run's model card gets a section on the runs it is one of. `--resume` keeps the runs already finished and
continues the one in progress. A classifier's calibration (temperature, ECE, Brier score)
is summarised beside its scores.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from accelerate import PartialState

from finetune.console import console
from finetune.reporting.model_card import add_card_section
from finetune.reporting.significance import mean_interval
from finetune.run_dir import CHECKPOINT_DIR, check_run_dir_free, check_same_recipe, claim_run_dir, prepare_run_dir
from finetune.training.checkpoints import latest_run_checkpoint

SUMMARY_JSON, SUMMARY_MARKDOWN = "seeds.json", "seeds.md"
CALIBRATION_MEASURES = ("ece_before", "ece_after", "brier_before", "brier_after")  # of result.json's calibration
RESULT_FILE = "result.json"  # a run folder's scores: of several runs, their means and intervals
CARD_SECTION = "Across runs"  # the heading of each run's model-card section on the runs it is one of


class RunKey(NamedTuple):
    """One run of several: its draw of the labelled rows (None without draws) and its seed."""

    draw: int | None
    seed: int

    @property
    def folder(self) -> str:
        """Its folder in the run directory: seed-S, or draw-D/seed-S."""
        return f"seed-{self.seed}" if self.draw is None else f"draw-{self.draw}/seed-{self.seed}"

    @property
    def name(self) -> str:
        return f"seed {self.seed}" if self.draw is None else f"draw {self.draw}, seed {self.seed}"


def runs_of(recipe) -> list[RunKey]:
    """The runs of a recipe of several: each seed, or each draw (0 to draws - 1) x each seed (seeds, or seed)."""
    seeds = recipe.seeds if recipe.seeds is not None else [recipe.seed]
    draws = [None] if getattr(recipe, "draws", None) is None else list(range(recipe.draws))
    return [RunKey(draw, seed) for draw in draws for seed in seeds]


def several_runs(recipe) -> bool:
    """Whether a finetune recipe runs several times (seeds or draws) into one run directory."""
    return getattr(recipe, "seeds", None) is not None or getattr(recipe, "draws", None) is not None


def run_each(recipe, run_one: Callable, result_file: str, resume: bool = False) -> Path:
    """Run `run_one` on a copy of the recipe per run (runs_of), then write the summary; returns the run directory.

    `resume`: the recipe must be the one the run started with; a run whose `result_file` exists is kept as it is,
    one with a periodic checkpoint (or a self-training run with a round done) continues from it
    (`run_one(recipe, resume=True)`), any other runs anew.
    """
    # Under several processes only the main one creates (or locks) the folder, after every process has checked it.
    state = PartialState(cpu=recipe.training.device == "cpu" or not torch.cuda.is_available())
    if resume:
        check_same_recipe(recipe)
    else:
        check_run_dir_free(recipe, _latest_run_checkpoint)
    state.wait_for_everyone()
    run_dir = claim_run_dir(recipe, state.is_main_process) if resume else prepare_run_dir(recipe, state.is_main_process)
    state.wait_for_everyone()
    runs, results = runs_of(recipe), {}
    for number, key in enumerate(runs, start=1):
        console.print(f"[bold]{key.name}[/bold] ({number} of {len(runs)})")
        update = {"seed": key.seed, "seeds": None, "run_dir": run_dir / key.folder, "overwrite": False}
        if key.draw is not None:
            update |= {"draw": key.draw, "draws": None}
        single = recipe.model_copy(update=update)
        if resume and (single.run_dir / result_file).is_file():
            console.print(f"{key.name} finished before: kept")
        elif resume and latest_run_checkpoint(single.run_dir) is not None:
            run_one(single, resume=True)
        else:  # not started yet, or stopped before its first periodic checkpoint: from the beginning
            run_one(single.model_copy(update={"overwrite": resume}))
        results[key] = json.loads((single.run_dir / result_file).read_text(encoding="utf-8"))
    summary = summarise_runs(results, getattr(recipe.task, "labels_per_class", None))
    if PartialState().is_main_process:
        write_summary(run_dir, summary)
    console.print(runs_markdown(summary), markup=False, highlight=False, soft_wrap=True)
    return run_dir


def _latest_run_checkpoint(run_dir: Path) -> Path | None:
    """What `--resume` of a stopped run of several would keep or continue from: a finished run's checkpoint or a
    run's periodic checkpoint (None: nothing)."""
    folders = [*Path(run_dir).glob("seed-*"), *Path(run_dir).glob("draw-*/seed-*")]
    for folder in sorted(folders, reverse=True):
        checkpoint = latest_run_checkpoint(folder)
        if checkpoint is None and (folder / CHECKPOINT_DIR).is_dir():
            checkpoint = folder / CHECKPOINT_DIR
        if checkpoint is not None:
            return checkpoint
    return None


def saved_scores(result: dict) -> dict:
    """A run's result.json scores of its saved checkpoint: the best evaluation's with keep_best, else the last's."""
    return result["best" if result["saved"] == "best" else "last"]


def summarise_runs(results: dict[RunKey, dict], labels_per_class: int | None = None) -> dict:
    """Per dev metric of the saved checkpoints: every run's value, their summary (summarise_values) and, with draws,
    each draw's values and mean."""
    first, keys = next(iter(results.values())), list(results)
    draws = sorted({key.draw for key in keys if key.draw is not None})
    summary: dict = {"seeds": list(dict.fromkeys(key.seed for key in keys))}
    if draws:
        summary |= {"draws": draws, "labels_per_class": labels_per_class}
    summary |= {
        "runs": [key.folder for key in keys],
        "saved": first["saved"],
        "main_metric": first["main_metric"],
        "interval": f"95% confidence interval of the mean: Student t over the {len(keys)} runs ({len(keys) - 1} "
        "degrees of freedom), each run counted as an independent draw of the score",
        "metrics": {},
    }
    for name in (name for name in saved_scores(first) if name.startswith("dev_")):
        values = [saved_scores(result)[name] for result in results.values()]
        summary["metrics"][name] = summarise_values(values)
        if draws:
            of_draw = {draw: [value for key, value in zip(keys, values) if key.draw == draw] for draw in draws}
            summary["metrics"][name]["draws"] = {
                str(draw): {"values": drawn, "mean": statistics.fmean(drawn)} for draw, drawn in of_draw.items()
            }
    calibrations = [result["calibration"] for result in results.values() if "calibration" in result]
    # A classifier's seeds: the calibration of each one's saved checkpoint, on its dev set.
    if calibrations and len(calibrations) == len(results):
        summary["calibration"] = {
            "method": calibrations[0]["method"],
            "temperature": summarise_values([calibration["temperature"] for calibration in calibrations]),
            **{
                key: summarise_values([calibration["dev"][key] for calibration in calibrations])
                for key in CALIBRATION_MEASURES
            },
        }
    return summary


def summarise_values(values: list[float]) -> dict:
    """The values of several runs and their mean, median, std (0.0 for one run), min, max and the 95% confidence
    interval of the mean ([low, high], Student t; None for one run)."""
    interval = mean_interval(values)
    return {
        "values": values,
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "interval": list(interval) if interval is not None else None,
    }


def over(summary: dict) -> str:
    """What the runs are, in words: seeds 0, 1; or 2 draws of 8 labelled rows per class x seeds 0, 1."""
    seeds = f"seed{'s' if len(summary['seeds']) > 1 else ''} {', '.join(map(str, summary['seeds']))}"
    if "draws" not in summary:
        return seeds
    count = len(summary["draws"])
    return f"{count} draw{'s' if count > 1 else ''} of {summary['labels_per_class']} labelled rows per class x {seeds}"


def runs_result(summary: dict) -> dict:
    """RUN_DIR/result.json of several runs: per dev metric the mean, standard deviation and 95% interval."""
    return {
        "main_metric": summary["main_metric"],
        "saved": summary["saved"],
        "over": over(summary),
        "runs": summary["runs"],
        "interval": summary["interval"],
        "metrics": {
            name: {key: values[key] for key in ("mean", "std", "interval")}
            for name, values in summary["metrics"].items()
        },
    }


def write_summary(run_dir: Path, summary: dict) -> None:
    """seeds.json, seeds.md and result.json in the run directory, and each run's model-card section."""
    (run_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (run_dir / SUMMARY_MARKDOWN).write_text(runs_markdown(summary), encoding="utf-8")
    (run_dir / RESULT_FILE).write_text(json.dumps(runs_result(summary), indent=2) + "\n", encoding="utf-8")
    for index, folder in enumerate(summary["runs"]):
        add_card_section(run_dir / folder / CHECKPOINT_DIR, CARD_SECTION, card_section(summary, index))


def _interval_cell(values: dict, scale: float, digits: int) -> str:
    interval = values["interval"]
    return "-" if interval is None else f"{scale * interval[0]:.{digits}f} to {scale * interval[1]:.{digits}f}"


def runs_markdown(summary: dict) -> str:
    """A Markdown table of the summary (and with draws one of each draw's mean and values), scores x 100 as GLUE
    reports them."""
    lines = [
        f"# dev scores over {over(summary)} ({summary['saved']} checkpoints)",
        "",
        "| metric | mean | 95% interval | std | median | min | max |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, values in summary["metrics"].items():
        cells = [f"{100 * values[key]:.1f}" for key in ("mean", "std", "median", "min", "max")]
        cells.insert(1, _interval_cell(values, 100, 1))
        lines.append(f"| {name.removeprefix('dev_')} | " + " | ".join(cells) + " |")
    lines += ["", f"The {summary['interval']}."]
    if "draws" in summary:
        lines += ["", "Each draw: the mean of its seeds (each seed's score).", ""]
        lines += ["| metric | " + " | ".join(f"draw {draw}" for draw in summary["draws"]) + " |"]
        lines += ["|---|" + "---:|" * len(summary["draws"])]
        for name, values in summary["metrics"].items():
            cells = [
                f"{100 * drawn['mean']:.1f} ({', '.join(f'{100 * value:.1f}' for value in drawn['values'])})"
                for drawn in values["draws"].values()
            ]
            lines.append(f"| {name.removeprefix('dev_')} | " + " | ".join(cells) + " |")
    lines += calibration_lines(summary)
    return "\n".join(lines) + "\n"


def calibration_lines(summary: dict) -> list[str]:
    """Markdown lines of the runs' calibration (temperature, ECE and Brier before and after), if they have one."""
    calibration = summary.get("calibration")
    if calibration is None:
        return []
    lines = ["", f"calibration ({calibration['method']}; dev):", ""]
    lines += ["| measure | mean | median | std | min | max |", "|---|---:|---:|---:|---:|---:|"]
    for name in ("temperature", *CALIBRATION_MEASURES):
        cells = " | ".join(f"{calibration[name][key]:.4f}" for key in ("mean", "median", "std", "min", "max"))
        lines.append(f"| {name} | {cells} |")
    return lines


def card_section(summary: dict, index: int) -> str:
    """The model-card section of run `index`: where its dev scores stand among the runs' mean and interval."""
    runs = summary["runs"]
    lines = [
        (
            f"This checkpoint is run {runs[index]} of {len(runs)} ({over(summary)}), summarised in the run "
            f"directory's {SUMMARY_MARKDOWN}. Dev scores of the {summary['saved']} checkpoints:"
        ),
        "",
        "| metric | this run | mean of the runs | std | 95% interval |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in summary["metrics"].items():
        lines.append(
            f"| {name.removeprefix('dev_')} | {values['values'][index]:.4f} | {values['mean']:.4f} | "
            f"{values['std']:.4f} | {_interval_cell(values, 1, 4)} |"
        )
    return "\n".join([*lines, "", f"The {summary['interval']}."])
