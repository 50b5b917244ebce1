"""`finetune pretrain`: a masked (bert) or causal (gpt2, awd_lstm) language model trained on raw text.

setup (text, tokenizer, model) -> data (packed blocks or BPTT streams) -> train (epochs of the shared
loop, periodic checkpoints) -> save (HF checkpoint). `resume=True` continues from the newest
periodic checkpoint of the run directory, bit for bit as if the run had not stopped.

The n-gram baseline (ngram) shares the setup, the data and gpt2's validation blocks, then counts instead of
training (`run_ngram`): one pass over the training text, one validation, the same save.

What it reads and in which layout (text, tokenizer, token ids, blocks or batches, loaders): stages/pretrain_data.py.
`segment_validation` (inference/language_model_validation.py) validates a saved gpt2-family model at other segment and
memory lengths than it trained with (Transformer-XL's evaluation at a longer context).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

from accelerate.data_loader import prepare_data_loader
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from finetune.console import console
from finetune.data.pretraining_text import SingleDocumentError
from finetune.data.reverse import mark_backwards
from finetune.data.sampling import ResumableSampler
from finetune.errors import UserError, recipe_key
from finetune.inference.language_model_validation import validation_metrics
from finetune.models.adapters import attach_adapter, trainable_groups
from finetune.models.families import family_of
from finetune.models.language_models import loss_module
from finetune.models.sizes import TRAINING_BYTES_PER_PARAMETER, language_model_parameters, physical_memory_bytes
from finetune.recipes import PretrainRecipe
from finetune.recipes.language_models import NGramModelConfig
from finetune.reporting.finish import finish_run
from finetune.reporting.model_card import language_model_card, write_card
from finetune.reporting.trackers import start_trackers
from finetune.run_dir import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    MetricsLog,
    check_run_dir_free,
    guarded_stage,
    prepare_run_dir,
    read_metrics,
)
from finetune.stages.head_warmup import head_warmup_phase, may_warm_up
from finetune.stages.ngram_floor import count_ngram_model, ngram_floor
from finetune.stages.pretrain_data import data_loaders, read_language_model_data
from finetune.training.checkpoints import latest_training_checkpoint, save_checkpoint
from finetune.training.driver import RunContext, TrainingJob, TrainingSetup, processes_ready, run_training
from finetune.training.loop import make_accelerator
from finetune.training.optim import training_optimizer


@guarded_stage
def run_pretrain(recipe: PretrainRecipe, resume: bool = False) -> Path:
    """Run the whole stage; returns the checkpoint folder."""
    if family_of(recipe.model).counted:  # no model to build, no optimizer, no training loop
        if resume:
            raise UserError("--resume: an ngram run counts in one pass and saves no periodic checkpoints; run it again")
        return run_ngram(recipe)
    return run_training(Pretraining(recipe), resume)


class Pretraining(TrainingJob):
    """A language model trained on raw text: masked blocks (bert), next-token blocks (gpt2) or BPTT batches read in
    order (awd_lstm, gpt2 with Transformer-XL memory), each with its carried state."""

    def check(self) -> None:
        check_model_fits_in_memory(self.recipe)

    def create_accelerator(self):
        # The head's warm-up freezes the rest of the model after DDP has wrapped it.
        return make_accelerator(
            self.recipe.training, parameters_change_trainability=may_warm_up(self.recipe), run_dir=self.recipe.run_dir
        )

    def setup(self, accelerator, resume_from: Path | None) -> TrainingSetup:
        recipe = self.recipe
        self.accelerator, self.streaming = accelerator, recipe.corpus.streaming
        with recipe_key("corpus.document", SingleDocumentError):
            data = read_language_model_data(recipe, accelerator, resume_from)
        self.family = family_of(recipe.model)  # a continued checkpoint's config.json is stored here by now
        # awd_lstm, or gpt2 with Transformer-XL memory: batches read in order, each row continuing the one before.
        self.bptt = self.family.reads_bptt_batches(recipe.model)
        self.tokenizer, self.train_data, self.validation_tokens = data.tokenizer, data.train, data.validation_tokens
        self.train_tokens = data.train_tokens
        language_model = (
            data.continued
            if data.continued is not None
            else self.family.build(recipe.model, data.tokenizer, data.max_positions)
        )
        if data.backwards:  # config.json says so: fine-tuning, eval and predict then read text backwards too
            mark_backwards(language_model.config)
        # One parameter group per layer group, each with its discriminative LR; with an adapter, what it trains.
        groups = self.family.layer_groups(language_model)
        self.adapter = self._attach_adapter(language_model, groups)
        if self.adapter is not None:
            groups = trainable_groups(self.family.layer_groups(language_model))
        model = loss_module(recipe.model, language_model)  # awd_lstm: with the recipe's AR/TAR weights
        optimizer = training_optimizer(model, groups, recipe)
        warmup = head_warmup_phase(recipe, language_model, groups, self.family.masked)  # a fresh head first alone
        # The training order is a pure function of (seed, epoch), so `--resume` can start mid-epoch; BPTT batches
        # must be read in order (each row continues the one before); a stream orders itself (data/streaming.py).
        self.order = (
            None if self.streaming else ResumableSampler(len(self.train_data), recipe.seed, shuffle=not self.bptt)
        )
        train_loader, validation_loader = data_loaders(recipe, self.train_data, data.validation, self.order)
        if self.bptt or self.streaming:  # batches already split per process: only the model goes to accelerate
            self.model, optimizer = accelerator.prepare(model, optimizer)
        else:
            self.model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
        if not self.bptt:
            # Validation blocks shared out without accelerate's repeats to even the processes out (they would count
            # twice in the validation loss); validation_metrics sums over however many each process gets.
            validation_loader = prepare_data_loader(
                validation_loader,
                num_processes=accelerator.num_processes,
                process_index=accelerator.process_index,
                even_batches=False,
            )
        self.train_loader, self.validation_loader = train_loader, validation_loader
        return TrainingSetup(
            self.model,
            optimizer,
            train_loader,
            self._loss,
            "tokens",
            self.tokenizer,
            saved_model=self._saved_model,
            warmup=warmup,
        )

    def _attach_adapter(self, language_model, groups):
        """model.adapter on the continued checkpoint, in place (models/adapters.py); None without one."""
        adapter, checkpoint = getattr(self.recipe.model, "adapter", None), self.recipe.model.checkpoint
        if adapter is None:
            return None
        with recipe_key("model.adapter"):
            adapted, summary = attach_adapter(language_model, adapter, groups, checkpoint)
        console.print(summary, markup=False, highlight=False, soft_wrap=True)
        return adapted

    def _saved_model(self):
        """What a checkpoint holds: the language model, or with an adapter the PeftModel (adapter and head)."""
        return self.adapter if self.adapter is not None else self.accelerator.unwrap_model(self.model).language_model

    def _loss(self, model, batch):
        input_ids = batch["input_ids"].to(self.accelerator.device)
        loss, labelled, _ = model(input_ids, batch["labels"].to(self.accelerator.device))
        return loss, labelled, input_ids.numel()

    def start(self, context: RunContext) -> None:
        if self.recipe.ngram_floor is not None and not context.resumed:  # a resumed run logged it when it started
            # Token arrays, not a stream: the recipe refuses ngram_floor with corpus.streaming.
            assert self.train_tokens is not None and self.validation_tokens is not None
            context.log.write(
                ngram_floor(
                    self.recipe.ngram_floor,
                    self.accelerator,
                    self.tokenizer,
                    self.train_tokens,
                    self.validation_tokens,
                    self.recipe.corpus.block_size,
                    self.recipe.training.batch_size,
                )
            )

    def carried_tensors(self) -> dict:
        return self.accelerator.unwrap_model(self.model).carried_state()

    def restore_carried(self, tensors: dict) -> None:
        self.accelerator.unwrap_model(self.model).restore_carried_state(tensors)

    def on_epoch_begin(self, loop, control, epoch: int, batches_done: int) -> None:
        self.train_data.set_epoch(epoch)  # new masks (bert), a new document order (awd_lstm)
        if hasattr(self.train_loader, "set_epoch"):  # accelerate's loader counts epochs too, and tells the sampler
            self.train_loader.set_epoch(epoch)
        if self.order is None:  # a stream: the whole run is one epoch of max_steps steps
            self.train_data.skip(batches_done)
            return
        self.order.set_epoch(epoch)
        if self.bptt:  # each item of the order is a whole BPTT batch of every process
            self.order.skip(batches_done)
        else:
            self.order.skip_batches(batches_done, self.recipe.training.batch_size, self.accelerator.num_processes)

    def evaluate(self) -> tuple[dict, dict]:
        return validation_metrics(self.accelerator, self.model, self.validation_loader, self.family.accuracy_name), {}

    def on_epoch_end(self, loop, control, epoch: int, record: dict) -> None:
        accuracy = self.family.accuracy_name
        console.print(
            f"epoch {epoch + 1}: validation loss {record['validation_loss']:.4f}, perplexity "
            f"{record['validation_perplexity']:.1f}, {accuracy.replace('_', ' ')} {record[accuracy]:.3f}"
        )

    def finish(self, context: RunContext, step: int) -> Path:
        return save_language_model(self.accelerator, self._saved_model(), self.tokenizer, self.recipe, context.run_dir)


def save_language_model(accelerator, language_model, tokenizer, recipe: PretrainRecipe, run_dir: Path) -> Path:
    """The final checkpoint with its model card; returns the checkpoint folder."""
    checkpoint = run_dir / CHECKPOINT_DIR
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_checkpoint(language_model, tokenizer, checkpoint, recipe)
        card = language_model_card(recipe, read_metrics(run_dir / METRICS_FILE), language_model.config)
        write_card(card, checkpoint)  # README.md
        console.print(f"checkpoint saved to {checkpoint}")
    return checkpoint


class CountingPass(NamedTuple):
    """What `finish_run` reads of a training loop, for a model that is counted instead: its start, no steps."""

    started: float
    step: int = 0


def run_ngram(recipe: PretrainRecipe) -> Path:
    """The n-gram baseline: every n-gram of the training stream (documents and separators, as the causal families
    read it) counted in one pass, then scored on gpt2's validation blocks by `validation_metrics`, and saved."""
    check_run_dir_free(recipe, latest_training_checkpoint)
    accelerator = processes_ready(make_accelerator(recipe.training, run_dir=recipe.run_dir))
    if accelerator.num_processes > 1:
        raise UserError("model.family ngram counts in one process: run it without accelerate launch or torchrun")
    set_seed(recipe.seed)
    with recipe_key("corpus.document", SingleDocumentError):
        data = read_language_model_data(recipe, accelerator, None)
    counting = CountingPass(time.perf_counter())
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)  # every input is read: only now
    log = MetricsLog(run_dir / METRICS_FILE, accelerator.is_main_process, start_trackers(accelerator, recipe, run_dir))
    # run_pretrain counts the counted family only; an ngram corpus is never streamed (the recipe refuses it).
    assert isinstance(recipe.model, NGramModelConfig) and data.train_tokens is not None
    # At least one block long (language_model_data checked): longer than any order.
    order = recipe.model.order
    ngram = count_ngram_model(data.train_tokens, data.tokenizer, order, "")
    table_sizes = ngram.config.table_sizes
    assert table_sizes is not None  # NGramForCausalLM.count fills it in
    console.print(
        f"ngram: {', '.join(f'{size:,}' for size in table_sizes)} distinct n-grams of order "
        f"1-{order} in {ngram.config.training_tokens:,} tokens, counted in "
        f"{time.perf_counter() - counting.started:.1f} s"
    )
    validation_loader = DataLoader(data.validation, batch_size=recipe.training.batch_size)
    model = loss_module(recipe.model, ngram.to(accelerator.device))
    metrics = validation_metrics(accelerator, model, validation_loader, family_of(recipe.model).accuracy_name)
    log.write({"phase": "eval", "step": 0, "epoch": 0, **metrics})
    console.print(
        f"validation loss {metrics['validation_loss']:.4f}, perplexity "
        f"{metrics['validation_perplexity']:.1f}, next token accuracy {metrics['next_token_accuracy']:.3f}"
    )
    checkpoint = save_language_model(accelerator, ngram, data.tokenizer, recipe, run_dir)
    finish_run(accelerator, run_dir, counting)  # trackers closed, timing.json, RUN_DIR/plots/*.png
    return checkpoint


def check_model_fits_in_memory(recipe) -> None:
    """Refuse a new model whose weights, gradients and optimizer state alone exceed this machine's memory (named by
    its recipe sizes: the check is the stage's, the counting models/sizes.py's)."""
    model = recipe.model
    if model.checkpoint is not None:  # its sizes come from a checkpoint that was loaded once already
        return
    memory = physical_memory_bytes()
    if memory is None:
        return
    vocabulary = recipe.tokenizer.vocab_size  # an upper bound: a trained tokenizer has at most this many pieces
    parameters = language_model_parameters(
        model, vocabulary, family_of(model).max_positions(model, recipe.corpus.block_size)
    )
    needed = parameters * TRAINING_BYTES_PER_PARAMETER
    if needed > memory:
        sizes = ", ".join(
            f"model.{key}={getattr(model, key)}"
            for key in ("layers", "hidden", "embedding_size", "intermediate", "max_positions")
            if getattr(model, key, None) is not None
        )
        raise UserError(
            f"{sizes} ask for ~{parameters / 1e9:,.1f} billion parameters, ~{needed / 2**30:,.0f} GiB "
            f"with gradients and AdamW state; this machine has {memory / 2**30:,.0f} GiB: choose "
            "smaller sizes"
        )
