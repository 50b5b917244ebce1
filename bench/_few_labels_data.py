"""What bench/few_labels.py, few_labels_vs_setfit.py and scalar_mix_sst2.py share: labelled rows drawn per seed from a
GLUE training file, written as task folders, and the check that every arm's recipe is valid before any run."""

from __future__ import annotations

import json
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from _common import GLUE, ROOT, TASKS

TRAINING_DEV_ROWS = 8  # the stage's own per-epoch dev evaluation runs on these few labelled rows: cheap and ignored


@dataclass
class TrainingFile:
    """A task's train.tsv as lines: its header (empty for CoLA) and its rows, each line ending in its newline."""

    header: list[str]
    rows: list[str]


def read_training_file(task: str) -> TrainingFile:
    """The task's training rows, split on newlines only (str.splitlines would also split on \\x85 or U+2028)."""
    text = (GLUE / TASKS[task].folder / "train.tsv").read_text(encoding="utf-8")
    lines = [line + "\n" for line in text.removesuffix("\n").split("\n")]
    return TrainingFile(lines[:1], lines[1:]) if TASKS[task].header else TrainingFile([], lines)


def draw_rows(rows: int, labels: int, held_out: int, seed: int) -> tuple[list[int], list[int]]:
    """Row indices: `labels` labelled rows and `held_out` rows none of them, both drawn at random by `seed`.

    One permutation per seed: the labelled rows are its first `labels` (so the 100 rows of a seed are among its
    500 and 1,000), the held-out rows its last `held_out` (the same rows for every size and variant of a seed).
    """
    if labels + held_out > rows:
        sys.exit(f"bench: {labels} labelled + {held_out} held-out rows, but the training file has only {rows}")
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    return order[:labels], order[rows - held_out :] if held_out else []


def write_task_folders(
    task: str, training: TrainingFile, labels: int, held_out: int, seed: int, folder: Path
) -> tuple[Path, Path]:
    """(training folder, scoring folder) for one run.

    The training folder holds the labelled rows as train.tsv and TRAINING_DEV_ROWS of them as dev.tsv: the stage
    evaluates on dev.tsv after every epoch, which with the real dev set would cost more than training at 100 labels
    (and with --select must never read it). The scoring folder's dev.tsv is the held-out rows with `held_out`,
    else the task's own folder (the real dev set).
    """
    labelled, held = draw_rows(len(training.rows), labels, held_out, seed)
    training_folder = folder / "train"
    training_folder.mkdir(parents=True)
    chosen = [training.rows[index] for index in labelled]
    (training_folder / "train.tsv").write_text("".join(training.header + chosen), encoding="utf-8")
    (training_folder / "dev.tsv").write_text("".join(training.header + chosen[:TRAINING_DEV_ROWS]), encoding="utf-8")
    if not held_out:
        return training_folder, GLUE / TASKS[task].folder
    scoring_folder = folder / "held-out"
    scoring_folder.mkdir()
    rows = [training.rows[index] for index in held]
    (scoring_folder / "dev.tsv").write_text("".join(training.header + rows), encoding="utf-8")
    return training_folder, scoring_folder


def check_recipes(recipes: dict[str, tuple[dict, list[str]]]) -> None:
    """Stop before any run, naming the arm, when an arm's recipe (a dict, and its overrides) is not valid in this
    checkout (its paths are not checked: a key this version does not know, a value out of range)."""
    sys.path.insert(0, str(ROOT))  # this checkout's finetune
    from finetune.errors import UserError
    from finetune.recipes import load_recipe

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "recipe.yaml"
        for arm, (recipe, overrides) in recipes.items():
            path.write_text(json.dumps(recipe), encoding="utf-8")  # JSON is YAML
            try:
                load_recipe(path, overrides, expected_stage="finetune", check_paths=False)
            except UserError as error:
                sys.exit(f"bench: arm {arm} ({json.dumps(overrides)}) is not a valid recipe in this checkout: {error}")
