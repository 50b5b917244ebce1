"""`finetune lr-find RECIPE`: the learning-rate range test (Smith 2017), fastai's `lr_find`, on a training recipe.

The recipe's own stage (pretrain or finetune: same data, model, discriminative ratios, unfreezing, AR/TAR) trains
for `steps` optimizer steps while the top group's LR grows exponentially from `start_lr` to `end_lr`. Each step's
loss is smoothed by a centred moving average over a tenth of the steps. fastai smooths with an exponential
average (beta 0.98), which lags the LR: on a 100-step test of an AWD-LSTM it put the minimum at 0.31 where the
losses themselves bottom out near 0.012 (the loss at each LR is what the test is about). The curve is cut where
the smoothed loss passes 4x its running minimum (fastai's rule: past it the run has diverged) or where the loss
turns non-finite, which also stops the run; the steps before it still make the curve.

Two readings of the curve are printed, drawn and saved (fastai v1's suggestions):
- steepest: the LR where the smoothed loss falls fastest per unit of log(LR), before its minimum;
- minimum / 10: a tenth of the LR at the minimum, the usual rule of thumb, and the one suggested.

Everything goes to `<run_dir>-lr-find` (the recipe's run_dir stays free for the real run): the stage's metrics
and plots, lr_find.json, lr_find.md and lr_find.png; the model itself is not kept.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from finetune.console import console
from finetune.errors import RunFailed, UserError
from finetune.models.families import family_of
from finetune.recipes import FinetuneRecipe, PretrainRecipe
from finetune.reporting.plots import new_figure, save_figure
from finetune.run_dir import METRICS_FILE, read_metrics

SMOOTHING_FRACTION = 0.1  # the moving average spans this share of the steps
DIVERGENCE = 4.0  # the curve stops where the smoothed loss exceeds this many times its minimum
RESULT_JSON, RESULT_MARKDOWN, RESULT_PLOT = "lr_find.json", "lr_find.md", "lr_find.png"


def range_test_recipe(recipe: PretrainRecipe | FinetuneRecipe, steps: int, start_lr: float, end_lr: float):
    """The recipe changed into a range test: `steps` steps from `start_lr` to `end_lr`, nothing kept or resumed."""
    if isinstance(recipe, PretrainRecipe) and family_of(recipe.model).counted:
        raise UserError("lr-find: model.family ngram is counted, not trained: it has no learning rate to find")
    if not 0 < start_lr < end_lr:
        raise UserError(f"--start-lr {start_lr:g} and --end-lr {end_lr:g}: need 0 < start < end")
    # Epochs enough to reach max_steps on any data size; the stage stops at max_steps.
    # No divergence stop: the test raises the LR until the loss rises, on purpose (nan/inf still stops it).
    training = recipe.training.model_copy(
        update={
            "lr": end_lr,
            "max_steps": steps,
            "epochs": steps,
            "log_every": 1,
            "log_with": [],
            "divergence_factor": None,
        }
    )
    schedule = recipe.schedule.model_copy(update={"kind": "range_test", "range_ratio": end_lr / start_lr})
    update: dict[str, Any] = {
        "training": training,
        "schedule": schedule,
        "overwrite": True,
        "checkpoint_every": None,
        "eval_every": None,
        "run_dir": lr_find_dir(recipe),
    }
    if isinstance(recipe, FinetuneRecipe):
        # The range test is of gradient steps on the task: no pair training first (method contrastive's LR is its own).
        update.update(seeds=None, draws=None, keep_best=False, early_stopping_patience=None, method="plain")
        # Of the first round's gradient steps: no self-training (its saved recipe, without the text, has none either).
        update.update(unlabelled_text=[], unlabelled_rows=None, self_training=type(recipe.self_training)())
    return recipe.model_copy(update=update)


def lr_find_dir(recipe) -> Path:
    """Where the range test of a recipe writes: beside its run_dir, which stays free for the real run."""
    return recipe.run_dir.with_name(recipe.run_dir.name + "-lr-find")


def smoothed(losses: list[float], fraction: float = SMOOTHING_FRACTION) -> list[float]:
    """A centred moving average over an odd window of about `fraction` of the steps (at least 3), narrower at the
    ends where fewer neighbours exist; it does not lag behind the LR as an exponential average does."""
    half = max(1, round(len(losses) * fraction) // 2)
    values = np.asarray(losses, dtype=np.float64)
    return [float(values[max(0, index - half) : index + half + 1].mean()) for index in range(len(values))]


def read_curve(metrics_path: Path) -> tuple[list[float], list[float]]:
    """(top group's LR, loss) of every logged training step, in step order."""
    train = [record for record in read_metrics(metrics_path) if record["phase"] == "train"]
    lrs = [max(record["lr"].items(), key=lambda item: int(item[0].rsplit("_", 1)[1]))[1] for record in train]
    return lrs, [record["loss"] for record in train]


def suggestions(lrs: list[float], losses: list[float]) -> dict:
    """The curve up to divergence and its readings: minimum, steepest descent, minimum / 10."""
    finite = next((index for index, loss in enumerate(losses) if not math.isfinite(loss)), len(losses))
    smooth = smoothed(losses[:finite])
    # Cut where the smoothed loss passes DIVERGENCE x its running minimum (or where the loss stopped being finite).
    kept = next(
        (index for index in range(len(smooth)) if smooth[index] > DIVERGENCE * min(smooth[: index + 1])), len(smooth)
    )
    if kept < 5:
        raise RunFailed(
            f"the range test has {kept} steps before the loss diverged: too few for a curve (lower "
            "--start-lr or raise --steps)"
        )
    diverged_at = lrs[kept] if kept < len(lrs) else None
    lrs, losses, smooth = lrs[:kept], losses[:kept], smooth[:kept]
    lowest = int(np.argmin(smooth))
    slopes = np.gradient(np.asarray(smooth), np.log(np.asarray(lrs)))
    steepest = int(np.argmin(slopes[: lowest + 1]))
    return {
        "lrs": lrs,
        "losses": losses,
        "smoothed": smooth,
        "diverged_at_lr": diverged_at,
        "minimum": {"lr": lrs[lowest], "smoothed_loss": smooth[lowest]},
        "steepest": {"lr": lrs[steepest], "smoothed_loss": smooth[steepest]},
        "suggested_lr": lrs[lowest] / 10,
    }


def curve_figure(result: dict):
    """Smoothed loss against the LR (log scale), with both readings marked."""
    figure, (axes,) = new_figure()
    axes.plot(result["lrs"], result["losses"], color="0.8", linewidth=0.8, label="loss")
    axes.plot(result["lrs"], result["smoothed"], color="C0", label="smoothed loss")
    axes.set_xscale("log")
    for name, lr, color in (
        ("steepest", result["steepest"]["lr"], "C1"),
        ("minimum / 10 (suggested)", result["suggested_lr"], "C2"),
    ):
        axes.axvline(lr, color=color, linestyle="--", label=f"{name}: {lr:.2e}")
    axes.set(xlabel="learning rate (top layer group)", ylabel="training loss", title="LR range test")
    # From the lowest loss to the start (or the end, if higher): the spikes of a diverging run would flatten the rest.
    low = min(min(result["losses"]), min(result["smoothed"]))
    high = max(result["smoothed"][0], result["smoothed"][-1])
    axes.set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.1 * (high - low + 1e-9))
    axes.legend()
    return figure


def markdown(result: dict, steps: int) -> str:
    """The readings as a short Markdown report."""
    lines = [
        f"# LR range test ({steps} steps, {len(result['lrs'])} before divergence)",
        "",
        "| reading | learning rate | smoothed loss |",
        "|---|---:|---:|",
        f"| minimum | {result['minimum']['lr']:.2e} | {result['minimum']['smoothed_loss']:.4f} |",
        f"| steepest descent | {result['steepest']['lr']:.2e} | {result['steepest']['smoothed_loss']:.4f} |",
        f"| **minimum / 10 (suggested)** | **{result['suggested_lr']:.2e}** | |",
        "",
        f"Use it with: `training.lr={result['suggested_lr']:.2g}`",
        "",
    ]
    return "\n".join(lines)


def run_lr_find(
    recipe: PretrainRecipe | FinetuneRecipe, steps: int = 100, start_lr: float = 1e-7, end_lr: float = 10.0
) -> dict:
    """Run the range test of a pretrain or finetune recipe; returns the readings (also written to disk)."""
    from finetune.stages.finetune import run_finetune
    from finetune.stages.pretrain import run_pretrain

    test = range_test_recipe(recipe, steps, start_lr, end_lr)
    console.print(f"LR range test: {steps} steps from {start_lr:.0e} to {end_lr:.0e} into {test.run_dir}")
    try:
        (run_pretrain if isinstance(test, PretrainRecipe) else run_finetune)(test)
    except RunFailed as failure:  # a diverged run: its logged steps still make the curve
        if not (test.run_dir / METRICS_FILE).is_file():
            raise
        console.print(f"the range test stopped: {failure}")
    result = suggestions(*read_curve(test.run_dir / METRICS_FILE))
    result.update(steps=steps, start_lr=start_lr, end_lr=end_lr)
    (test.run_dir / RESULT_JSON).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    report = markdown(result, steps)
    (test.run_dir / RESULT_MARKDOWN).write_text(report, encoding="utf-8")
    save_figure(curve_figure(result), test.run_dir / RESULT_PLOT)
    console.print(report)
    console.print(f"curve drawn in {test.run_dir / RESULT_PLOT}")
    return result
