"""A self-training run's rounds in words: RUN_DIR/self_training.md and the model card's section (the numbers are
stages/self_training.py's self_training.json)."""

from __future__ import annotations

CARD_SECTION = "Self-training"  # the heading of the model card's section on the rounds


def _rounds_table(summary: dict) -> list[str]:
    """Each round's pseudo-labelled rows per class, its training rows and dev scores (x 100, as GLUE reports them)."""
    rounds = summary["rounds"]
    classes = list(summary["labelled_rows"])
    metrics = [name for name in rounds[0] if name.startswith("dev_")]
    header = ["round", *(f"rows joined: {name}" for name in classes), "training rows"]
    header += [name.removeprefix("dev_") for name in metrics]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for entry in rounds:
        cells = [str(entry["round"]), *(f"{entry['added'].get(name, 0):,}" for name in classes)]
        cells += [f"{entry['training_rows']:,}", *(f"{100 * entry[name]:.1f}" for name in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _confidence_rule(threshold: float | None) -> str:
    if threshold is None:
        return "most confidently (the highest probabilities, no floor)"
    return f"most confidently, with probability >= {threshold:g}"


def _settings(summary: dict) -> str:
    labelled = ", ".join(f"{name} {count:,}" for name, count in summary["labelled_rows"].items())
    planned, final = summary["rounds_planned"], summary["final_round"]
    ended = f"before round {final + 1} ({summary['stopped']})" if summary["stopped"] else f"after {planned} round(s)"
    return (
        f"{summary['unlabelled_rows']:,} unlabelled rows; labelled rows per class: {labelled}. Round r trains from the "
        f"base model on the labelled rows and at most r x {summary['per_class']:,} rows of each class that round "
        f"r - 1's model labels {_confidence_rule(summary['threshold'])}. Self-training ended {ended}; the model "
        f"is {summary['kept_because']} (rounds: {summary['reason']})."
    )


def rounds_markdown(summary: dict) -> str:
    """RUN_DIR/self_training.md."""
    lines = [f"# Self-training: {len(summary['rounds']) - 1} round(s) after the first training", "", _settings(summary)]
    return "\n".join([*lines, "", *_rounds_table(summary)]) + "\n"


def card_text(summary: dict) -> str:
    """The model card's section: this model was self-trained, how, and each round's rows and dev scores."""
    return "\n".join([_settings(summary), "", *_rounds_table(summary)])
