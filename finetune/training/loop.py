"""The one training loop, on accelerate, shared by pretrain and finetune.

A stage builds the model, the optimizer groups and the schedule, then calls `train_epoch` once
per epoch, deciding in its own code what changes between epochs (e.g. unfreezing).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any, Callable, Optional

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs

from finetune.console import console, progress_bar
from finetune.run_dir import MetricsLog
from finetune.training.optim import set_learning_rates

# compute_loss(model, batch) -> (mean loss of the batch, the number of terms it is the mean of, items for the
# throughput: tokens or examples). Terms are examples for a classifier, labelled tokens for a language model.
LossFunction = Callable[[torch.nn.Module, dict[str, torch.Tensor]], tuple[torch.Tensor, Any, int]]


def make_accelerator(training_config, parameters_change_trainability: bool = False) -> Accelerator:
    """An Accelerator for the recipe: mixed precision only where the hardware does it well.

    `parameters_change_trainability`: gradual unfreezing freezes parameters after DDP has wrapped
    the model, so DDP must be told that some parameters may receive no gradient.
    """
    on_cpu = training_config.device == "cpu" or not torch.cuda.is_available()
    precision = training_config.mixed_precision
    if precision == "auto":
        # bf16 matmuls on CPUs without AMX run hundreds of times slower than fp32.
        precision = "bf16" if not on_cpu and torch.cuda.is_bf16_supported() else "no"
    elif precision != "no" and on_cpu:
        warnings.warn(f"mixed_precision={precision} on a CPU is usually far slower than fp32", stacklevel=2)
    accelerator = Accelerator(
        cpu=on_cpu,
        mixed_precision=precision,
        gradient_accumulation_steps=training_config.gradient_accumulation_steps,
        # Shuffling from a seeded sampler: the same seed gives the same order on any number of processes.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=parameters_change_trainability)],
    )
    console.quiet = not accelerator.is_main_process  # one copy of every message, not one per process
    return accelerator


def total_optimizer_steps(batches_per_epoch: int, training_config) -> int:
    """Optimizer steps of the whole run: epochs x steps per epoch, capped by max_steps."""
    per_epoch = math.ceil(batches_per_epoch / training_config.gradient_accumulation_steps)
    total = per_epoch * training_config.epochs
    return min(total, training_config.max_steps) if training_config.max_steps else total


class TrainingLoop:
    """Optimizer steps with accumulation, clipping, the LR schedule, logging and a progress bar."""

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Callable[[int], float],
        total_steps: int,
        training_config,
        metrics_log: MetricsLog,
        throughput_unit: str,
        checkpoint_every: Optional[int] = None,
        save_checkpoint: Optional[Callable[[dict[str, int]], None]] = None,
    ):
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.schedule, self.total_steps, self.config = schedule, total_steps, training_config
        self.metrics_log, self.throughput_unit = metrics_log, throughput_unit
        # save_checkpoint(progress) is called every `checkpoint_every` steps with the position to resume from.
        self.checkpoint_every, self.save_checkpoint = checkpoint_every, save_checkpoint
        self.step = 0  # optimizer steps taken so far
        self.stop_requested = False  # set by a stage (e.g. from an evaluation) to end the run after this step

    @property
    def finished(self) -> bool:
        """True once the run's step budget is spent, or a stage asked to stop (early stopping)."""
        return self.step >= self.total_steps or self.stop_requested

    def train_epoch(
        self,
        loader,
        epoch: int,
        compute_loss: LossFunction,
        evaluate: Optional[Callable[[], dict[str, Any]]] = None,
        eval_every: Optional[int] = None,
        batches_done: int = 0,
    ) -> float:
        """One pass over `loader` (or until the step budget ends); returns the mean training loss.

        `batches_done`: batches of this epoch already trained before a resume; `loader` then holds the rest.
        """
        accelerator, model, optimizer = self.accelerator, self.model, self.optimizer
        model.train()
        # Summed on the device and read once per log window: no host synchronisation at every step.
        window_loss = torch.zeros((), device=accelerator.device)
        window_terms, step_terms = torch.zeros_like(window_loss), torch.zeros_like(window_loss)
        epoch_loss, epoch_terms = torch.zeros_like(window_loss), torch.zeros_like(window_loss)
        window_items, window_start = 0, time.perf_counter()
        steps_this_epoch = min(
            math.ceil(len(loader) / self.config.gradient_accumulation_steps), self.total_steps - self.step
        )
        with progress_bar(accelerator.is_main_process) as progress:
            bar = progress.add_task(f"epoch {epoch + 1}", total=steps_this_epoch, status="")
            for batch in loader:
                with accelerator.accumulate(model):
                    loss, terms, items = compute_loss(model, batch)
                    terms = torch.as_tensor(terms, device=loss.device, dtype=torch.float32)
                    # Backward of the *summed* loss; the gradients are divided by the step's total number of
                    # loss terms below. So k accumulated micro-batches (or k processes) give exactly the
                    # gradient of one k-times larger batch, however unevenly the terms are split.
                    accelerator.backward(loss * terms)
                    step_terms += terms
                    if accelerator.sync_gradients:
                        self._average_gradients(step_terms)
                        step_terms.zero_()
                        if self.config.max_grad_norm:
                            accelerator.clip_grad_norm_(
                                [p for p in model.parameters() if p.requires_grad], self.config.max_grad_norm
                            )
                        lrs = set_learning_rates(optimizer, self.schedule(self.step))
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                summed = loss.detach().float() * terms
                window_loss += summed
                epoch_loss += summed
                window_terms += terms
                epoch_terms += terms
                batches_done += 1
                window_items += int(items)
                if not accelerator.sync_gradients:
                    continue
                self.step += 1
                progress.advance(bar)
                if self.step % self.config.log_every == 0 or self.finished:
                    elapsed = time.perf_counter() - window_start
                    # Every process counts its own items; throughput is for all of them together.
                    throughput = window_items * accelerator.num_processes / elapsed
                    record = {
                        "phase": "train", "step": self.step, "epoch": epoch,
                        "loss": (window_loss / window_terms.clamp(min=1)).item(),
                        "lr": lrs, f"{self.throughput_unit}_per_s": round(throughput, 1),
                    }
                    self.metrics_log.write(record)
                    progress.update(bar, status=f"loss {record['loss']:.4f}  lr {max(lrs.values()):.2e}  "
                                                f"{throughput:,.0f} {self.throughput_unit}/s")
                    window_loss.zero_(), window_terms.zero_()
                    window_items, window_start = 0, time.perf_counter()
                if evaluate is not None and eval_every and self.step % eval_every == 0 and not self.finished:
                    self.log_evaluation(evaluate(), epoch)
                    model.train()
                    window_start = time.perf_counter()
                if self.checkpoint_every and self.step % self.checkpoint_every == 0:
                    self.save_checkpoint({"step": self.step, "epoch": epoch, "batches_in_epoch": batches_done})
                    window_start = time.perf_counter()
                if self.finished:
                    break
        return (epoch_loss / epoch_terms.clamp(min=1)).item()

    def _average_gradients(self, step_terms: torch.Tensor) -> None:
        """Turn the summed-loss gradients of this step into the gradient of the mean over all its loss terms.

        accelerate divided each backward by the accumulation steps and DDP averaged over the processes;
        both factors are undone and the global count of terms divided instead.
        """
        accelerator = self.accelerator
        total_terms = accelerator.reduce(step_terms.clone(), reduction="sum") if accelerator.num_processes > 1 \
            else step_terms
        scale = self.config.gradient_accumulation_steps * accelerator.num_processes / total_terms.clamp(min=1)
        gradients = [p.grad for p in self.model.parameters() if p.grad is not None]
        if gradients:
            torch._foreach_mul_(gradients, scale.to(gradients[0].dtype))

    def log_evaluation(self, metrics: dict[str, Any], epoch: int) -> None:
        """Write an evaluation record for the current step."""
        self.metrics_log.write({"phase": "eval", "step": self.step, "epoch": epoch, **metrics})
