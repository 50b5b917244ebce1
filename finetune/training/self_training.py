"""Self-training's rows: which texts the previous round's model labelled confidently enough to train on, and the
record of them a round keeps (RUN_DIR/pseudo_labelled.jsonl).

Per predicted class the `cap` most confident rows join (ties in the unlabelled text's order), with a threshold only
those whose top class's probability reaches it: a ranking, not a fixed floor, by default, since how high a model's
probabilities go depends on how it was trained (after method contrastive's logistic regression no SST-2 row reached
0.9 at 8 or 16 labels per class, so a floor of 0.9 let nothing join), while which rows it is surest of does not.
Capping each class keeps the rows balanced: the class the model favours cannot take over the training set. A text
that is one of the run's labelled training rows or dev rows never joins (its training row has a true label; a dev
row is what the rounds are scored on), nor a text a second time. The choice depends on the probabilities alone: the
same model on the same text chooses the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from finetune.data.examples import TaskExamples
from finetune.errors import UserError

PSEUDO_LABELLED_FILE = "pseudo_labelled.jsonl"  # in a round's run folder: the rows that joined, with their labels
PHASE = "self_training"  # metrics.jsonl records of the rounds


def text_key(texts: Sequence[str]) -> tuple[str, ...]:
    """What two rows' texts are compared by: their columns without surrounding whitespace."""
    return tuple(text.strip() for text in texts)


@dataclass(frozen=True)
class Selection:
    """The rows that join a round: positions in the unlabelled text (in its order), their classes and probabilities,
    and per class how many were confident (at or above the threshold; without one, every row left in) and how many
    joined."""

    rows: np.ndarray
    labels: np.ndarray
    confidence: np.ndarray
    confident: dict[str, int]
    added: dict[str, int]


def select_confident(
    probabilities: np.ndarray,
    keys: Sequence[tuple[str, ...]],
    excluded: set[tuple[str, ...]],
    threshold: float | None,
    cap: int,
    names: Sequence[str],
) -> Selection:
    """At most `cap` rows per predicted class, the most confident, of those whose top probability reaches `threshold`
    (None: any), leaving out the texts of `excluded` and any text seen before (`keys`: each row's text_key)."""
    confidence, predicted = probabilities.max(axis=1), probabilities.argmax(axis=1)
    seen = set(excluded)
    eligible = np.zeros(len(keys), dtype=bool)
    for row, key in enumerate(keys):
        eligible[row] = (threshold is None or confidence[row] >= threshold) and key not in seen
        seen.add(key)  # a repeated text joins once, as its first row
    taken = []
    for index in range(len(names)):
        rows = np.flatnonzero(eligible & (predicted == index))
        order = np.lexsort((rows, -confidence[rows]))  # most confident first; ties: the earlier row
        taken.append(rows[order][:cap])
    rows = np.sort(np.concatenate(taken)).astype(np.int64)
    return Selection(
        rows,
        predicted[rows].astype(np.int64),
        confidence[rows],
        {name: int((eligible & (predicted == index)).sum()) for index, name in enumerate(names)},
        {name: len(chosen) for name, chosen in zip(names, taken)},
    )


@dataclass
class PseudoLabelled:
    """A round's pseudo-labelled rows as its stage takes them: `texts` as the model reads them (a task.text template
    filled in), `columns` as the file gave them, a class index and probability each, and the round's record."""

    texts: list[tuple[str, ...]]
    columns: list[tuple[str, ...]]
    labels: np.ndarray
    confidence: np.ndarray
    record: dict[str, Any] = field(default_factory=dict)

    def joined(self, examples: TaskExamples) -> TaskExamples:
        """The labelled examples with these rows after them."""
        assert examples.labels is not None  # the labelled training rows
        return TaskExamples(
            [*examples.texts, *self.texts],
            np.concatenate([examples.labels, self.labels.astype(examples.labels.dtype)]),
            [*examples.ids, *(f"pseudo-{row}" for row in range(len(self.texts)))],
        )

    def file_rows(self, text_columns: Sequence[str], names: Sequence[str]) -> list[dict[str, Any]]:
        """The rows of pseudo_labelled.jsonl: the text columns, the class given and its probability."""
        return [
            {**dict(zip(text_columns, columns)), "label": names[int(label)], "probability": round(float(p), 6)}
            for columns, label, p in zip(self.columns, self.labels, self.confidence)
        ]

    def write(self, run_dir: Path, text_columns: Sequence[str], names: Sequence[str]) -> None:
        """RUN_DIR/pseudo_labelled.jsonl."""
        lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in self.file_rows(text_columns, names))
        (Path(run_dir) / PSEUDO_LABELLED_FILE).write_text("".join(lines), encoding="utf-8")

    def recorded_in(self, run_dir: Path, text_columns: Sequence[str], names: Sequence[str]) -> bool | None:
        """Whether RUN_DIR/pseudo_labelled.jsonl records these rows (texts and labels; not the probabilities, whose
        last digits may differ from one machine to another); None where there is no such file."""
        path = Path(run_dir) / PSEUDO_LABELLED_FILE
        if not path.is_file():
            return None
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        recorded = [_without_probability(json.loads(line)) for line in lines]
        return recorded == [_without_probability(row) for row in self.file_rows(text_columns, names)]

    def check_recorded(self, run_dir: Path, text_columns: Sequence[str], names: Sequence[str]) -> None:
        """For --resume of a round: the rows chosen now are those the round started with."""
        if self.recorded_in(run_dir, text_columns, names) is False:
            path = Path(run_dir) / PSEUDO_LABELLED_FILE
            raise UserError(
                f"unlabelled_text: the previous round's model now labels other rows than {path} recorded (the text "
                "or the model changed since the round started); restore them, or start again with overwrite=true"
            )


def _without_probability(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key != "probability"}


def pseudo_labelled(
    selection: Selection, unlabelled: TaskExamples, model_texts, record: dict[str, Any]
) -> PseudoLabelled:
    """The selected rows of `unlabelled` (their columns as read) as a round's stage takes them; `model_texts`: the
    task spec's, which fills in a task.text template."""
    columns = [tuple(unlabelled.texts[int(row)]) for row in selection.rows]
    return PseudoLabelled(
        [model_texts(texts) for texts in columns], columns, selection.labels, selection.confidence, record
    )
