"""`finetune predict CHECKPOINT`: labels and probabilities (or scores) of a fine-tuned checkpoint for raw text.

The checkpoint's own finetune_recipe.yaml says what it reads and predicts: the task's text columns (one, two for a
pair task, or the columns its `task.text` template or `pair: false` makes one text of), its labels,
`task.max_length` and `task.long_documents` (head_tail or chunks read a long text as it was trained). Input is
either plain text, one example per line (several text columns: separated by tabs, in the task's column order), or a
TSV / CSV / JSON Lines file holding the text columns by name (other columns, a label column included, are ignored).
Examples are batched longest first like `finetune eval`, with a progress bar on long input; outputs keep the input's
order.

Output rows: the input's texts, `label` and `probabilities` (one per label, in label order) for classification,
`score` for regression, `labels` (those above the checkpoint's saved decision threshold) and `probabilities` for a
multi-label classifier, `words` and their `tags` for a tagger (task kind tokens: plain text, a sentence per line),
`id`, `label` (the chosen choice's) and `probabilities` (per choice label) for a multiple-choice model (task kind
choices: JSON Lines in ARC's layout, answerKey not needed, output JSON Lines only); `answer`, `score`, `start` and
`end` (characters of the context) for question answering (task kind spans: a question and its context per row:
JSON Lines, TSV / CSV with those columns, or plain lines `question<TAB>context`); as JSON Lines (the default, and on
stdout) or as TSV / CSV by the output file's extension. A file is written under
a temporary name and renamed when complete.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from finetune.data.task_files import FORMAT_BY_EXTENSION
from finetune.errors import UserError, recipe_key
from finetune.kinds.predictor import STDIO, TaskPredictor
from finetune.kinds.registry import kind_of
from finetune.models.hub import resolve_checkpoint
from finetune.tasks.specs import TaskSpec, task_spec
from finetune.training.checkpoints import HYPERPARAMETERS_FILE


def load_predictor(checkpoint: str, batch_size: int = 64, max_length: int | None = None) -> TaskPredictor:
    """The checkpoint with the task of its finetune_recipe.yaml (a local folder, or a hub name with a network): its
    kind's predictor (kinds/K/predictor.py), which takes that kind's inputs."""
    from finetune.recipes import FinetuneRecipe, load_recipe

    with recipe_key("CHECKPOINT"):
        folder = resolve_checkpoint(checkpoint)
    # A hub name: only the recipe file is fetched here, the weights by transformers.
    recipe_file = Path(folder) / HYPERPARAMETERS_FILE if Path(folder).is_dir() else _hub_file(checkpoint)
    if recipe_file is None or not recipe_file.is_file():
        raise UserError(
            f"CHECKPOINT: {checkpoint} has no {HYPERPARAMETERS_FILE}: predict needs a checkpoint "
            "fine-tuned by finetune (the file names the task's text columns and labels)"
        )
    recipe = load_recipe(recipe_file, expected_stage="finetune", check_paths=False)
    assert isinstance(recipe, FinetuneRecipe)  # expected_stage: any other recipe is refused
    spec = task_spec(recipe.task)
    return kind_of(spec).predictor(folder, recipe, spec, batch_size, max_length)


def _hub_file(repository: str) -> Path | None:
    """The recipe file of a hub repository (None when it has none); a hub that cannot be reached is a UserError."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(repository, HYPERPARAMETERS_FILE))
    except EntryNotFoundError:
        return None
    except Exception as error:  # offline, unknown repository, no permission
        raise UserError(
            f"CHECKPOINT: cannot fetch {HYPERPARAMETERS_FILE} of {repository} from the hub ({type(error).__name__})"
        ) from None


# ---------------------------------------------------------------------------------------------
# Files in and out
# ---------------------------------------------------------------------------------------------


def write_output(rows: list[dict], target: str, spec: TaskSpec, stdout: TextIO | None = None) -> None:
    """JSON Lines on stdout or to a .jsonl file; TSV/CSV with one probability column per label."""
    if target == STDIO:
        (stdout or sys.stdout).write(_render(rows, "jsonl", spec))
        return
    path = Path(target)
    file_format = FORMAT_BY_EXTENSION.get(path.suffix.lower())
    if file_format is None:
        raise UserError(f"--output: {path} must end in .jsonl, .tsv or .csv")
    if not path.parent.is_dir():
        raise UserError(f"--output: no such folder: {path.parent}")
    text = _render(rows, file_format, spec)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _render(rows: list[dict], file_format: str, spec: TaskSpec) -> str:
    if file_format == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    rows, columns = kind_of(spec).output_table(spec, rows)
    buffer = io.StringIO()
    writer = csv.writer(
        buffer, delimiter="\t" if file_format == "tsv" else ",", lineterminator="\n", quoting=csv.QUOTE_MINIMAL
    )
    writer.writerow(columns)
    for row in rows:
        flat = {**row, **{f"probability_{label}": p for label, p in row.get("probabilities", {}).items()}}
        writer.writerow([flat[column] for column in columns])
    return buffer.getvalue()


def run_predict(
    checkpoint: str, source: str = STDIO, target: str = STDIO, batch_size: int = 64, max_length: int | None = None
) -> int:
    """The CLI's work: read, predict, write; returns the number of examples."""
    predictor = load_predictor(checkpoint, batch_size, max_length)
    refused = predictor.json_lines_only
    if refused is not None and target != STDIO and not target.lower().endswith(".jsonl"):
        raise UserError(f"--output: {target}: {refused}")
    rows = predictor.predict_source(source, sys.stdin)  # the kind's reader: its texts, or its own layout
    write_output(rows, target, predictor.spec)
    return len(rows)


def predict(checkpoint: str, texts: Sequence[Any], batch_size: int = 64) -> list[dict]:
    """Predict raw texts with a fine-tuned checkpoint: one dict per text, {"label", "probabilities"} or {"score"}
    (a multiple-choice checkpoint takes question dicts in ARC's layout instead).

    A pair task takes (first, second) pairs. Loads the checkpoint on every call; for many calls keep
    `load_predictor(checkpoint)` and call its `predict`.
    """
    return load_predictor(checkpoint, batch_size).predict(list(texts))
