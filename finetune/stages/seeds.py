"""Multi-seed runs: one full run per seed, then the dev scores summarised across seeds.

Small GLUE tasks move by several points from seed to seed; a single run says little. Each seed
runs into RUN_DIR/seed-N; RUN_DIR/seeds.json and seeds.md hold the mean, median, standard
deviation, minimum and maximum of every dev metric (and of a classifier's calibration: temperature,
ECE, Brier score). `--resume` keeps the seeds already finished and continues the one in progress.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import PartialState

from finetune.console import console
from finetune.run_dir import check_run_dir_free, check_same_recipe, claim_run_dir, prepare_run_dir
from finetune.training.checkpoints import latest_training_checkpoint

SUMMARY_JSON, SUMMARY_MARKDOWN = "seeds.json", "seeds.md"
CALIBRATION_MEASURES = ("ece_before", "ece_after", "brier_before", "brier_after")  # of result.json's calibration


def run_each_seed(recipe, run_one: Callable, result_file: str, resume: bool = False) -> Path:
    """Run `run_one` on a copy of the recipe per seed, then write the summary; returns the run directory.

    `resume`: the recipe must be the one the run started with; a seed whose `result_file` exists is kept as it
    is, one with a periodic checkpoint continues from it (`run_one(recipe, resume=True)`), any other runs anew.
    """
    # Under several processes only the main one creates (or locks) the folder, after every process has checked it.
    state = PartialState(cpu=recipe.training.device == "cpu" or not torch.cuda.is_available())
    if resume:
        check_same_recipe(recipe)
    else:
        check_run_dir_free(recipe, _latest_seed_checkpoint)
    state.wait_for_everyone()
    run_dir = claim_run_dir(recipe, state.is_main_process) if resume else prepare_run_dir(recipe, state.is_main_process)
    state.wait_for_everyone()
    results = {}
    for seed in recipe.seeds:
        console.print(f"[bold]seed {seed}[/bold] ({recipe.seeds.index(seed) + 1} of {len(recipe.seeds)})")
        single = recipe.model_copy(
            update={"seed": seed, "seeds": None, "run_dir": run_dir / f"seed-{seed}", "overwrite": False}
        )
        if resume and (single.run_dir / result_file).is_file():
            console.print(f"seed {seed} finished before: kept")
        elif resume and latest_training_checkpoint(single.run_dir) is not None:
            run_one(single, resume=True)
        else:  # not started yet, or stopped before its first periodic checkpoint: from the beginning
            run_one(single.model_copy(update={"overwrite": resume}))
        results[seed] = json.loads((single.run_dir / result_file).read_text(encoding="utf-8"))
    summary = summarise_seeds(results)
    if PartialState().is_main_process:
        (run_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        (run_dir / SUMMARY_MARKDOWN).write_text(seeds_markdown(summary), encoding="utf-8")
    console.print(seeds_markdown(summary))
    return run_dir


def _latest_seed_checkpoint(run_dir: Path) -> Path | None:
    """What `--resume` of a stopped multi-seed run would keep or continue from: a finished seed's checkpoint or a
    seed's periodic checkpoint (None: nothing)."""
    for folder in sorted(Path(run_dir).glob("seed-*"), reverse=True):
        checkpoint = latest_training_checkpoint(folder)
        if checkpoint is None and (folder / "checkpoint").is_dir():
            checkpoint = folder / "checkpoint"
        if checkpoint is not None:
            return checkpoint
    return None


def summarise_seeds(results: dict[int, dict]) -> dict:
    """Per dev metric of the saved checkpoints: every seed's value and their mean, median, std, min and max."""
    metrics = [name for name in next(iter(results.values()))["best"] if name.startswith("dev_")]
    summary = {"seeds": list(results), "saved": next(iter(results.values()))["saved"], "metrics": {}}
    for name in metrics:
        # The saved checkpoint's scores: the best evaluation's with keep_best, else the last one's.
        values = [result["best" if result["saved"] == "best" else "last"][name] for result in results.values()]
        summary["metrics"][name] = summarise_values(values)
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
    """The values of several runs and their mean, median, std (0.0 for one run), min and max."""
    return {
        "values": values,
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def seeds_markdown(summary: dict) -> str:
    """A Markdown table of the summary, scores x 100 as GLUE reports them."""
    lines = [
        f"# dev scores over seeds {', '.join(map(str, summary['seeds']))} ({summary['saved']} checkpoints)",
        "",
        "| metric | mean | median | std | min | max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, values in summary["metrics"].items():
        cells = " | ".join(f"{100 * values[key]:.1f}" for key in ("mean", "median", "std", "min", "max"))
        lines.append(f"| {name.removeprefix('dev_')} | {cells} |")
    calibration = summary.get("calibration")
    if calibration is not None:
        lines += ["", f"calibration ({calibration['method']}; dev):", ""]
        lines += ["| measure | mean | median | std | min | max |", "|---|---:|---:|---:|---:|---:|"]
        for name in ("temperature", *CALIBRATION_MEASURES):
            cells = " | ".join(f"{calibration[name][key]:.4f}" for key in ("mean", "median", "std", "min", "max"))
            lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"
