"""The run driver: the life cycle every training stage shares, written once.

A stage (`finetune pretrain`, `finetune finetune`) hands the driver a `TrainingJob`: what is its own, in the shape
of torchtune's recipes. `setup()` builds the model, optimizer, data and loss; `evaluate()` scores; `finish()` saves
the result; and as a subscriber to the run's events (training/events.py) it positions the data at each epoch
(on_epoch_begin), saves a new best's weights (on_new_best) and reports each epoch (on_epoch_end). What else reacts
to the run subscribes too (`subscribers`: divergence, keep-best, early stopping, the job's own such as gradual
unfreezing, the search pruner, the trackers, the timing and plots). The driver owns the rest, in order: the run
folder (checked, then created or locked once every input is read), the barriers between processes, the metrics
log, `--resume` (sweep the leftovers of a killed save, restore the TrainingState), Ctrl-C and out-of-memory
handling, the evaluation cadence and periodic checkpoints. So the bit-exact resume guarantee lives in one place,
for a phase before the training too (`WarmupPhase`: pretrain's head_warmup, whose checkpoints a resumed run
continues inside it).
"""

from __future__ import annotations

import atexit
import functools
import gc
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from finetune.console import console
from finetune.errors import UserError
from finetune.reporting.finish import finish_run
from finetune.reporting.trackers import start_trackers
from finetune.run_dir import (
    METRICS_FILE,
    MetricsLog,
    check_resumable,
    check_run_dir_free,
    check_same_recipe,
    claim_run_dir,
    prepare_run_dir,
)
from finetune.training.checkpoints import (
    latest_sound_checkpoint,
    latest_training_checkpoint,
    load_training_state,
    read_checkpoint_state,
    save_training_checkpoint,
    step_checkpoint_dir,
    sweep_incomplete_checkpoints,
)
from finetune.training.divergence import DivergenceWatch
from finetune.training.events import Events, TrainingEvents
from finetune.training.keep_best import EarlyStopping, KeepBest
from finetune.training.listeners import ReportedEvaluations
from finetune.training.loop import LossFunction, TrainingLoop, compile_model, total_optimizer_steps
from finetune.training.optim import LearningRates
from finetune.training.relaunch import check_relaunch
from finetune.training.state import TRAIN_PHASE, BestSoFar, TrainingState


@dataclass
class WarmupPhase:
    """A short phase before a stage's own training (head_warmup): only `trains` learn, every other parameter frozen
    (requires_grad off, so no backward runs below them), with an optimizer and LR schedule of their own, for `steps`
    optimizer steps over the training batches from the start; then the stage's training runs from step 0 on every
    parameter it trains, with its own optimizer and schedule, as without the phase. Its metrics.jsonl records, its
    progress bar and its periodic checkpoints (PHASE-step-N, older than any step-N) carry its name."""

    name: str
    steps: int
    trains: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer  # over `trains` alone; the driver prepares it when the phase runs
    schedule: Callable[[int], float]  # the phase's LR multiplier at a step of it


@dataclass
class TrainingSetup:
    """What a stage's `setup` hands the driver: the prepared model, optimizer and training batches, and how to
    take a batch's loss."""

    model: torch.nn.Module  # prepared by accelerate; `compute_loss` runs it
    optimizer: torch.optim.Optimizer  # prepared by accelerate
    train_loader: Any  # micro-batches, `gradient_accumulation_steps` of them per optimizer step
    compute_loss: LossFunction
    throughput_unit: str  # tokens or examples, for the logged throughput
    tokenizer: Any  # saved with every checkpoint
    saved_model: Callable[[], torch.nn.Module]  # the Hugging Face model a checkpoint holds
    epochs: int | None = None  # the stage's planned epochs where the recipe leaves training.epochs open
    warmup: WarmupPhase | None = None  # a phase before the training (head_warmup)


@dataclass
class RunContext:
    """What the driver has made by the time the stage starts training: where, the log, and the step budget."""

    accelerator: Accelerator
    run_dir: Path
    log: MetricsLog
    total_steps: int
    resumed: bool


class TrainingJob(TrainingEvents, ABC):
    """What a training stage hands the driver (see the module docstring); a subscriber to its run's events."""

    result_file: str | None = None  # a run folder holding it is finished: --resume then has nothing to do

    def __init__(self, recipe):
        self.recipe = recipe

    def check(self) -> None:
        """Refuse what cannot work before anything is built (after the run folder's checks)."""

    @abstractmethod
    def create_accelerator(self) -> Accelerator:
        """The stage's accelerator (`training.loop.make_accelerator` with what the stage needs of it)."""

    @abstractmethod
    def setup(self, accelerator: Accelerator, resume_from: Path | None) -> TrainingSetup:
        """Read every input and build the model, optimizer and data; nothing is written yet."""

    def start(self, context: RunContext) -> None:
        """The run folder exists and the loop is built: log what comes before training (not when resumed)."""

    def best_so_far(self) -> BestSoFar | None:
        """The record that keep-best and early stopping follow, or None when the stage keeps no best."""
        return None

    def subscribers(self) -> list[TrainingEvents]:
        """The job's own subscribers to the run's events besides itself (gradual unfreezing), after keep-best."""
        return []

    def attachments(self, run_dir: Path) -> dict[str, Path]:
        """Folders that travel with every periodic checkpoint (e.g. the best evaluation's weights)."""
        return {}

    def carried_tensors(self) -> dict[str, torch.Tensor]:
        """This process's tensors the model carries from batch to batch (see TrainingState.carried)."""
        return {}

    def restore_carried(self, tensors: dict[str, torch.Tensor]) -> None:
        """Put back what `carried_tensors` saved."""

    def on_save(self, loop, control, state: TrainingState) -> None:
        state.carried = self.carried_tensors()

    def on_restore(self, loop, control, state: TrainingState) -> None:
        self.restore_carried(state.carried)

    @abstractmethod
    def on_epoch_begin(self, loop, control, epoch: int, batches_done: int) -> None:
        """Position the data at `batches_done` batches into `epoch` (also in a phase before the training)."""

    @abstractmethod
    def evaluate(self) -> tuple[dict[str, float], dict[str, Any]]:
        """(scores that the best-so-far record compares, further fields for metrics.jsonl only)."""

    @abstractmethod
    def finish(self, context: RunContext, step: int) -> Path:
        """Save the result after training (every process calls it); returns the checkpoint folder."""

    def finished_result(self, run_dir: Path) -> Path:
        """What a finished run returns when --resume finds nothing to do."""
        return run_dir


def processes_ready(accelerator: Accelerator) -> Accelerator:
    """Call once every process has checked the run folder: from here on one copy of every message is printed (the
    main process's), and no process goes on to create the folder before all have checked it (a later run in the
    same process, e.g. the next command or seed, meets no rendezvous that would order them otherwise)."""
    console.quiet = not accelerator.is_main_process
    if accelerator.num_processes > 1:
        _leave_process_group_at_exit()
    accelerator.wait_for_everyone()
    return accelerator


@functools.cache  # once per process, however many stages it runs
def _leave_process_group_at_exit() -> None:
    atexit.register(leave_process_group)


def leave_process_group() -> None:
    """Destroy the process group while Python is still whole (at exit, before it shuts down).

    A gloo worker thread frees the tensors of the collective it ran after the waiting process has moved on, and
    freeing a tensor that Python let go of takes the GIL: once Python has begun to shut down, the thread is ended
    there, inside a C++ destructor, and the process aborts ("terminate called without an active exception", exit
    code -6, after every output was written). Destroyed here, the group's destructor joins its threads with the
    GIL released. torch.distributed.nn.functional, imported by DDP once the group exists, holds the group in
    its functions' defaults (group=group.WORLD, read at import), which would keep it and its threads alive:
    those defaults become None, what they are when it is imported first (the default group).
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    group = torch.distributed.group.WORLD
    torch.distributed.destroy_process_group()
    functional = sys.modules.get("torch.distributed.nn.functional")
    for function in vars(functional).values() if functional else ():
        defaults = getattr(function, "__defaults__", None) or ()
        if any(value is group for value in defaults):
            function.__defaults__ = tuple(None if value is group else value for value in defaults)
    del group
    gc.collect()  # the DDP wrappers of the finished stages, if a reference cycle still holds one


def run_training(job: TrainingJob, resume: bool = False) -> Path:
    """Run a stage's job from the start, or (`resume`) from its run folder's newest periodic checkpoint."""
    return RunDriver(job).run(resume)


class RunReport(TrainingEvents):
    """The run's last subscriber: at the end, its timing.json and plots (reporting/finish.py), its trackers closed."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def on_train_end(self, loop, control) -> None:
        finish_run(loop.accelerator, self.run_dir, loop)


class Trackers(TrainingEvents):
    """Every metrics.jsonl record also goes to the experiment trackers of training.log_with (reporting/trackers.py)."""

    def __init__(self, send: Callable[[dict[str, Any]], None]):
        self.send = send

    def on_log(self, loop, control, record) -> None:
        self.send(record)


class RunDriver:
    """One run of one job (see the module docstring)."""

    def __init__(self, job: TrainingJob):
        self.job, self.recipe = job, job.recipe
        self.last_evaluated_step: int | None = None
        self.last_record: dict[str, Any] = {}

    def run(self, resume: bool) -> Path:
        job, recipe = self.job, self.recipe
        # Everything that can fail on user input is read before the run folder is created (or, resuming, locked).
        if resume and job.result_file and (check_same_recipe(recipe) / job.result_file).is_file():
            console.print(f"{recipe.run_dir} finished before: nothing to resume")
            return job.finished_result(Path(recipe.run_dir))
        # the newest checkpoint whose files are whole: a broken newer one is skipped in one line
        resume_from = check_resumable(recipe, latest_sound_checkpoint) if resume else None
        if not resume:
            check_run_dir_free(recipe, latest_training_checkpoint)
        job.check()
        self.accelerator = accelerator = processes_ready(job.create_accelerator())
        # resumed on another launch (process count, batch split): the same global batch, or one line
        state = read_checkpoint_state(accelerator, resume_from) if resume_from is not None else TrainingState()
        relaunch = check_relaunch(accelerator, resume_from, state, recipe.training) if resume_from else None
        set_seed(recipe.seed)
        self.setup = setup = job.setup(accelerator, resume_from)
        compile_model(accelerator, setup.model, recipe.training)
        main = accelerator.is_main_process
        run_dir = claim_run_dir(recipe, main) if resume_from else prepare_run_dir(recipe, main)
        self.events = Events(self.subscribers(run_dir))
        log = MetricsLog(run_dir / METRICS_FILE, main, forward_to=self._logged)
        total_steps = total_optimizer_steps(len(setup.train_loader), recipe.training, setup.epochs)
        self.context = RunContext(accelerator, run_dir, log, total_steps, resumed=resume_from is not None)
        rates = LearningRates.scheduled(setup.optimizer, recipe.schedule, total_steps)
        self.loop = self._new_loop(rates, total_steps, events=self.events)
        job.start(self.context)
        if relaunch is not None:
            console.print(relaunch.note(carries_state=bool(state.carried)), soft_wrap=True)
            state = relaunch.adapt(state, len(setup.train_loader), accelerator.process_index)
        # The phase before training runs in a new run, and in one resumed from a checkpoint taken during it.
        warmup = self._warmup_loop() if setup.warmup and (not resume_from or state.phase != TRAIN_PHASE) else None
        if resume_from is not None:
            self._restore(resume_from, state, warmup)
        else:
            self.events.fire("on_train_begin", self.loop)
        with self.loop.watching():  # Ctrl-C: checkpoint and stop; out of memory: advice
            if warmup is not None:
                self._warm_up(warmup, state)
                state = TrainingState()  # the training starts at its step 0, at the start of the data
            self._train(state.epoch, state.batches_in_epoch)
        # lr-find's range test trains at every LR in turn: no model worth saving, and no "saved to" line.
        keeps_model = recipe.schedule.kind != "range_test"
        checkpoint = job.finish(self.context, self.loop.step) if keeps_model else run_dir
        self.events.fire("on_train_end", self.loop)  # trackers closed, timing.json, RUN_DIR/plots/*.png
        return checkpoint

    def subscribers(self, run_dir: Path) -> list[TrainingEvents]:
        """Who hears the run's events, in the order they hear them: the divergence watch first (a diverged model is
        never kept), keep-best and early stopping where the job keeps a best, the job's own (gradual unfreezing),
        the job itself, the search pruner's listeners, the trackers, and the timing and plots last."""
        job, best = self.job, self.job.best_so_far()
        kept: list[TrainingEvents] = [KeepBest(best), EarlyStopping(best)] if best is not None else []
        send = start_trackers(self.accelerator, self.recipe, run_dir)
        trackers: list[TrainingEvents] = [Trackers(send)] if send is not None else []
        return [
            DivergenceWatch(self.recipe.training),
            *kept,
            *job.subscribers(),
            job,
            ReportedEvaluations(),
            *trackers,
            RunReport(run_dir),
        ]

    def _logged(self, record: dict[str, Any]) -> None:
        """MetricsLog's forward: every record written (by the main process) fires on_log."""
        self.events.fire("on_log", getattr(self, "loop", None), record)

    def _new_loop(self, rates: LearningRates, steps: int, **options) -> TrainingLoop:
        """A training loop of `steps` steps over the job's model (the run's own, or a phase's: `options`)."""
        recipe, setup = self.recipe, self.setup
        return TrainingLoop(
            self.accelerator,
            setup.model,
            rates,
            steps,
            recipe.training,
            self.context.log,
            setup.throughput_unit,
            recipe.checkpoint_every,
            self._save_state,
            **options,
        )

    def _warmup_loop(self) -> TrainingLoop:
        """The loop of the job's WarmupPhase, its optimizer prepared after the training's (a checkpoint saves both,
        in that order; a run resumed after the phase prepares, and restores, the training's alone). The job alone
        hears its events: it positions the data; nothing of the training's (unfreezing, keep-best) runs in it."""
        phase = self.setup.warmup
        assert phase is not None  # called only for a job that has one
        rates = LearningRates(self.accelerator.prepare(phase.optimizer), phase.schedule)
        return self._new_loop(rates, phase.steps, phase=phase.name, events=Events([self.job]))

    def _warm_up(self, loop: TrainingLoop, state: TrainingState) -> None:
        """The WarmupPhase's steps from where `state` stands, every parameter but the phase's frozen; then whatever
        trained before trains again, and the training's first batch starts from no carried state (an LSTM's), as
        it would without the phase. Its time counts in the run's training time."""
        setup = self.setup
        assert setup.warmup is not None  # `loop` is its loop
        trains = {id(parameter) for parameter in setup.warmup.trains}
        frozen = [p for p in setup.model.parameters() if p.requires_grad and id(p) not in trains]
        for parameter in frozen:
            parameter.requires_grad_(False)
        epoch, batches_done = state.epoch, state.batches_in_epoch
        try:
            with loop.watching():
                while not loop.finished:
                    loop.events.fire("on_epoch_begin", loop, epoch, batches_done)
                    loop.train_epoch(setup.train_loader, epoch, setup.compute_loss, batches_done=batches_done)
                    epoch, batches_done = epoch + 1, 0
        finally:
            for parameter in frozen:
                parameter.requires_grad_(True)
        self.job.restore_carried({})
        self.loop.started = loop.started

    def _train(self, epoch: int, batches_done: int) -> None:
        """Epochs until the step budget is spent (training.max_steps may ask for more than training.epochs) or
        a subscriber stops the run (early stopping), each ending with an evaluation. A run resumed from a checkpoint
        at an epoch's last step (batches_done > 0) still owes that epoch's evaluation, unless the checkpoint came
        after it."""
        loop, setup, events = self.loop, self.setup, self.events
        while not loop.finished or batches_done:
            events.fire("on_epoch_begin", loop, epoch, batches_done)
            if not loop.finished:
                loop.train_epoch(
                    setup.train_loader, epoch, setup.compute_loss, self._evaluate, self.recipe.eval_every, batches_done
                )
            if loop.step != self.last_evaluated_step:  # the epoch did not end on a periodic evaluation
                loop.log_evaluation(self._evaluate(), epoch)
            events.fire("on_epoch_end", loop, epoch, self.last_record)
            epoch, batches_done = epoch + 1, 0

    def _evaluate(self) -> dict[str, Any]:
        """Score the model; the subscribers hear it (on_evaluate: divergence, keep-best, early stopping) before the
        loop writes it."""
        scores, extra = self.job.evaluate()
        self.last_evaluated_step = self.loop.step
        record = {**scores, **extra}
        self.events.evaluated(self.loop, scores, record)
        self.last_record = record
        return record

    def _save_state(self, state: TrainingState) -> Path:
        """A periodic checkpoint: the loop's state (`state`) with the driver's and the subscribers' added."""
        state.last_evaluated_step = self.last_evaluated_step
        self.events.fire("on_save", self.loop, state)
        run_dir = self.context.run_dir
        return save_training_checkpoint(
            self.accelerator,
            self.setup.saved_model(),
            self.setup.tokenizer,
            step_checkpoint_dir(run_dir, state.step, state.phase),
            self.recipe,
            state,
            self.recipe.keep_checkpoints,
            self.job.attachments(run_dir),
        )

    def _restore(self, checkpoint: Path, state: TrainingState, warmup: TrainingLoop | None) -> None:
        """Continue from `checkpoint`, whose TrainingState is `state`: what a killed save left is swept, then every
        part of the state restored, into the training's loop or (a checkpoint taken during it) the phase's, and the
        subscribers' shares (on_restore)."""
        run_dir = self.context.run_dir
        if state.phase != TRAIN_PHASE and warmup is None:  # the phase is decided from the inputs alone: they changed
            raise UserError(
                f"--resume: {checkpoint} was saved during {state.phase}, which this run does not do (its inputs, "
                "e.g. the model.checkpoint folder, changed): start it again with overwrite=true"
            )
        if self.accelerator.is_main_process:
            sweep_incomplete_checkpoints(run_dir)  # what a kill during a save or a pruning left behind
        load_training_state(self.accelerator, checkpoint, self.job.attachments(run_dir))
        loop = warmup if warmup is not None else self.loop  # a resumed run has the phase's loop only to continue it
        loop.restore(state, checkpoint)
        self.events.fire("on_restore", loop, state)
        self.last_evaluated_step = state.last_evaluated_step
        phase = "" if loop is self.loop else f"{state.phase} "
        console.print(f"resuming from {checkpoint} ({phase}step {loop.step}, epoch {state.epoch + 1})")
