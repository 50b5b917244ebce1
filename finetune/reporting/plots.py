"""PNG plots of a run, drawn from its metrics.jsonl: loss, learning rates, evaluations, throughput; and from a finetune
run's result.json, the reliability diagram of its classifier's probabilities (calibration).

Figures use matplotlib's object API on the Agg canvas: no pyplot, no display, no global state, so a
run on a headless machine and a call from a notebook draw the same files. `finetune plot RUN_DIR`
redraws them at any time.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from finetune.console import console
from finetune.run_dir import METRICS_FILE, read_numbered_metrics

PLOTS_DIR = "plots"  # inside the run directory
RESULT_FILE = "result.json"  # a finetune run's result: its calibration is drawn as RELIABILITY_PLOT
RELIABILITY_PLOT = "reliability"
FIGURE_SIZE = (8.0, 4.5)  # inches: 800 x 450 pixels at DPI
DPI = 100
UNFREEZE_MARK = "unfreeze"  # gid of the vertical lines drawn at the unfreezing steps
LOG_SCALE_SPREAD = 10.0  # top group's peak LR / bottom group's above which the LR axis is logarithmic
NOT_METRICS = {"phase", "step", "epoch", "best_so_far", "validation_loss"}  # validation_loss is in the loss plot


def records_of(records: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    """The records of one phase (train, eval, unfreeze), in order."""
    return [record for record in records if record.get("phase") == phase]


def is_number(value: Any) -> bool:
    """True for ints and floats, not for bools (best_so_far) or strings."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def new_figure(columns: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure of FIGURE_SIZE on the Agg canvas with `columns` axes side by side."""
    figure = Figure(figsize=FIGURE_SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, list(figure.subplots(1, columns, squeeze=False)[0])


def save_figure(figure: Figure, path: Path) -> Path:
    """Write the figure as a PNG of exactly FIGURE_SIZE x DPI pixels (no tight bounding box)."""
    figure.savefig(path, dpi=DPI, format="png")
    return path


def loss_figure(records: list[dict[str, Any]]) -> Figure | None:
    """Training loss of each logged window and validation loss of each evaluation, over optimizer steps."""
    train = records_of(records, "train")
    validation = [record for record in records_of(records, "eval") if is_number(record.get("validation_loss"))]
    if not train and not validation:
        return None
    figure, (axes,) = new_figure()
    if train:
        axes.plot([record["step"] for record in train], [record["loss"] for record in train], label="training loss")
    if validation:
        axes.plot(
            [record["step"] for record in validation],
            [record["validation_loss"] for record in validation],
            marker="o",
            label="validation loss",
        )
    for floor in records_of(records, "floor"):  # `ngram_floor`: the loss a network has to go below
        axes.axhline(
            floor["validation_loss"], color="gray", linestyle="--", label=f"{floor['model']} floor (validation)"
        )
    axes.set(xlabel="optimizer step", ylabel="loss", title="loss")
    axes.grid(alpha=0.3)
    axes.legend()
    return figure


def group_index(name: str) -> int:
    """The depth from the bottom of a logged layer group: `group_3` -> 3."""
    return int(name.rsplit("_", 1)[-1])


def unfreezing_marks(records: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(step, trainable groups, total groups) of each unfreeze record that thaws more groups than the one before."""
    marks, previous = [], None
    for record in records_of(records, "unfreeze"):
        if previous is not None and record["trainable_groups"] > previous:
            marks.append((record["step"], record["trainable_groups"], record["total_groups"]))
        previous = record["trainable_groups"]
    return marks


def is_trainable(group: int, step: int, unfreezing: list[dict[str, Any]]) -> bool:
    """Whether `group` trained at optimizer step `step`: the unfreeze record logged before that step decides."""
    before = [record for record in unfreezing if record["step"] < step]
    if not before:  # no gradual unfreezing (pretraining, mode none): every group trains
        return True
    latest = before[-1]
    return group >= latest["total_groups"] - latest["trainable_groups"]


def learning_rate_figure(records: list[dict[str, Any]]) -> Figure | None:
    """The LR of each layer group over the steps (solid while it trains), the unfreezing steps as vertical lines.

    The schedule's shape (STLR's short rise and long decay) shows in every line, the discriminative
    factor as the spacing between them (a log axis once it exceeds LOG_SCALE_SPREAD).
    """
    train = [record for record in records_of(records, "train") if isinstance(record.get("lr"), dict) and record["lr"]]
    if not train:
        return None
    steps = [record["step"] for record in train]
    names = sorted(train[0]["lr"], key=group_index)
    series = {name: [record["lr"].get(name, math.nan) for record in train] for name in names}
    unfreezing = records_of(records, "unfreeze")
    figure, (axes,) = new_figure()
    if all(series[name] == series[names[0]] for name in names):  # one LR for all: one line says it
        axes.plot(steps, series[names[0]], label=f"all {len(names)} layer groups")
    else:
        any_frozen = False
        for name in names:
            trains = [is_trainable(group_index(name), step, unfreezing) for step in steps]
            # The frozen stretch runs to the first trained point, so the dotted and solid parts join.
            frozen = [not trained or (index > 0 and not trains[index - 1]) for index, trained in enumerate(trains)]
            label = f"group {group_index(name)}" + (
                " (bottom)" if name == names[0] else " (top)" if name == names[-1] else ""
            )
            (line,) = axes.plot(
                steps, [lr if trained else math.nan for lr, trained in zip(series[name], trains)], label=label
            )
            if any(frozen):
                any_frozen = True
                axes.plot(
                    steps,
                    [lr if off else math.nan for lr, off in zip(series[name], frozen)],
                    linestyle=":",
                    color=line.get_color(),
                    alpha=0.6,
                )
        if any_frozen:
            axes.plot([], [], linestyle=":", color="gray", label="frozen (LR not applied)")
        peaks = [max((lr for lr in series[name] if lr > 0), default=math.nan) for name in names]
        if min(peaks) > 0 and max(peaks) / min(peaks) > LOG_SCALE_SPREAD:
            axes.set_yscale("log")
    mark_unfreezing(axes, records)
    axes.set(xlabel="optimizer step", ylabel="learning rate", title="learning rate per layer group")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return figure


def mark_unfreezing(axes, records: list[dict[str, Any]]) -> None:
    """A dashed vertical line at each unfreezing step, labelled with the layer groups then trained (of all)."""
    for index, (step, trainable, total) in enumerate(unfreezing_marks(records)):
        axes.axvline(
            step,
            color="gray",
            linestyle="--",
            linewidth=1,
            gid=UNFREEZE_MARK,
            label="unfreezing" if index == 0 else "_nolegend_",
        )
        axes.annotate(
            f"{trainable}/{total}",
            xy=(step, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize=8,
            color="gray",
        )


def evaluation_metrics(evaluations: list[dict[str, Any]]) -> list[str]:
    """The numeric metric names of the evaluation records, in first-seen order."""
    names: dict[str, None] = {}
    for record in evaluations:
        names.update({key: None for key, value in record.items() if key not in NOT_METRICS and is_number(value)})
    return list(names)


def evaluation_figure(records: list[dict[str, Any]]) -> Figure | None:
    """Dev (or validation) metrics over the evaluations: scores within [-1, 1] together, others on their own axes."""
    evaluations = records_of(records, "eval")
    names = evaluation_metrics(evaluations)
    if not names:
        return None
    scores = [
        name for name in names if all(-1 <= record[name] <= 1 for record in evaluations if is_number(record.get(name)))
    ]
    panels = ([scores] if scores else []) + [[name] for name in names if name not in scores]
    figure, axes_list = new_figure(len(panels))
    for axes, panel in zip(axes_list, panels):
        for name in panel:
            points = [(record["step"], record[name]) for record in evaluations if is_number(record.get(name))]
            axes.plot([step for step, _ in points], [value for _, value in points], marker="o", label=name)
        axes.set(xlabel="optimizer step", title="scores" if panel is scores else panel[0])
        axes.grid(alpha=0.3)
        if panel is scores:
            axes.legend(fontsize=8)
    figure.suptitle("evaluations")
    return figure


def throughput_figure(records: list[dict[str, Any]]) -> Figure | None:
    """Items per second of each logged window (examples or tokens, all processes together)."""
    train = records_of(records, "train")
    keys = [key for key in (train[0] if train else {}) if key.endswith("_per_s")]
    if not keys:
        return None
    key, unit = keys[0], keys[0].removesuffix("_per_s")
    points = [(record["step"], record[key]) for record in train if is_number(record.get(key))]
    figure, (axes,) = new_figure()
    axes.plot([step for step, _ in points], [value for _, value in points], marker=".")
    axes.set(xlabel="optimizer step", ylabel=f"{unit} per second", title=f"throughput ({unit}/s, all processes)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    return figure


def reliability_figure(calibration: dict[str, Any]) -> Figure:
    """A finetune run's reliability diagram (result.json's `calibration`): per confidence bin of the dev set, the
    accuracy against the mean confidence, before and after the temperature, beside the diagonal a calibrated model
    follows; and how many dev examples each bin holds."""
    figure, (diagram, counts) = new_figure(2)
    diagram.plot([0, 1], [0, 1], color="gray", linestyle="--", label="calibrated (accuracy = confidence)")
    bins, dev = calibration["bins"], calibration["dev"]
    calibrated = calibration["method"] != "none"
    curves = [("before", f"{'before: ' if calibrated else ''}softmax(logits), ECE {dev['ece_before']:.3f}", "o")]
    if calibrated:
        label = f"after: softmax(logits / {calibration['temperature']:.2f}), ECE {dev['ece_after']:.3f}"
        curves.append(("after", label, "s"))
    width = 1 / bins / len(curves)
    for offset, (moment, label, marker) in enumerate(curves):
        table = calibration["reliability"][moment]
        filled = [index for index, rows in enumerate(table["rows"]) if rows]  # an empty bin has no point
        confidence, accuracy = ([table[key][index] for index in filled] for key in ("confidence", "accuracy"))
        diagram.plot(confidence, accuracy, marker=marker, label=label)
        lowers = [index / bins + offset * width for index in range(bins)]
        counts.bar(lowers, table["rows"], width=width, align="edge", label=moment)
    edges = (-0.02, 1.02)  # a bin all right (or all wrong) is drawn whole, not cut at the frame
    diagram.set(xlabel="confidence (top probability)", ylabel="accuracy", xlim=edges, ylim=edges)
    diagram.set_title(f"reliability ({calibration['rows']} dev examples)")
    diagram.grid(alpha=0.3)
    diagram.legend(fontsize=8, loc="best")  # where the points leave room: above or below the diagonal
    counts.set(xlabel="confidence (top probability)", ylabel="dev examples", xlim=(0, 1))
    counts.set_title(f"examples per bin ({bins} bins)")
    counts.grid(alpha=0.3)
    if calibrated:
        counts.legend(fontsize=8, loc="upper left")
    return figure


PLOTS: dict[str, Callable[[list[dict[str, Any]]], Figure | None]] = {
    "loss": loss_figure,
    "learning_rates": learning_rate_figure,
    "evaluation": evaluation_figure,
    "throughput": throughput_figure,
}


def plotted_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl that the plots read, saying in one line each what is left out: records
    without a phase (named by their first line), and a last line a running job is still writing."""
    numbered, partial = read_numbered_metrics(path, partial_end_ok=True)
    without = [number for number, record in numbered if "phase" not in record]
    if without:
        more = f" (nor {len(without) - 1} more such lines)" if len(without) > 1 else ""
        _note(f"{path} line {without[0]}: a record without 'phase' (train, eval, unfreeze) is not plotted{more}")
    if partial is not None:
        _note(f"{path} line {partial}: not complete yet (a running job is writing it); plotted without it")
    return [record for _, record in numbered if "phase" in record]


def _note(line: str) -> None:
    console.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)


def write_plots(run_dir: Path) -> list[Path]:
    """Draw every plot the run's metrics.jsonl has data for into RUN_DIR/plots/; returns the files written."""
    records = plotted_records(Path(run_dir) / METRICS_FILE)
    folder = Path(run_dir) / PLOTS_DIR
    folder.mkdir(exist_ok=True)
    written = []
    for name, draw in PLOTS.items():
        figure = draw(records)
        if figure is not None:
            written.append(save_figure(figure, folder / f"{name}.png"))
    calibration = run_calibration(Path(run_dir))
    if calibration is not None:
        written.append(save_figure(reliability_figure(calibration), folder / f"{RELIABILITY_PLOT}.png"))
    return written


def run_calibration(run_dir: Path) -> dict[str, Any] | None:
    """The calibration a finetune run recorded in its result.json (None: another stage, or another kind)."""
    path = run_dir / RESULT_FILE
    result = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    calibration = result.get("calibration") if isinstance(result, dict) else None
    return calibration if isinstance(calibration, dict) and "reliability" in calibration else None


def write_plots_or_warn(run_dir: Path) -> list[Path]:
    """`write_plots` at the end of a run: a failure is a warning, never the end of a run whose results are saved."""
    try:
        return write_plots(run_dir)
    except Exception as error:
        warnings.warn(
            f"could not draw the plots of {run_dir} ({type(error).__name__}: {error}); "
            f"retry with `finetune plot {run_dir}`",
            RuntimeWarning,
            stacklevel=2,
        )
        return []
