"""RUN_DIR/dev_predictions.jsonl: the saved checkpoint's prediction of every dev row, which `finetune runs compare`
pairs two runs by.

One JSON object a line, in the dev set's order (the dev file's, or with task.dev_split the held-out rows' in the
training file's order): `row` (its place in the dev set, from 0), `key` (the first 12 hex digits of the SHA-1 of its
text columns joined by tabs: two runs are paired on a row only where their keys agree), `label` (the gold label) and
`predicted`. A classifier's rows name the classes and add `probabilities` ({class: probability}, in the task's label
order); a multi-label classifier's give lists of labels and each label's probability; regression's give numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finetune.errors import UserError


def row_keys(texts: Sequence[Sequence[str]]) -> list[str]:
    """Each row's key: the first 12 hex digits of the SHA-1 of its text columns joined by tabs."""
    return [hashlib.sha1("\t".join(row).encode("utf-8", "surrogatepass")).hexdigest()[:12] for row in texts]


def classifier_rows(
    keys: list[str], labels: tuple[str, ...], references: np.ndarray, predictions: np.ndarray, probabilities
) -> list[dict[str, Any]]:
    """A classifier's rows: gold and predicted class by name, and every class's probability."""
    return [
        {
            "row": row,
            "key": key,
            "label": labels[int(reference)],
            "predicted": labels[int(prediction)],
            "probabilities": {label: round(float(value), 6) for label, value in zip(labels, shares, strict=True)},
        }
        for row, (key, reference, prediction, shares) in enumerate(zip(keys, references, predictions, probabilities))
    ]


def score_rows(keys: list[str], references: np.ndarray, predictions: np.ndarray) -> list[dict[str, Any]]:
    """A regression's rows: gold and predicted scores."""
    return [
        {"row": row, "key": key, "label": float(reference), "predicted": float(prediction)}
        for row, (key, reference, prediction) in enumerate(zip(keys, references, predictions))
    ]


def label_set_rows(
    keys: list[str], labels: tuple[str, ...], references: np.ndarray, predicted: np.ndarray, probabilities
) -> list[dict[str, Any]]:
    """A multi-label classifier's rows: the gold and predicted label lists, and every label's probability."""
    return [
        {
            "row": row,
            "key": key,
            "label": [label for label, on in zip(labels, reference, strict=True) if on],
            "predicted": [label for label, on in zip(labels, chosen, strict=True) if on],
            "probabilities": {label: round(float(value), 6) for label, value in zip(labels, shares, strict=True)},
        }
        for row, (key, reference, chosen, shares) in enumerate(zip(keys, references, predicted, probabilities))
    ]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """The rows as JSON Lines (written whole, then renamed into place: a reader never sees half a file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    partial.replace(path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A dev_predictions.jsonl's rows; a file not written by finetune is one line naming it."""
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not all(isinstance(row, dict) and {"key", "label", "predicted"} <= row.keys() for row in rows):
            raise ValueError("each line needs key, label and predicted")
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not the dev predictions of a finetune run ({error})") from None
    return rows
