"""`--resume` on another launch: a run saved on N processes continued on M (or with another split of its optimizer
step between batch size and gradient accumulation).

What makes a resume exact is the optimizer step, not the process count: every step of a run reads the next
batch_size x processes x accumulation examples of one order (the processes take turns at its batches), and the
loop averages gradients over the step's examples whatever their split. So a run resumes on another process count
when its global batch is the same (`training.batch_size` per process set to keep it); the data position is carried
as examples read, the optimizer, scheduler and model states are whole on every process, and the loss sums of the
open log window are merged, so each optimizer step holds the examples it would have held. What cannot carry is
said before the run goes on: the random draws (dropout) of N generators do not continue as M, and a state a model
carries between batches (an LSTM's) is split by process, so it starts empty, as at an epoch's start.

A checkpoint saved before the launch was recorded (no `processes` in progress.json) resumes as before, as if
launched the same way; a different global batch is refused in one line, the checkpoint untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.errors import UserError
from finetune.recipes.loader import read_yaml
from finetune.training.checkpoints import HYPERPARAMETERS_FILE, TRAINING_STATE_DIR
from finetune.training.state import TrainingState, read_running_sums


@dataclass(frozen=True)
class Launch:
    """How an optimizer step is split: processes x batch_size (per process) x accumulation examples."""

    processes: int
    batch_size: int
    accumulation: int

    @property
    def global_batch(self) -> int:
        return self.processes * self.batch_size * self.accumulation

    @property
    def per_batch(self) -> int:  # the examples one batch of every process reads together
        return self.processes * self.batch_size

    def describe(self) -> str:
        accumulation = f" x {self.accumulation} accumulated" if self.accumulation > 1 else ""
        processes = "process" if self.processes == 1 else "processes"
        return f"{self.processes} {processes} x batch {self.batch_size}{accumulation}"

    @classmethod
    def current(cls, accelerator, training) -> Launch:
        return cls(accelerator.num_processes, training.batch_size, training.gradient_accumulation_steps)

    @classmethod
    def saved(cls, state: TrainingState) -> Launch | None:
        """The launch a checkpoint's state was saved under, or None for one saved before it was recorded."""
        if state.processes is None or state.batch_size is None or state.accumulation is None:
            return None
        return cls(state.processes, state.batch_size, state.accumulation)


@dataclass(frozen=True)
class Relaunch:
    """A resume whose launch differs from the saved one, with the same global batch."""

    checkpoint: Path
    saved: Launch
    now: Launch

    def adapt(self, state: TrainingState, batches_per_epoch: int, process_index: int) -> TrainingState:
        """This process's state in the new launch: the data position as the same examples read, the open window's
        loss sums all on the main process (they are summed over the processes when logged), no carried state."""
        examples = state.batches_in_epoch * self.saved.per_batch
        state.batches_in_epoch = min(batches_per_epoch, math.ceil(examples / self.now.per_batch))
        if self.saved.processes != self.now.processes:
            state.running_sums = self._merged_sums(state.running_sums) if process_index == 0 else None
        state.carried = {}
        return state

    def _merged_sums(self, own: torch.Tensor | None) -> torch.Tensor | None:
        folder = Path(self.checkpoint) / TRAINING_STATE_DIR
        shares = [read_running_sums(folder, index) for index in range(self.saved.processes)]
        found = [sums for sums in shares if sums is not None]
        if not found:
            return own
        return torch.stack(found).sum(dim=0).to(own.device if own is not None else "cpu")

    def note(self, carries_state: bool) -> str:
        """What the resume keeps and what it cannot, said once before it goes on."""
        first = f"resuming a run saved on {self.saved.describe()} on {self.now.describe()}"
        lines = [f"{first}: each optimizer step holds the same {self.now.global_batch} examples as it would have"]
        if self.saved.processes != self.now.processes:
            lines.append(
                f"random draws (dropout) came from {self.saved.processes} generator(s) and now from "
                f"{self.now.processes}: they do not continue the saved run's"
            )
        if carries_state:
            lines.append("the state the model carries between batches (its rows follow the launch) starts empty")
        return "; ".join(lines)


def check_relaunch(accelerator, checkpoint: Path, state: TrainingState, training) -> Relaunch | None:
    """The Relaunch for resuming `checkpoint` under this launch, None when the launch is the saved one (or was not
    recorded); a different global batch is refused in one line naming what to set. `state`: the checkpoint's."""
    saved, now = Launch.saved(state), Launch.current(accelerator, training)
    if saved is None:
        _check_unrecorded_launch(checkpoint, training)
        return None
    if saved == now:
        return None
    if saved.global_batch != now.global_batch:
        per_process, remainder = divmod(saved.global_batch, now.processes * now.accumulation)
        advice = (
            f"set training.batch_size={per_process} to resume on {now.processes} process(es)"
            if not remainder and per_process
            else f"{now.processes} process(es) x accumulation {now.accumulation} do not divide it: launch "
            f"{saved.processes} process(es), or change training.gradient_accumulation_steps"
        )
        raise UserError(
            f"--resume: {checkpoint} was saved with optimizer steps of {saved.global_batch} examples "
            f"({saved.describe()}), this launch makes them {now.global_batch} ({now.describe()}): {advice}"
        )
    return Relaunch(Path(checkpoint), saved, now)


def _check_unrecorded_launch(checkpoint: Path, training) -> None:
    """A checkpoint saved before launches were recorded resumes only with the batch keys it was saved with (the
    recipe beside its weights has them): its process count is unknown, so no other split can be checked."""
    path = Path(checkpoint) / HYPERPARAMETERS_FILE
    saved = (read_yaml(path).get("training") or {}) if path.is_file() else {}
    keys = {"batch_size": training.batch_size, "gradient_accumulation_steps": training.gradient_accumulation_steps}
    changed = [f"training.{key}={saved[key]}" for key, value in keys.items() if key in saved and saved[key] != value]
    if changed:
        raise UserError(
            f"--resume: {checkpoint} was saved by a finetune that did not record how its steps were split over the "
            f"processes: resume it with the launch and batch it was saved with ({', '.join(changed)})"
        )
