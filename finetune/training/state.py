"""The training state that `--resume` continues from: one typed record, written and read in one place.

A periodic checkpoint's `training_state/` folder holds:
- accelerate's saved state: model, optimizer, and every process's random number generators (`save_state`);
- `progress.json`: the `TrainingState` fields that are the same on every process (the phase and its step, epoch,
  position in the data, the metrics log's length, the log window, training time, the best evaluation so far), with
  `format` (a checkpoint without `phase`, older ones, is of the run's own training);
- `process_tensors_<rank>.safetensors`: what differs by process, the loop's running loss sums (`loop.sums`) and
  the tensors the model carries from batch to batch under their own names (the LSTM state, Transformer-XL's
  memory; a model's names never hold a dot, so they cannot meet `loop.sums`).

`read_training_state` is the only reader: a checkpoint of the older format (no `format` key, written before
version 2) is migrated there; one of a newer format than this version reads is refused in one line.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from finetune.errors import UserError

PROGRESS_FILE = "progress.json"  # inside training_state/
STATE_FORMAT = 2  # 1: progress.json without "format" and one flat tensor namespace (finetune <= 0.x of 2026-11)
TRAIN_PHASE = "train"  # the run's own training; a phase before it (head_warmup) has its own name and step count
SUMS = "loop.sums"  # the loop's name in a process's tensors file; every other name is a carried tensor
_FORMAT_1_SUMS = "training_loop_sums"


@dataclass
class BestSoFar:
    """The best evaluation so far by one dev metric (higher is better for every GLUE metric), and the patience
    left: what keep-best and early stopping need, carried through a resume."""

    metric: str  # the key in an evaluation's scores, e.g. dev_accuracy
    patience: int | None = None  # evaluations in a row without a new best before the run stops
    step: int | None = None  # step of the best evaluation
    scores: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)  # the newest evaluation's scores
    last_evaluated_step: int | None = None
    evaluations_without_gain: int = 0

    def update(self, scores: dict[str, float], step: int) -> bool:
        """Record an evaluation; True when it is a new best."""
        self.last, self.last_evaluated_step = scores, step
        if self.step is None or scores[self.metric] > self.scores[self.metric]:
            self.step, self.scores, self.evaluations_without_gain = step, scores, 0
            return True
        self.evaluations_without_gain += 1
        return False

    @property
    def patience_exhausted(self) -> bool:
        """True after `patience` evaluations in a row without a new best."""
        return self.patience is not None and self.evaluations_without_gain >= self.patience

    def record(self) -> dict[str, Any]:
        """What a checkpoint keeps (the metric and patience come from the recipe)."""
        return {
            "step": self.step,
            "scores": self.scores,
            "last": self.last,
            "last_evaluated_step": self.last_evaluated_step,
            "evaluations_without_gain": self.evaluations_without_gain,
        }

    def continue_from(self, record: dict[str, Any]) -> None:
        """Continue from `record()` of a stopped run."""
        self.step, self.scores, self.last = record["step"], record["scores"], record["last"]
        self.last_evaluated_step = record["last_evaluated_step"]
        self.evaluations_without_gain = record["evaluations_without_gain"]


@dataclass
class TrainingState:
    """Where a run stands at an optimizer-step boundary: enough to continue it bit for bit.

    The model, optimizer and random states are not fields: accelerate saves and restores them with this record
    (`training.checkpoints.save_training_checkpoint` / `load_training_state`).
    """

    phase: str = TRAIN_PHASE  # the run's own training, or a phase before it (head_warmup) that `step` counts in
    step: int = 0  # optimizer steps taken (of `phase`)
    epoch: int = 0  # the epoch in progress (0-based)
    batches_in_epoch: int = 0  # the position in the data: batches of `epoch` already trained on, per process
    metrics_lines: int = 0  # records in metrics.jsonl at this step (a resumed run cuts what came after)
    window_items: int = 0  # tokens or examples in the open log window (the main process's), for the throughput
    window_seconds: float = 0.0  # training time in the open log window
    training_seconds: float = 0.0  # training time of the run so far (timing.json)
    last_evaluated_step: int | None = None  # a run resumed at an epoch's end owes its evaluation unless equal
    best: dict[str, Any] | None = None  # BestSoFar.record() of a stage that keeps the best evaluation
    first_evaluation: list[float] | None = None  # [step, validation loss] of the first one: divergence is past it
    running_sums: torch.Tensor | None = None  # this process's loss sums: log window's, then epoch's
    carried: dict[str, torch.Tensor] = field(default_factory=dict)  # this process's tensors carried between batches
    # The launch an optimizer step was split by (training/relaunch.py): None in checkpoints saved before it was kept.
    processes: int | None = None
    batch_size: int | None = None  # per process
    accumulation: int | None = None

    def write(self, folder: Path, process_index: int, main_process: bool) -> None:
        """Write this process's tensors, and (main process) progress.json, into a training_state/ folder."""
        tensors = dict(self.carried)
        if self.running_sums is not None:
            tensors[SUMS] = self.running_sums
        if tensors:
            save_file(
                {name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()},
                str(folder / tensors_file(process_index)),
            )
        if main_process:
            progress = dict(_shared_fields(self))
            (folder / PROGRESS_FILE).write_text(json.dumps({"format": STATE_FORMAT, **progress}), encoding="utf-8")


def read_training_state(folder: Path, process_index: int, device: torch.device | str) -> TrainingState:
    """The TrainingState a training_state/ folder holds for this process: the one place a checkpoint's state is
    read, so older formats are migrated (or refused) here alone."""
    folder = Path(folder)
    progress = json.loads((folder / PROGRESS_FILE).read_text(encoding="utf-8"))
    version = progress.pop("format", 1)
    if not isinstance(version, int) or version > STATE_FORMAT:
        raise UserError(
            f"--resume: {folder.parent} was saved by a newer finetune (training state format "
            f"{version}; this version reads up to {STATE_FORMAT}): upgrade finetune to resume it"
        )
    own_file = folder / tensors_file(process_index)
    # Read on the CPU, then moved: safetensors refuses some device names (e.g. "cpu:0" under MULTI_CPU).
    tensors = load_file(str(own_file)) if own_file.is_file() else {}
    tensors = {name: tensor.to(device) for name, tensor in tensors.items()}
    if version == 1:
        progress, tensors = _from_format_1(progress, tensors)
    known = {item.name for item in dataclasses.fields(TrainingState)}
    state = TrainingState(**{name: value for name, value in progress.items() if name in known})
    state.running_sums = tensors.pop(SUMS, None)
    state.carried = tensors
    return state


def read_running_sums(folder: Path, process_index: int) -> torch.Tensor | None:
    """Process `process_index`'s loss sums in a training_state/ folder (None if it saved none): a resume on fewer
    processes counts every saved process's share (training/relaunch.py)."""
    path = Path(folder) / tensors_file(process_index)
    tensors = load_file(str(path)) if path.is_file() else {}
    return tensors.get(SUMS, tensors.get(_FORMAT_1_SUMS))


def _from_format_1(progress: dict[str, Any], tensors: dict[str, torch.Tensor]):
    """Format 1 (no `format` key): the loop's sums under another name, the last evaluated step only in the best
    record, and no training time in the oldest checkpoints."""
    sums = tensors.pop(_FORMAT_1_SUMS, None)
    if sums is not None:
        tensors[SUMS] = sums
    else:  # saved before the window was kept: a resumed run starts a new log window
        progress.pop("window_items", None), progress.pop("window_seconds", None)
    best = progress.get("best")
    if isinstance(best, dict):
        progress.setdefault("last_evaluated_step", best.get("last_evaluated_step"))
    return progress, tensors


def _shared_fields(state: TrainingState) -> dict[str, Any]:
    """The fields that progress.json holds (the same on every process), in declaration order."""
    per_process = {"running_sums", "carried"}
    return {item.name: getattr(state, item.name) for item in dataclasses.fields(state) if item.name not in per_process}


def tensors_file(process_index: int) -> str:
    return f"process_tensors_{process_index}.safetensors"
