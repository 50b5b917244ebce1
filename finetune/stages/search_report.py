"""What a search and a cross-validation write for a reader: Markdown tables and the search's history plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def search_markdown(summary: dict[str, Any]) -> str:
    """Every trial of a search: its state, score and values, the best one marked."""
    keys = list(summary["space"])
    metric, best = summary["metric"], summary["best_trial"]
    lines = [
        f"# search: {metric} ({summary['direction']}), {len(summary['trials'])} trials",
        "",
        "space: " + "; ".join(f"{key} {spec}" for key, spec in summary["space"].items()),
        "",
        f"| trial | state | {metric} | " + " | ".join(keys) + " | run |",
        "|---:|---|---:|" + "---:|" * len(keys) + "---|",
    ]
    for row in summary["trials"]:
        value = "" if row["value"] is None else f"{row['value']:.4f}"
        if value and row.get("stopped_at_step") is not None:  # not a finished run's score: say where it stopped
            value += f" (step {row['stopped_at_step']})"
        mark = " (best)" if row["trial"] == best else ""
        params = " | ".join(_cell(row["params"].get(key)) for key in keys)
        lines.append(f"| {row['trial']}{mark} | {row['state']} | {value} | {params} | {row['run_dir'] or ''} |")
    if any(row.get("stopped_at_step") is not None for row in summary["trials"]):
        lines += ["", "A pruned trial's score is its dev score at the step where it was stopped, not a finished run's."]
    if best is not None:
        lines += ["", f"best: trial {best}, {metric} {summary['best_value']:.4f}"]
    return "\n".join(lines) + "\n"


def write_search_plot(summary: dict[str, Any], path: Path) -> None:
    """The optimization history: each finished trial's score and the best so far (pruned trials left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [row for row in summary["trials"] if row["state"] == "complete"]
    numbers, values = [row["trial"] for row in done], [row["value"] for row in done]
    pick = min if summary["direction"] == "minimize" else max
    best_so_far = [pick(values[: index + 1]) for index in range(len(values))]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.scatter(numbers, values, label="trial", color="tab:blue")
    axes.step(numbers, best_so_far, where="post", label="best so far", color="tab:red")
    axes.set_xlabel("trial")
    axes.set_ylabel(summary["metric"])
    axes.set_title(f"search: {summary['metric']} ({summary['direction']})")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def cv_markdown(summary: dict[str, Any]) -> str:
    """Each fold's dev scores and their mean and standard deviation."""
    metrics = list(summary["metrics"])
    lines = [
        f"# {summary['folds']}-fold cross-validation ({summary['splitter']}, seed {summary['seed']})",
        "",
        "| fold | " + " | ".join(metrics) + " |",
        "|---:|" + "---:|" * len(metrics),
    ]
    for index in range(summary["folds"]):
        lines.append(
            f"| {index} | " + " | ".join(f"{summary['metrics'][m]['values'][index]:.4f}" for m in metrics) + " |"
        )
    for statistic in ("mean", "std"):
        lines.append(
            f"| {statistic} | " + " | ".join(f"{summary['metrics'][m][statistic]:.4f}" for m in metrics) + " |"
        )
    return "\n".join(lines) + "\n"
