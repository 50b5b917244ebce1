"""`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's three techniques.

setup (data, model, layer groups, discriminative LRs, STLR) -> train (thaw groups epoch by epoch or every
N optimizer steps, evaluate, keep the best, stop early) -> save (HF checkpoint with the label mapping).
With `seeds`, the whole stage runs once per seed and the dev scores are summarised across seeds. `resume=True`
continues from the newest periodic checkpoint (`checkpoint_every`) bit for bit: weights, optimizer,
random states, unfreezing stage, data position, best score so far (and its weights), patience.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from finetune.console import console
from finetune.data.reverse import reads_backwards, reads_both_directions
from finetune.data.sampling import ResumableSampler
from finetune.data.step_batches import REAL_EXAMPLES, CountingCollator, PaddableDataset, StepBatches
from finetune.data.long_documents import WINDOW_DOCUMENT, DocumentReading, classification_loss, windowed_logits
from finetune.data.tasks import EncodedTask, LengthGroupedSampler, read_labelled_split, task_collator
from finetune.glue.metrics import compute_metrics
from finetune.glue.specs import task_spec
from finetune.models.backbones import layer_groups
from finetune.models.heads import fitted_max_length, load_classifier
from finetune.models.hub import load_tokenizer
from finetune.recipes import FinetuneRecipe
from finetune.reporting.finish import finish_run
from finetune.reporting.model_card import classifier_card, write_card
from finetune.reporting.trackers import start_trackers
from finetune.run_dir import (CHECKPOINT_DIR, METRICS_FILE, MetricsLog, check_resumable, check_run_dir_free,
                               check_same_recipe, claim_run_dir, guarded_stage, prepare_run_dir, read_metrics)
from finetune.stages.seeds import run_each_seed
from finetune.training.checkpoints import (commit_checkpoint, latest_training_checkpoint, load_training_state,
                                           save_checkpoint, save_training_checkpoint, step_checkpoint_dir,
                                           sweep_incomplete_checkpoints)
from finetune.training.loop import TrainingLoop, make_accelerator, total_optimizer_steps
from finetune.training.optim import build_optimizer, discriminative_lrs
from finetune.training.predict import LengthSortedPrediction, logits_loss, logits_to_predictions, predict_logits
from finetune.training.schedules import make_momentum_schedule, make_schedule
from finetune.training.techniques import describe_backbone, resolve_techniques, techniques_summary
from finetune.training.unfreezing import (freeze_below, thaw_interval, trainable_group_count,
                                         trainable_group_count_at_step)

RESULT_FILE = "result.json"  # the dev scores of the saved checkpoint and of the last evaluation
BEST_DIR = Path("checkpoints") / "best"  # inside the run directory: the best evaluation's weights until the end


@guarded_stage
def run_finetune(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """Run the stage (once, or once per seed); returns the checkpoint folder (the run directory for seeds).

    `resume`: continue a stopped run from its newest periodic checkpoint; with seeds, finished seeds are kept.
    The techniques the recipe leaves open are decided by the backbone first (training/techniques.py), so the saved
    recipe, the model card and a resumed run's check all see the values in force.
    """
    recipe = resolve_techniques(recipe, describe_backbone(recipe.model.checkpoint,
                                                          recipe.model.trust_remote_code)).recipe
    if recipe.seeds is not None:
        return run_each_seed(recipe, run_single_seed, RESULT_FILE, resume)
    return run_single_seed(recipe, resume)


def run_single_seed(recipe: FinetuneRecipe, resume: bool = False) -> Path:
    """One fine-tuning run (or the rest of a stopped one, `resume`); returns the checkpoint folder."""
    # 1. setup: read everything that can fail on user input before the run directory exists
    resume_from = None
    if resume:
        if (check_same_recipe(recipe) / RESULT_FILE).is_file():
            console.print(f"{recipe.run_dir} finished before: nothing to resume")
            return Path(recipe.run_dir) / CHECKPOINT_DIR
        resume_from = check_resumable(recipe, latest_training_checkpoint)
    else:
        check_run_dir_free(recipe, latest_training_checkpoint)
    accelerator = make_accelerator(recipe.training, parameters_change_trainability=recipe.unfreezing.mode != "none",
                                   run_dir=recipe.run_dir)
    # Every process checked the run directory above; none may create it before all have (a later run in the same
    # process, e.g. the next command or seed, meets no rendezvous that would order them otherwise).
    accelerator.wait_for_everyone()
    set_seed(recipe.seed)
    spec = task_spec(recipe.task)
    tokenizer = load_tokenizer(recipe.model.checkpoint, trust_remote_code=recipe.model.trust_remote_code)
    train_examples = read_labelled_split(spec, recipe.task.data_dir, "train")
    dev_examples = read_labelled_split(spec, recipe.task.data_dir, "dev")
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # GPT-2's tokenizer has no pad token; batches pad with end-of-text, which the attention mask hides.
        tokenizer.pad_token = tokenizer.eos_token
    model = load_classifier(recipe.model, spec, recipe.classifier_dropout, recipe.pooling)
    if model.config.pad_token_id is None:  # decoders pool at the last non-pad token: they must know which it is
        model.config.pad_token_id = tokenizer.pad_token_id
    reading = DocumentReading.of(fitted_max_length(recipe.task.max_length, model), recipe.task.long_documents)

    # 2. layer groups -> discriminative learning rates -> optimizer
    groups = layer_groups(model)
    lrs = discriminative_lrs(len(groups), recipe.training.lr, recipe.discriminative.factor)
    optimizer = build_optimizer(model, groups, lrs, recipe.training.weight_decay, recipe.training.adam_betas)
    # Every input is read and the model built: only now is the run directory created (or, resuming, locked).
    main = accelerator.is_main_process
    run_dir = claim_run_dir(recipe, main) if resume else prepare_run_dir(recipe, main)
    console.print(f"task {spec.name}: {len(train_examples.texts):,} training and {len(dev_examples.texts):,} dev "
                  f"examples; backbone {recipe.model.checkpoint} ({recipe.model.init} weights), seed {recipe.seed}")
    console.print(techniques_summary(recipe), markup=False, highlight=False, soft_wrap=True)
    console.print(f"the classifier {reading.describe()}", markup=False, highlight=False, soft_wrap=True)
    # A backward LM's classifier reads its text backwards too; a bidirectional one (two LMs) both ways.
    directions = {"backwards": reads_backwards(model.config), "both_directions": reads_both_directions(model.config)}
    train_data = EncodedTask(train_examples, tokenizer, reading, **directions, name="training")
    note = gradient_window_note(model.config, train_data.lengths, whole=reading.max_length is None)
    if note:
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    # Grouped by the examples of a whole optimizer step, so its split into processes and micro-batches changes nothing.
    step_examples = recipe.training.batch_size * accelerator.num_processes * recipe.training.gradient_accumulation_steps
    order = LengthGroupedSampler(train_data.lengths, step_examples, recipe.seed) \
        if recipe.training.group_by_length else ResumableSampler(len(train_data), recipe.seed)
    # Each step holds the same examples on any number of processes, and no example comes twice an epoch.
    batches = StepBatches(order, recipe.training.batch_size, accelerator.num_processes,
                          recipe.training.gradient_accumulation_steps)
    # A private generator for the workers' seed: starting an epoch then leaves the global random state (dropout)
    # untouched, so a resumed run draws the same dropout masks as one that never stopped.
    train_loader = DataLoader(PaddableDataset(train_data), batch_sampler=batches,
                              collate_fn=CountingCollator(task_collator(tokenizer, train_data)),
                              num_workers=recipe.training.num_workers,
                              generator=torch.Generator().manual_seed(recipe.seed))
    dev_batches = LengthSortedPrediction(EncodedTask(dev_examples, tokenizer, reading, **directions, name="dev"),
                                         tokenizer, recipe.training.batch_size * 2)
    dev_loader = dev_batches.loader
    model, optimizer, train_loader, dev_loader = accelerator.prepare(model, optimizer, train_loader, dev_loader)
    total_steps = total_optimizer_steps(len(train_loader), recipe.training)
    log = MetricsLog(run_dir / METRICS_FILE, accelerator.is_main_process, start_trackers(accelerator, recipe, run_dir))
    checkpoint, best_dir = run_dir / CHECKPOINT_DIR, run_dir / BEST_DIR
    best = BestCheckpoint(spec.main_metric, recipe.early_stopping_patience)

    def save_state(progress: dict[str, int]) -> Path:
        # The best evaluation so far (scores, patience and weights) travels with the periodic checkpoint.
        return save_training_checkpoint(accelerator, accelerator.unwrap_model(model), tokenizer,
                                        step_checkpoint_dir(run_dir, progress["step"]), recipe,
                                        {**progress, "best": best.state()}, recipe.keep_checkpoints,
                                        loop.process_tensors(), attachments={"best": best_dir})

    loop = TrainingLoop(accelerator, model, optimizer, make_schedule(recipe.schedule, total_steps), total_steps,
                        recipe.training, log, "examples", recipe.checkpoint_every, save_state,
                        momentum=make_momentum_schedule(recipe.schedule, total_steps))

    def save(directory: Path) -> None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            save_checkpoint(accelerator.unwrap_model(model), tokenizer, directory, recipe)

    def compute_loss(model, batch):
        examples = batch.pop(REAL_EXAMPLES)  # 0 in a padding batch (data/step_batches.py): its loss counts 0 times
        if WINDOW_DOCUMENT in batch:  # chunks: the loss of each document's pooled logits, not of its windows
            return classification_loss(windowed_logits(model, batch, reading.pool), batch["labels"]), examples, \
                examples
        return model(**batch).loss, examples, examples

    def evaluate() -> dict[str, float]:
        """Dev scores; with keep_best a new best is saved at once, and patience runs out after no gains."""
        logits = dev_batches.in_file_order(predict_logits(accelerator, model, dev_loader, reading.pool))
        predictions = logits_to_predictions(spec, logits)
        metrics = {f"dev_{name}": value for name, value in
                   compute_metrics(spec, predictions, dev_examples.labels).items()}
        if best.update(metrics, loop.step) and recipe.keep_best:
            save(best_dir)
        loop.stop_requested = best.patience_exhausted
        # The dev loss goes to metrics.jsonl (the loss plot) only; scores and the best checkpoint use the metrics.
        return {**metrics, "validation_loss": logits_loss(spec, logits, dev_examples.labels),
                "best_so_far": best.step == loop.step}

    # 3. train: gradual unfreezing decides, per epoch or per optimizer step, how many groups from the top learn
    unfreezing = recipe.unfreezing
    interval = thaw_interval(total_steps, unfreezing.every_steps, unfreezing.every_fraction)  # None: per epoch
    if interval is None and unfreezing.mode == "gradual" and not resume_from:
        steps_per_epoch = math.ceil(len(train_loader) / recipe.training.gradient_accumulation_steps)
        epochs = math.ceil(total_steps / steps_per_epoch)
        thawed = trainable_group_count(epochs - 1, len(groups), "gradual", unfreezing.initial_groups,
                                       unfreezing.groups_per_epoch, unfreezing.schedule)
        if thawed < len(groups):  # said, not silently left: the lower groups keep their pretrained weights
            console.print(f"note: gradual unfreezing thaws one more group per epoch; in {epochs} epoch(s) {thawed} "
                          f"of the {len(groups)} layer groups train and the lowest {len(groups) - thawed} never do "
                          "(more epochs, or unfreezing.every_fraction to thaw by steps)", markup=False)

    def log_unfreezing(step: int, epoch: int, trainable: int) -> None:
        # `step`: the steps taken before the change; it holds from step + 1 on (what plots.is_trainable reads).
        log.write({"phase": "unfreeze", "step": step, "epoch": epoch, "trainable_groups": trainable,
                   "total_groups": len(groups)})

    def count_at(step: int) -> int:
        return trainable_group_count_at_step(step, len(groups), unfreezing.initial_groups, interval)

    def thaw_by_steps(step: int, epoch: int) -> None:
        """The loop's before_step: freeze to the count of this step, with a record at step 0 and at each change.

        Written from the step alone (not from what this process did before), so a resumed run freezes and logs
        exactly what the stopped one would have: the stopped run wrote the record of its checkpoint's step, if
        any, only after that checkpoint.
        """
        trainable = count_at(step)
        freeze_below(groups, trainable)  # idempotent, and cheap next to a step: one flag per parameter
        if step == 0 or trainable != count_at(step - 1):
            log_unfreezing(step, epoch, trainable)

    first_epoch, batches_done = 0, 0
    if resume_from is not None:
        if accelerator.is_main_process:
            sweep_incomplete_checkpoints(run_dir)  # what a kill during a save or a pruning left behind
        progress, tensors = load_training_state(accelerator, resume_from, attachments={"best": best_dir})
        first_epoch, batches_done = loop.restore(progress, resume_from, tensors)
        best.load_state(progress["best"])
        loop.stop_requested = best.patience_exhausted
        console.print(f"resuming from {resume_from} (step {loop.step}, epoch {first_epoch + 1})")
    with loop.watching():  # Ctrl-C: checkpoint and stop; out of memory: advice
        epoch = first_epoch
        # Epochs until the step budget is spent (training.max_steps may ask for more than training.epochs). A resumed
        # epoch (batches_done > 0) logged its unfreezing before; it may owe only its evaluation.
        while not loop.finished or batches_done:
            if interval is None:  # per epoch; step-wise unfreezing happens in the loop (thaw_by_steps)
                trainable = trainable_group_count(epoch, len(groups), unfreezing.mode, unfreezing.initial_groups,
                                                  unfreezing.groups_per_epoch, unfreezing.schedule)
                freeze_below(groups, trainable)
                if not batches_done:
                    log_unfreezing(loop.step, epoch, trainable)
            train_loader.set_epoch(epoch)
            order.set_epoch(epoch)
            order.skip_batches(batches_done, recipe.training.batch_size, accelerator.num_processes)
            if not loop.finished:
                loop.train_epoch(train_loader, epoch, compute_loss, evaluate, recipe.eval_every, batches_done,
                                 before_step=None if interval is None else thaw_by_steps)
            if interval is not None:  # the groups that trained in the epoch's last step
                trainable = count_at(max(loop.step - 1, 0))
            if loop.step != best.last_evaluated_step:  # the epoch did not end on a periodic evaluation
                loop.log_evaluation(evaluate(), epoch)
            scores = ", ".join(f"{name.removeprefix('dev_')} {value:.4f}" for name, value in best.last.items())
            console.print(f"epoch {epoch + 1}: {trainable}/{len(groups)} groups trainable; dev {scores}")
            if best.patience_exhausted:
                console.print(f"early stopping: no better dev {spec.main_metric} in "
                              f"{recipe.early_stopping_patience} evaluations")
            epoch, batches_done = epoch + 1, 0

    # 4. save: the best evaluation's weights (in RUN_DIR/checkpoints/best until now), or the last ones
    freeze_below(groups, len(groups))  # every parameter trainable again, as in any loaded checkpoint
    if recipe.keep_best:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            commit_checkpoint(best_dir, checkpoint)  # every run ends with an evaluation: the best exists
            with contextlib.suppress(OSError):  # the folder stays when it holds periodic checkpoints
                best_dir.parent.rmdir()
    else:
        save(checkpoint)
    if accelerator.is_main_process:
        result = {"main_metric": spec.main_metric, "saved": "best" if recipe.keep_best else "last",
                  "best_step": best.step, "best": best.scores, "last_step": loop.step, "last": best.last}
        (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        card = classifier_card(recipe, spec, result, read_metrics(run_dir / METRICS_FILE),
                               accelerator.unwrap_model(model).config.model_type)
        write_card(card, checkpoint)  # README.md: the Hugging Face model card
        which = f"best dev {spec.main_metric} {best.scores['dev_' + spec.main_metric]:.4f} at step {best.step}" \
            if recipe.keep_best else "after the last step"
        console.print(f"checkpoint ({which}) saved to {checkpoint}")
    finish_run(accelerator, run_dir, loop)  # trackers closed, timing.json, RUN_DIR/plots/*.png
    return checkpoint


def gradient_window_note(config, lengths: list[int], whole: bool = True) -> Optional[str]:
    """For a classifier that reads documents in chunks with a bounded gradient (the AWD-LSTM's BPT3C): how much of
    the training documents it reads (`whole`: every token, no task.max_length), and how many are longer than the
    tokens its gradients reach."""
    window = getattr(config, "classifier_max_len", None)
    if window is None or not lengths:
        return None
    lengths = np.asarray(lengths)
    longer = int((lengths > window).sum())
    reach = f"; gradients reach the encoder through the last {window:,} tokens of each ({longer:,} documents are " \
            "longer: their start is read, not trained through)" if longer else ""
    median = np.median(lengths)
    return (f"the classifier reads {'every token of ' if whole else ''}the {len(lengths):,} training examples (median "
            f"{median:,.0f}, longest {lengths.max():,} tokens{'' if whole else ' as task.max_length leaves them'}), "
            f"{config.classifier_bptt} at a time (BPT3C){reach}")


class BestCheckpoint:
    """Tracks the best dev score (higher is better for every GLUE metric) and the patience left."""

    def __init__(self, metric: str, patience: int | None):
        self.key, self.patience = f"dev_{metric}", patience
        self.step: int | None = None  # step of the best evaluation
        self.scores: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.last_evaluated_step: int | None = None
        self.evaluations_without_gain = 0

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Record an evaluation; True when it is a new best."""
        self.last, self.last_evaluated_step = metrics, step
        if self.step is None or metrics[self.key] > self.scores[self.key]:
            self.step, self.scores, self.evaluations_without_gain = step, metrics, 0
            return True
        self.evaluations_without_gain += 1
        return False

    def state(self) -> dict:
        """What a periodic checkpoint keeps of it, so that keep-best and early stopping continue after a resume."""
        return {"step": self.step, "scores": self.scores, "last": self.last,
                "last_evaluated_step": self.last_evaluated_step,
                "evaluations_without_gain": self.evaluations_without_gain}

    def load_state(self, state: dict) -> None:
        """Continue from `state()` of a stopped run."""
        self.step, self.scores, self.last = state["step"], state["scores"], state["last"]
        self.last_evaluated_step = state["last_evaluated_step"]
        self.evaluations_without_gain = state["evaluations_without_gain"]

    @property
    def patience_exhausted(self) -> bool:
        """True after `patience` evaluations in a row without a new best."""
        return self.patience is not None and self.evaluations_without_gain >= self.patience
