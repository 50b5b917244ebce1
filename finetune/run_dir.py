"""The run directory: one folder holding everything a run produces, and nothing else of the user's is ever removed.

Every run directory carries a marker file (.finetune-run) written when the run starts. `overwrite`
replaces only a folder that has it (or, from versions before the marker, the recipe.yaml of a run in that
very folder), and removes only the entries this toolkit writes (the names in OWN_ENTRIES, seed-N folders that are
runs themselves, what is ours in draw-D folders of them): a user's own files inside or beside the folder stay.
While a run writes into its folder it holds the folder's lock (run_lock.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune import run_lock
from finetune._version import __version__
from finetune.errors import UserError
from finetune.recipes import RECIPE_TYPES, recipe_to_yaml, run_dir_location_problem
from finetune.safe_yaml import YAMLProblem, load_yaml
from finetune.tasks.specs import DATA_DIR

RECIPE_FILE = "recipe.yaml"  # the resolved recipe, defaults filled in
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step or evaluation
CHECKPOINT_DIR = "checkpoint"  # the final model, written when the run ends (so it means "finished")
MARKER_FILE = ".finetune-run"  # {"tool": "finetune", "version", "stage"}: this folder is a run of this toolkit
DEV_PREDICTIONS_FILE = "dev_predictions.jsonl"  # the saved checkpoint's prediction of each dev row (runs compare)
# Every entry a stage writes at the top of its run directory (the stages name them too; a test runs every stage and
# checks that nothing it writes is missing here). `overwrite` removes these and nothing else.
OWN_ENTRIES = frozenset(
    {
        MARKER_FILE,
        run_lock.LOCK_FILE,
        RECIPE_FILE,
        METRICS_FILE,
        "timing.json",
        "plots",
        "trackers",
        CHECKPOINT_DIR,
        DATA_DIR,  # the task's rows written before the run starts: the one entry that may be there before ours
        "checkpoints",
        "result.json",
        "dev_split.json",  # task.dev_split's held-out rows (kinds/dev_split.py)
        "labelled_rows.json",  # task.labels_per_class's drawn rows (kinds/labelled_rows.py)
        DEV_PREDICTIONS_FILE,
        "seeds.json",
        "seeds.md",
        "self_training.json",  # a self-training run's rounds (stages/self_training.py)
        "self_training.md",
        "pseudo_labelled.jsonl",  # a self-training round's pseudo-labelled rows (training/self_training.py)
        "report.json",
        "report.md",
        "predictions",
        "submission.zip",
        "lr_find.json",
        "lr_find.md",
        "lr_find.png",
    }
)
# A stage's own temporary names for an entry being replaced (training/checkpoints.py), a multi-seed run's seeds, a
# run of draws' folders (draw-D, holding its seed-N runs; stages/seeds.py) and a self-training run's rounds (round-R,
# each a run; stages/self_training.py).
_OWN_VARIANT = re.compile(r"^(checkpoint|checkpoints)\.(partial|previous|deleting)$")
_SEED_FOLDER = re.compile(r"^seed-\d+$")
_DRAW_FOLDER = re.compile(r"^draw-\d+$")
_ROUND_FOLDER = re.compile(r"^round-(\d+)$")
FINISHED_ENTRIES = ("checkpoint", "result.json", "seeds.json", "report.json")  # written only when a stage has ended

_created: list[Path] = []  # run directories this process created (or emptied) and has not finished yet


def is_run_dir(path: Path) -> bool:
    """True for a folder this toolkit made a run directory: it holds the marker file, or (a run of a version before
    the marker) the saved recipe.yaml of a run whose run_dir is this very folder."""
    path = Path(path)
    if (path / MARKER_FILE).is_file():
        return True
    recipe = path / RECIPE_FILE
    if not recipe.is_file() or recipe.stat().st_size > 1_000_000:
        return False
    try:
        saved = load_yaml(recipe.read_text(encoding="utf-8"))
        return (
            isinstance(saved, dict)
            and saved.get("stage") in RECIPE_TYPES
            and isinstance(saved.get("run_dir"), str)
            and Path(saved["run_dir"]).expanduser().resolve() == path.resolve()
        )
    except (YAMLProblem, UnicodeDecodeError, OSError):
        return False


def is_finished(path: Path) -> bool:
    """True for a run directory whose stage ended (it wrote what only the end of a stage writes)."""
    return any((Path(path) / name).exists() for name in FINISHED_ENTRIES)


def is_own_entry(entry: Path) -> bool:
    """True for an entry of a run directory that this toolkit wrote: only these are ever removed."""
    return (
        entry.name in OWN_ENTRIES
        or bool(_OWN_VARIANT.match(entry.name))
        or (_is_run_folder_name(entry.name) and is_run_dir(entry) and not entry.is_symlink())
        or (bool(_DRAW_FOLDER.match(entry.name)) and entry.is_dir() and not entry.is_symlink())
    )


def _is_run_folder_name(name: str) -> bool:
    """A seed's or a round's folder: a run of its own inside the run directory."""
    return bool(_SEED_FOLDER.match(name) or _ROUND_FOLDER.match(name))


def round_folder(run_dir: Path, number: int) -> Path:
    """The run folder of a self-training run's round `number`."""
    return Path(run_dir) / f"round-{number}"


def round_folders(run_dir: Path) -> list[Path]:
    """A self-training run's round folders, in round order."""
    found = [entry for entry in Path(run_dir).glob("round-*") if _ROUND_FOLDER.match(entry.name) and entry.is_dir()]
    return sorted(found, key=lambda entry: int(entry.name.removeprefix("round-")))


def check_run_dir_free(recipe, latest_checkpoint: Callable[[Path], Path | None] | None = None) -> None:
    """Refuse a run_dir that is in use, holds a run (without `overwrite`) or holds files of the user's.

    `latest_checkpoint(run_dir)`: the stage's newest resumable checkpoint, to say whether `--resume` would help.
    Called on every process before any input is read, and again by the main process once it holds the lock.
    """
    path = Path(recipe.run_dir)
    location = run_dir_location_problem(path)
    if location is not None:
        raise UserError(f"run_dir: {location}")
    if not path.exists():
        return
    if not path.is_dir():
        raise UserError(f"run_dir {path} is a file, not a folder")
    run_lock.check_not_locked(path)
    entries = [entry for entry in path.iterdir() if entry.name not in (run_lock.LOCK_FILE, DATA_DIR)]
    if not entries:
        return
    if not is_run_dir(path):
        shown = ", ".join(sorted(entry.name for entry in entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(
            f"run_dir {path} holds files that finetune did not write ({shown}); overwrite only ever "
            "replaces a finetune run: choose a new or empty folder"
        )
    if recipe.overwrite:
        return
    if is_finished(path):
        raise UserError(
            f"run_dir {path} already holds a finished run; set overwrite=true to replace it (this "
            "deletes that run's files only) or choose another run_dir"
        )
    checkpoint = latest_checkpoint(path) if latest_checkpoint is not None else None
    if checkpoint is not None:
        raise UserError(
            f"run_dir {path} holds a stopped run that --resume continues (from "
            f"{checkpoint.relative_to(path)}); or set overwrite=true to start it again"
        )
    raise UserError(
        f"run_dir {path} holds a run that stopped before saving a checkpoint to resume from: set "
        "overwrite=true to start it again (or choose another run_dir)"
    )


def prepare_run_dir(recipe, is_main_process: bool = True) -> Path:
    """Create and lock the run directory (removing an earlier run's files when `overwrite`), save the recipe.

    Stages call it once their inputs have been read, so a bad input leaves no folder behind.
    """
    path = Path(recipe.run_dir)
    if not is_main_process:
        return path
    existed = path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"run_dir {path}: cannot create it ({error.strerror})") from None
    run_lock.acquire(path)
    try:
        check_run_dir_free(recipe)  # again: another run may have written here since the first check
    except UserError:
        run_lock.release(path)
        if not existed:
            _remove_if_empty(path)
        raise
    remove_own_entries(path, keep=DATA_DIR if reads_its_data(recipe) else None)
    marker = {"tool": "finetune", "version": __version__, "stage": recipe.stage}
    (path / MARKER_FILE).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    (path / RECIPE_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")
    _created.append(path)
    return path


def claim_run_dir(recipe, is_main_process: bool = True) -> Path:
    """For `--resume`: lock the stopped run's directory (already checked by `check_same_recipe`)."""
    path = Path(recipe.run_dir)
    if is_main_process:
        run_lock.acquire(path)
    return path


def reads_its_data(recipe) -> bool:
    """Whether the recipe's task reads the rows written into its run directory (RUN_DIR/data) for it."""
    data_dir = getattr(getattr(recipe, "task", None), "data_dir", None)
    return data_dir is not None and Path(data_dir).resolve() == (Path(recipe.run_dir) / DATA_DIR).resolve()


def remove_own_entries(path: Path, keep: str | None = None) -> None:
    """Delete what this toolkit wrote in a run directory (seed-N runs recursively), keep everything else (and the
    entry named `keep`: the task's rows just written for the run starting there)."""
    for entry in Path(path).iterdir():
        if entry.name in (run_lock.LOCK_FILE, keep) or not is_own_entry(entry):
            continue
        if any(folder.match(entry.name) for folder in (_SEED_FOLDER, _DRAW_FOLDER, _ROUND_FOLDER)):  # only ours inside
            remove_own_entries(entry)
            _remove_if_empty(entry)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()  # a file, or a link: never what it points to


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: it holds the user's files
        path.rmdir()


def guarded_stage(stage_function: Callable) -> Callable:
    """Decorate a stage's entry point: the run directories it locks are unlocked when it returns or fails, and
    those it created are emptied of its files again when it fails on a user mistake (nothing half-made is left
    looking like a run). An InputError is a UserError: bad data found below the stage cleans up the same."""

    @functools.wraps(stage_function)
    def run(*arguments, **keywords):
        held_before, created_before = set(run_lock.held_locks()), len(_created)
        try:
            return stage_function(*arguments, **keywords)
        except UserError:
            for path in _created[created_before:]:
                if path.is_dir():
                    remove_own_entries(path)
                    _remove_if_empty(path)
            raise
        finally:
            del _created[created_before:]
            for path in set(run_lock.held_locks()) - held_before:
                run_lock.release(path)
                _remove_if_empty(path)  # a folder locked but never written: nothing to keep

    return run


def check_resumable(recipe, latest_checkpoint) -> Path:
    """The checkpoint a `--resume` run continues from; the recipe must be the one the run started with."""
    path = check_same_recipe(recipe)
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        if is_finished(path):
            raise UserError(
                f"--resume: {path} holds a finished run: nothing to resume (overwrite=true starts it again)"
            )
        if recipe.checkpoint_every is None:
            reason = "its recipe saves no periodic checkpoints (set checkpoint_every to make runs resumable)"
        else:
            reason = f"it stopped before its first periodic checkpoint (checkpoint_every: {recipe.checkpoint_every})"
        raise UserError(f"--resume: {path} cannot be resumed: {reason}; start it again with overwrite=true")
    return checkpoint


# Keys a resume may change: they split the same optimizer step over another launch (a run saved on 2 processes
# resumed on 1 doubles batch_size); training/relaunch.py refuses a change of the step's examples.
LAUNCH_KEYS = ("training.batch_size", "training.gradient_accumulation_steps")


def check_same_recipe(recipe) -> Path:
    """For `--resume`: the run directory, once its saved recipe equals `recipe` (else an error naming the keys)."""
    from finetune.recipes import load_recipe  # late import: recipes imports nothing from here

    path = Path(recipe.run_dir)
    if not (path / RECIPE_FILE).is_file():
        raise UserError(f"--resume: run_dir {path} holds no run to resume (no {RECIPE_FILE})")
    run_lock.check_not_locked(path)
    started = flatten_keys(load_recipe(path / RECIPE_FILE, check_paths=False).model_dump(mode="json"))
    given = flatten_keys(recipe.model_dump(mode="json"))
    free = {"overwrite", *LAUNCH_KEYS}
    keys = given.keys() | started.keys()
    changed = sorted(key for key in keys if key not in free and given.get(key) != started.get(key))
    if changed:
        raise UserError(f"--resume: the recipe differs from the one {path} was started with in: {', '.join(changed)}")
    return path


def flatten_keys(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested recipe dump as dotted keys: {"training.lr": 0.001, ...}."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class MetricsLog:
    """Appends JSON lines to metrics.jsonl; silent on every process but the main one."""

    def __init__(self, path: Path, enabled: bool = True, forward_to: Callable[[dict[str, Any]], None] | None = None):
        self.path, self.enabled = path, enabled
        self.forward_to = forward_to  # also given every record: the experiment trackers (reporting/trackers.py)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            if self.forward_to is not None:
                self.forward_to(record)

    def line_count(self) -> int:
        """Records written so far (0 before the first)."""
        if not self.path.is_file():
            return 0
        with open(self.path, encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())

    def truncate(self, lines: int) -> None:
        """Keep the first `lines` records: a resumed run drops what was logged after its checkpoint."""
        if self.enabled and self.path.is_file():
            with open(self.path, encoding="utf-8") as handle:
                kept = [line for line in handle if line.strip()][:lines]
            self.path.write_text("".join(kept), encoding="utf-8")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file; a line that is not one JSON object is a UserError naming it."""
    return [record for _, record in read_numbered_metrics(path)[0]]


def read_numbered_metrics(
    path: Path, partial_end_ok: bool = False
) -> tuple[list[tuple[int, dict[str, Any]]], int | None]:
    """(line number, record) for every record of a metrics.jsonl file, and the number of a last line left out (None
    if none): with `partial_end_ok`, a last line without its line break that is not JSON yet is a record a running job
    is writing, not a mistake. Any other line that is not one JSON object is a UserError naming it."""
    records: list[tuple[int, dict[str, Any]]] = []
    with open(path, "rb") as handle:  # bytes: a line that is not UTF-8 is named too
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
                if not text.strip():
                    continue
                record = json.loads(text)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                if partial_end_ok and not raw.endswith(b"\n"):  # only the last line can lack one
                    return records, number
                if isinstance(error, UnicodeDecodeError):
                    raise UserError(f"{path} line {number}: not valid UTF-8") from None
                raise UserError(f"{path} line {number}: not JSON ({error.msg})") from None
            if not isinstance(record, dict):  # [1, 2] or 3 would fail later, in a plot, as a traceback
                raise UserError(f"{path} line {number}: expected a JSON object, found {type(record).__name__}")
            records.append((number, record))
    return records, None
