"""Calibration at the end of a fine-tuning run (recipe key `calibration`; the fit and the measures:
inference/calibration.py), for the kinds whose section lists a method (`calibrations`: one softmax over classes).

The fit needs the dev logits of the saved weights. With keep_best those are the best evaluation's, which the
in-memory model no longer computes (it holds the last weights) and which may come from the process a --resume
replaced: they are kept beside the best weights (BEST_LOGITS_FILE, as best_classes.json), travel with the periodic
checkpoints and are committed with the weights. Without keep_best the last evaluation's are the saved weights' own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from finetune.inference.calibration import TEMPERATURE_BOUNDS, at_a_bound, calibration_record
from finetune.kinds.fine_tuning import say
from finetune.models.heads import TEMPERATURE_KEY
from finetune.reporting.calibration_report import calibration_summary
from finetune.training.checkpoints import set_config_entry

BEST_LOGITS_FILE = "best_dev_logits.npy"  # beside the best weights until the end: their evaluation's dev logits


def keep_best_logits(folder: Path, logits: np.ndarray) -> None:
    """Write the best evaluation's dev logits beside its weights (a folder just written, whose files are new)."""
    np.save(folder / BEST_LOGITS_FILE, logits, allow_pickle=False)


def take_best_logits(checkpoint: Path) -> np.ndarray | None:
    """The dev logits committed with the best weights, removed from the checkpoint; None for weights saved before
    runs kept them (a run resumed from an older version's checkpoint)."""
    path = checkpoint / BEST_LOGITS_FILE
    if not path.is_file():
        return None
    logits = np.load(path, allow_pickle=False)
    path.unlink()
    return logits


def calibrate_checkpoint(method: str, checkpoint: Path, logits: np.ndarray, labels: np.ndarray) -> dict:
    """result.json's `calibration` of the saved weights' dev `logits`; with a method, its temperature written into
    the checkpoint's config.json (what predict divides the logits by). Says the result in one line."""
    record = calibration_record(method, logits, labels)
    if method != "none":
        set_config_entry(checkpoint, TEMPERATURE_KEY, record["temperature"])
    say(calibration_summary(record))
    temperature = record["temperature"]
    if method != "none" and at_a_bound(temperature):
        low, high = TEMPERATURE_BOUNDS
        why = (
            "sharper probabilities keep gaining on dev, as when the model gets every dev example right"
            if temperature < 1
            else "flatter probabilities keep gaining on dev, as when the model does no better than chance there"
        )
        say(f"note: the temperature stopped at the end of its range ({low:g} to {high:g}): {why}; more dev rows help")
    return record
