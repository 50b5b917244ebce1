"""The calibration of a fine-tuned classifier (result.json's `calibration`, inference/calibration.py) in words: the
line a run ends with and the model card's table. RUN_DIR/plots/reliability.png draws it (reporting/plots.py)."""

from __future__ import annotations

from finetune.models.heads import TEMPERATURE_KEY

# (the card's name, the line's, result.json's key before _before / _after)
MEASURES = (
    ("expected calibration error", "ECE", "ece"),
    ("Brier score", "Brier", "brier"),
    ("negative log-likelihood", "NLL", "nll"),
)


def calibration_summary(calibration: dict) -> str:
    """One line: the dev ECE, Brier score and NLL of the probabilities, before and after the temperature."""
    dev, rows = calibration["dev"], calibration["rows"]
    if calibration["method"] == "none":
        measures = ", ".join(f"{short} {dev[key + '_before']:.4f}" for _, short, key in MEASURES)
        return f"calibration: none; dev ({rows} rows) {measures}"
    measures = ", ".join(
        f"{short} {dev[key + '_before']:.4f} -> {dev[key + '_after']:.4f}" for _, short, key in MEASURES
    )
    return f"calibration: temperature {calibration['temperature']:.4f} fitted on dev ({rows} rows): {measures}"


def calibration_markdown(calibration: dict) -> str:
    """The model card's Calibration section: the measures (before and after the temperature), and how the
    probabilities are made."""
    dev, temperature = calibration["dev"], calibration["temperature"]
    if calibration["method"] == "none":
        table = ["| measure | value |", "|---|---:|"] + [
            f"| {name} | {dev[key + '_before']:.4f} |" for name, _, key in MEASURES
        ]
        how = (
            "The probabilities are the model's own softmax (`calibration: none`); `calibration: temperature` would "
            "fit a temperature to them on dev."
        )
    else:
        table = ["| measure | before | after |", "|---|---:|---:|"] + [
            f"| {name} | {dev[key + '_before']:.4f} | {dev[key + '_after']:.4f} |" for name, _, key in MEASURES
        ]
        how = (
            f"`finetune predict` returns softmax(logits / T), T = {temperature:.4f} fitted on dev (temperature "
            f"scaling, Guo et al. 2017), kept in config.json as `{TEMPERATURE_KEY}`; its labels are those of the "
            "logits. Loaded with transformers, the model gives the logits before the division: divide them by "
            f"`model.config.{TEMPERATURE_KEY}` before the softmax."
        )
    lines = "\n".join(table)
    return f"""
## Calibration

How far the probabilities are from how often the model is right, on the dev set ({calibration["rows"]} examples;
expected calibration error over {calibration["bins"]} equal-width confidence bins):

{lines}

{how}
"""
