"""The one training loop, on accelerate, shared by pretrain and finetune.

The run driver (training/driver.py) builds it and calls `train_epoch` once per epoch inside `with loop.watching():`;
the loop fires the run's per-step events (training/events.py: on_step_begin before each optimizer step, so step-wise
unfreezing never falls inside an accumulation cycle; on_evaluation_written after each evaluation is logged) and stops
when a subscriber asks it to (`Control.should_stop`: early stopping); a phase before the training (head_warmup) is a
loop of its own, named by `phase`. A training step reads in this one file: `_optimizer_step` takes its micro-batches,
one backward each, averages the gradient over the step's loss terms, clips it, sets the step's learning rates
(`LearningRates.apply`, training/optim.py) and applies them. The loop also owns what can go wrong while training:
a non-finite loss stops the run before anything poisoned is saved, Ctrl-C saves a resumable checkpoint at a step
boundary, and running out of GPU memory becomes one line of advice.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs

from finetune.console import console, progress_bar
from finetune.errors import RunFailed, RunInterrupted, UserError
from finetune.reporting.trackers import check_trackers_installed
from finetune.run_dir import MetricsLog
from finetune.training.divergence import diverged
from finetune.training.engines import check_distributed_engine, is_lost_process, lost_process_message
from finetune.training.events import Events
from finetune.training.optim import LearningRates
from finetune.training.state import TRAIN_PHASE, TrainingState

# compute_loss(model, batch) -> (mean loss of the batch, the number of terms it is the mean of, items for the
# throughput: tokens or examples). Terms are examples for a classifier, labelled tokens for a language model.
LossFunction = Callable[[torch.nn.Module, dict[str, torch.Tensor]], tuple[torch.Tensor, Any, int]]


def device_and_precision(training_config) -> tuple[bool, str]:
    """(on the CPU, accelerate's mixed precision) for a recipe's training section: `auto` is bf16 on GPUs that
    support it and off elsewhere."""
    on_cpu = training_config.device == "cpu" or not torch.cuda.is_available()
    precision = training_config.mixed_precision
    if precision == "auto":
        # bf16 matmuls on CPUs without AMX run hundreds of times slower than fp32.
        precision = "bf16" if not on_cpu and torch.cuda.is_bf16_supported() else "no"
    if precision == "fp16" and on_cpu:
        # accelerate would train in fp32 without a word: it makes fp16's autocast and gradient scaler on GPUs only.
        raise UserError("training.mixed_precision: fp16 needs a GPU (and its gradient scaler); on a CPU use bf16 or no")
    return on_cpu, precision


def compile_model(accelerator: Accelerator, model: torch.nn.Module, training_config) -> None:
    """`training.compile`: torch.compile the prepared model's own module in place (`nn.Module.compile`), so that
    its parameter names, checkpoints and training state are those of the uncompiled model, and DDP, if any, wraps
    the compiled module. Compilation itself happens on the first forward passes."""
    if not training_config.compile:
        return
    accelerator.unwrap_model(model, keep_torch_compile=False).compile()
    console.print("training.compile: the model compiles on its first steps (their time is in the first log window)")


def _forget_other_precision(precision: str) -> None:
    """One process may run stages of different precisions (`finetune ulmfit`'s three, or tests). accelerate keeps
    one AcceleratorState per process and refuses a second precision, so that state is reset when the precision
    changes; the process group (its PartialState) is kept."""
    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision", precision) != precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def make_accelerator(
    training_config, parameters_change_trainability: bool = False, run_dir: Path | None = None
) -> Accelerator:
    """An Accelerator for the recipe: mixed precision only where the hardware does it well. Gradient accumulation is
    the loop's own (`TrainingLoop._optimizer_step`), so accelerate is not told of it.

    `parameters_change_trainability`: gradual unfreezing freezes parameters after DDP has wrapped
    the model, so DDP must be told that some parameters may receive no gradient. `run_dir`: where
    the trackers of `training.log_with` write (they start in `reporting.trackers.start_trackers`).
    """
    on_cpu, precision = device_and_precision(training_config)
    if precision != "no" and on_cpu:
        warnings.warn(f"mixed_precision={precision} on a CPU is usually far slower than fp32", stacklevel=2)
    check_trackers_installed(training_config.log_with)  # before accelerate drops a missing one with a warning
    check_distributed_engine(on_cpu)  # a DeepSpeed or FSDP launch the loop cannot train correctly: one line
    _forget_other_precision(precision)
    accelerator = Accelerator(
        cpu=on_cpu,
        mixed_precision=precision,
        # Shuffling from a seeded sampler: the same seed gives the same order on any number of processes.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=parameters_change_trainability)],
        log_with=training_config.log_with or None,
        project_dir=run_dir if training_config.log_with else None,
    )
    return accelerator


def total_optimizer_steps(batches_per_epoch: int, training_config, epochs: int | None = None) -> int:
    """Optimizer steps of the whole run: max_steps when given (whatever the epochs, as in the Trainer: the data
    repeats and the epoch counter goes on), else epochs x steps per epoch (`epochs`: the stage's plan where the
    recipe leaves training.epochs open, training/budget.py)."""
    if training_config.max_steps:
        return training_config.max_steps
    epochs = epochs or training_config.epochs
    return math.ceil(batches_per_epoch / training_config.gradient_accumulation_steps) * epochs


class TrainingLoop:
    """Optimizer steps with accumulation, clipping, the LR schedule, logging and a progress bar."""

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        rates: LearningRates,
        total_steps: int,
        training_config,
        metrics_log: MetricsLog,
        throughput_unit: str,
        checkpoint_every: int | None = None,
        save_checkpoint: Callable[[TrainingState], Path | None] | None = None,
        events: Events | None = None,
        phase: str = TRAIN_PHASE,
    ):
        self.accelerator, self.model, self.rates = accelerator, model, rates
        self.optimizer = rates.optimizer
        self.phase = phase  # the run's own training, or a phase before it (head_warmup): names records and checkpoints
        self.total_steps, self.config = total_steps, training_config
        self.events = events if events is not None else Events()  # who hears this loop's events (training/events.py)
        self.metrics_log, self.throughput_unit = metrics_log, throughput_unit
        # save_checkpoint(state) -> folder is called every `checkpoint_every` steps (and on Ctrl-C) with the loop's
        # share of the TrainingState to resume from (`snapshot`); the run driver adds its own and saves it.
        self.checkpoint_every, self.save_checkpoint = checkpoint_every, save_checkpoint
        self.step = 0  # optimizer steps taken so far
        self.last_checkpoint: Path | None = None  # the newest periodic checkpoint, named when a run fails
        self.saved_step = 0  # the step of the newest checkpoint: Ctrl-C right after one saves nothing new
        self._interrupt_requested = False  # set by the Ctrl-C handler of `watching`
        # First step (1-based; 0: none) with a non-finite loss / gradient norm, kept on the device: no sync per step.
        self._nonfinite = torch.zeros(2, dtype=torch.long, device=accelerator.device)
        self.started = time.perf_counter()  # for the run's wall time (reporting.finish); moved back on a resume
        # Loop state rather than locals of train_epoch, so that a checkpoint keeps them and a resumed run logs what
        # an uninterrupted one would. Summed on the device and read once per log window (no sync at every step):
        # the log window's loss and loss terms, then the epoch's. Each process sums its own share.
        self._sums = torch.zeros(4, device=accelerator.device)
        self._window_items = 0  # tokens or examples of this process in the log window, for the throughput
        self._window_seconds = 0.0  # training time of the log window before `_window_clock` (evaluations left out)
        self._window_clock = time.perf_counter()

    @property
    def finished(self) -> bool:
        """True once the run's step budget is spent, or a subscriber asked to stop (early stopping)."""
        return self.step >= self.total_steps or self.events.control.should_stop

    def train_epoch(
        self,
        loader,
        epoch: int,
        compute_loss: LossFunction,
        evaluate: Callable[[], dict[str, Any]] | None = None,
        eval_every: int | None = None,
        batches_done: int = 0,
    ) -> float:
        """One pass over `loader` (or until the step budget ends); returns the mean training loss.

        `batches_done`: batches of this epoch already trained before a resume; `loader` then holds the rest.
        on_step_begin fires at every step boundary before the step's first micro-batch; a resumed epoch starts at a
        checkpoint's step boundary, so it fires there too.
        Losses and gradient norms are checked for nan/inf at every logged step, before every evaluation and
        save, and at the end of the epoch (reading them at every step would stall the GPU): the first bad
        step raises RunFailed, so a diverged model is never evaluated, checkpointed or saved as the result.
        """
        self.model.train()
        if not batches_done:  # a new epoch; a resumed one continues the sums that `restore` put back
            self._sums.zero_()
            self._start_window()
        self._window_clock = time.perf_counter()
        accumulation = self.config.gradient_accumulation_steps
        steps_this_epoch = min(math.ceil(len(loader) / accumulation), self.total_steps - self.step)
        with progress_bar(self.accelerator.is_main_process) as progress:
            named = f"epoch {epoch + 1}" if self.phase == TRAIN_PHASE else f"{self.phase}, epoch {epoch + 1}"
            bar = progress.add_task(named, total=steps_this_epoch, status="")
            for micro_batches in _optimizer_steps(loader, accumulation):
                self.events.fire("on_step_begin", self, epoch)
                learning_rates = self._optimizer_step(micro_batches, compute_loss)
                batches_done += len(micro_batches)
                self.step += 1
                progress.advance(bar)
                if self.step % self.config.log_every == 0 or self.finished:
                    status = self._log_training(epoch, learning_rates)
                    progress.update(bar, status=status)
                if evaluate is not None and eval_every and self.step % eval_every == 0 and not self.finished:
                    self._check_finite()
                    with self._window_clock_stopped():
                        self.log_evaluation(evaluate(), epoch)
                    self.model.train()
                self._checkpoint_if_due(epoch, batches_done)
                if self.finished:
                    break
        self._check_finite()  # what follows an epoch (evaluation, the final save) must not see poisoned weights
        epoch_loss, epoch_terms = self._summed_over_processes(*self._sums[2:])
        return (epoch_loss / epoch_terms.clamp(min=1)).item()

    def _optimizer_step(self, micro_batches: list, compute_loss: LossFunction) -> dict[str, float]:
        """One optimizer step over its micro-batches (the gradient accumulation boundary is the end of the list);
        returns the learning rates it used.

        Backward runs on each micro-batch's *summed* loss; the gradients are then divided by the step's total
        number of loss terms (`_average_gradients`). So k accumulated micro-batches (or k processes) give exactly
        the gradient of one k-times larger batch, however unevenly the terms are split.
        """
        accelerator, model = self.accelerator, self.model
        step_terms = torch.zeros((), device=accelerator.device)
        # A micro-batch split by length (training.split_by_length) comes as a list of pieces, a backward each.
        pieces = [piece for batch in micro_batches for piece in (batch if isinstance(batch, list) else [batch])]
        for index, batch in enumerate(pieces):
            # Under DDP only the step's last backward all-reduces the gradients (forward included, as DDP needs).
            last = index == len(pieces) - 1
            with contextlib.nullcontext() if last else accelerator.no_sync(model):
                loss, terms, items = compute_loss(model, batch)
                self._mark_nonfinite(0, loss)
                terms = torch.as_tensor(terms, device=loss.device, dtype=torch.float32)
                accelerator.backward(loss * terms)
            step_terms += terms
            summed = loss.detach().float() * terms
            self._sums += torch.stack((summed, terms, summed, terms))
            self._window_items += int(items)
        self._average_gradients(step_terms)
        if self.config.max_grad_norm:
            norm = accelerator.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], self.config.max_grad_norm
            )
            if norm is not None and accelerator.scaler is None:  # fp16's scaler skips inf steps itself
                self._mark_nonfinite(1, norm)
        learning_rates = self.rates.apply(self.step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return learning_rates

    def _log_training(self, epoch: int, learning_rates: dict[str, float]) -> str:
        """Write the log window's training record, start a new window; returns the progress bar's status."""
        self._check_finite()
        elapsed = self._window_seconds + time.perf_counter() - self._window_clock
        # Every process counts its own items; throughput is for all of them together.
        throughput = self._window_items * self.accelerator.num_processes / elapsed
        # The mean over every process's loss terms, not over the main process's share alone.
        loss_sum, loss_terms = self._summed_over_processes(*self._sums[:2])
        record = {
            "phase": self.phase,
            "step": self.step,
            "epoch": epoch,
            "loss": (loss_sum / loss_terms.clamp(min=1)).item(),
            "lr": learning_rates,
            f"{self.throughput_unit}_per_s": round(throughput, 1),
        }
        self.metrics_log.write(record)
        self._start_window()
        return (
            f"loss {record['loss']:.4f}  lr {max(learning_rates.values()):.2e}  "
            f"{throughput:,.0f} {self.throughput_unit}/s"
        )

    def _checkpoint_if_due(self, epoch: int, batches_done: int) -> None:
        """The periodic checkpoint of this step, if due; on an agreed Ctrl-C, one (unless just saved) and stop."""
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self._save(epoch, batches_done)
        if self._interrupt_agreed():
            if self.saved_step != self.step:
                self._save(epoch, batches_done)
            raise RunInterrupted(self.step, self.last_checkpoint if self.saved_step == self.step else None)

    def _start_window(self) -> None:
        """Start a new log window: no loss, items or training time in it yet."""
        self._sums[:2].zero_()
        self._window_items, self._window_seconds, self._window_clock = 0, 0.0, time.perf_counter()

    @contextmanager
    def _window_clock_stopped(self):
        """Leave the time of the enclosed block (an evaluation, a save) out of the log window's throughput."""
        self._window_seconds += time.perf_counter() - self._window_clock
        try:
            yield
        finally:
            self._window_clock = time.perf_counter()

    def _summed_over_processes(self, *sums: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each process's running sums added up over all processes (one all-reduce), so logs cover every process."""
        stacked = torch.stack(sums)
        if self.accelerator.num_processes > 1:
            stacked = self.accelerator.reduce(stacked, reduction="sum")
        return tuple(stacked.unbind())

    def snapshot(self, epoch: int, batches_done: int) -> TrainingState:
        """The loop's share of the TrainingState at this step boundary (the window's items and seconds are the main
        process's, the one that logs; the running sums are this process's)."""
        return TrainingState(
            phase=self.phase,
            step=self.step,
            epoch=epoch,
            batches_in_epoch=batches_done,
            metrics_lines=self.metrics_log.line_count(),
            window_items=self._window_items,
            window_seconds=self._window_seconds,
            training_seconds=time.perf_counter() - self.started,
            running_sums=self._sums,
            processes=self.accelerator.num_processes,
            batch_size=self.config.batch_size,
            accumulation=self.config.gradient_accumulation_steps,
        )

    def restore(self, state: TrainingState, checkpoint: Path) -> None:
        """Continue from a periodic checkpoint's state: its step, metrics.jsonl cut back to what was logged by then.

        The log window and epoch sums, the window's items and seconds and the training time come back too, so the
        logs and timing.json read as if the run never stopped.
        """
        self.step = self.saved_step = state.step
        self.last_checkpoint = Path(checkpoint)
        self.metrics_log.truncate(state.metrics_lines)  # drop what the interrupted run logged after it
        self.started -= state.training_seconds
        if state.running_sums is not None:
            self._sums.copy_(state.running_sums)
            self._window_items, self._window_seconds = state.window_items, state.window_seconds

    @contextmanager
    def watching(self):
        """Wrap a stage's training: Ctrl-C, out-of-memory errors and (inside `train_epoch`) non-finite losses.

        The first Ctrl-C (SIGINT) asks for a checkpoint at the end of the current optimizer step, after which
        RunInterrupted is raised (the CLI prints how to resume and exits 130); a second one stops at once.
        Under several processes the request is acted on at the next logged step, when they all agree on it.
        torch.OutOfMemoryError becomes a one-line RunFailed with what to change in the recipe.
        """
        in_main_thread = threading.current_thread() is threading.main_thread()  # only it may handle signals
        previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
        if in_main_thread:
            signal.signal(signal.SIGINT, self._on_interrupt)
        try:
            yield self
        except torch.OutOfMemoryError:
            config = self.config
            raise RunFailed(
                f"out of GPU memory after {self.step} optimizer steps (training.batch_size={config.batch_size}, "
                f"gradient_accumulation_steps={config.gradient_accumulation_steps}, mixed_precision="
                f"{config.mixed_precision}): lower training.batch_size and raise training.gradient_accumulation_steps "
                "by the same factor (the effective batch stays the same), shorten the sequences (task.max_length "
                "or corpus.block_size), or use training.mixed_precision=bf16"
            ) from None
        except RuntimeError as error:
            if not is_lost_process(error):
                raise
            raise RunFailed(lost_process_message(error, self.step, self.last_checkpoint)) from None
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)

    def _on_interrupt(self, signal_number, frame) -> None:
        if self._interrupt_requested:  # the second Ctrl-C: stop now, without a checkpoint
            raise KeyboardInterrupt
        self._interrupt_requested = True
        console.print("[bold]Ctrl-C: saving a checkpoint at the end of this step[/bold] (press again to stop at once)")

    def _interrupt_agreed(self) -> bool:
        """Whether to stop for a Ctrl-C now; several processes decide together, at logged steps (no sync per step)."""
        accelerator = self.accelerator
        if accelerator.num_processes == 1:
            return self._interrupt_requested
        if self.step % self.config.log_every != 0 and not self.finished:
            return False
        flag = torch.tensor(float(self._interrupt_requested), device=accelerator.device)
        return accelerator.reduce(flag, reduction="sum").item() > 0

    def _save(self, epoch: int, batches_done: int) -> None:
        """A periodic (or Ctrl-C) checkpoint at this step boundary, after checking that the weights are sound."""
        if self.save_checkpoint is None:
            return
        self._check_finite()
        with self._window_clock_stopped():
            self.last_checkpoint = self.save_checkpoint(self.snapshot(epoch, batches_done)) or self.last_checkpoint
        self.saved_step = self.step

    def _mark_nonfinite(self, kind: int, value: torch.Tensor) -> None:
        """Remember, on the device, the first step whose loss (kind 0) or gradient norm (kind 1) was nan or inf."""
        first = self._nonfinite[kind]
        self._nonfinite[kind] = torch.where(~torch.isfinite(value.detach()).all() & (first == 0), self.step + 1, first)

    def _check_finite(self) -> None:
        """Raise RunFailed (on every process together) if any step so far had a non-finite loss or gradient norm."""
        found = self._nonfinite
        if self.accelerator.num_processes > 1:
            found = self.accelerator.gather(found[None])
        bad = [(step, kind) for row in found.view(-1, 2).tolist() for kind, step in enumerate(row) if step > 0]
        if not bad:
            return
        step, kind = min(bad)
        what = f"the {'loss' if kind == 0 else 'gradient norm'} was not finite (nan or inf) at step {step}"
        raise diverged(what, self.last_checkpoint, self.config.lr)

    def _average_gradients(self, step_terms: torch.Tensor) -> None:
        """Turn the summed-loss gradients of this step into the gradient of the mean over all its loss terms.

        DDP averaged over the processes: that factor is undone and the global count of terms divided instead.
        """
        accelerator = self.accelerator
        total_terms = (
            accelerator.reduce(step_terms.clone(), reduction="sum") if accelerator.num_processes > 1 else step_terms
        )
        scale = accelerator.num_processes / total_terms.clamp(min=1)
        gradients = [p.grad for p in self.model.parameters() if p.grad is not None]
        if gradients:
            torch._foreach_mul_(gradients, scale.to(gradients[0].dtype))

    def log_evaluation(self, metrics: dict[str, Any], epoch: int) -> None:
        """Write an evaluation record for the current step; then on_evaluation_written (a search's pruner may stop
        the run there)."""
        self.metrics_log.write({"phase": "eval", "step": self.step, "epoch": epoch, **metrics})
        self.events.fire("on_evaluation_written", self, metrics)


def _optimizer_steps(loader, accumulation: int):
    """The loader's micro-batches grouped by optimizer step: `accumulation` at a time, fewer in an epoch's last."""
    batches = iter(loader)
    while micro_batches := list(itertools.islice(batches, accumulation)):
        yield micro_batches
