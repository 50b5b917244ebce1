"""`finetune pretrain`: a masked (bert) or causal (gpt2, awd_lstm) language model trained on raw text.

setup (text, tokenizer, model) -> data (packed blocks or BPTT streams) -> train (epochs of the shared
loop, periodic checkpoints) -> save (HF checkpoint). `resume=True` continues from the newest
periodic checkpoint of the run directory, bit for bit as if the run had not stopped.

The n-gram baseline (ngram) shares the setup, the data and gpt2's validation blocks, then counts instead of
training (`run_ngram`): one pass over the training text, one validation, the same save.

`segment_validation` (inference/language_model_validation.py) validates a saved gpt2-family model at other segment and
memory lengths than it trained with (Transformer-XL's evaluation at a longer context).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from accelerate.data_loader import prepare_data_loader
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from finetune.console import console
from finetune.data.causal import BPTTBatches, NextTokenBlocks
from finetune.data.corpus import MaskedBlocks, read_documents
from finetune.data.masking import MaskingRule
from finetune.data.pretraining_text import PretrainingText, SingleDocumentError, StreamNeed, pretraining_text
from finetune.data.reverse import mark_backwards, pretraining_direction, read_backwards
from finetune.data.sampling import ResumableSampler
from finetune.data.streaming import StreamedBatches, StreamedDocuments
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.data.token_cache import tokenize_corpus
from finetune.data.tokenizers import shared_tokenizer
from finetune.errors import UserError, recipe_key
from finetune.inference.language_model_validation import validation_metrics
from finetune.models.adapters import attach_adapter, trainable_groups
from finetune.models.families import LanguageModelFamily, family_of
from finetune.models.hub import load_tokenizer
from finetune.models.language_models import load_language_model, loss_module
from finetune.models.sizes import TRAINING_BYTES_PER_PARAMETER, language_model_parameters, physical_memory_bytes
from finetune.recipes import PretrainRecipe
from finetune.recipes.pretrain import NGramModelConfig
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
from finetune.stages.ngram_floor import count_ngram_model, ngram_floor
from finetune.training.checkpoints import latest_training_checkpoint, save_checkpoint
from finetune.training.driver import RunContext, TrainingSetup, TrainingStage, processes_ready, run_training
from finetune.training.loop import make_accelerator
from finetune.training.optim import build_optimizer, discriminative_lrs


@guarded_stage
def run_pretrain(recipe: PretrainRecipe, resume: bool = False) -> Path:
    """Run the whole stage; returns the checkpoint folder."""
    if family_of(recipe.model).counted:  # no model to build, no optimizer, no training loop
        if resume:
            raise UserError("--resume: an ngram run counts in one pass and saves no periodic checkpoints; run it again")
        return run_ngram(recipe)
    return run_training(PretrainStage(recipe), resume)


class PretrainStage(TrainingStage):
    """A language model trained on raw text: masked blocks (bert), next-token blocks (gpt2) or BPTT batches read in
    order (awd_lstm, gpt2 with Transformer-XL memory), each with its carried state."""

    def check(self) -> None:
        check_model_fits_in_memory(self.recipe)

    def create_accelerator(self):
        return make_accelerator(self.recipe.training, run_dir=self.recipe.run_dir)

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
        lrs = discriminative_lrs(len(groups), recipe.training.lr, recipe.discriminative.factor)
        optimizer = build_optimizer(model, groups, lrs, recipe.training.weight_decay, recipe.training.adam_betas)
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
            self.model, optimizer, train_loader, self._loss, "tokens", self.tokenizer, saved_model=self._saved_model
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

    def before_epoch(self, epoch: int, step: int, batches_done: int) -> None:
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

    def end_of_epoch(self, epoch: int, step: int, record: dict) -> None:
        accuracy = self.family.accuracy_name
        console.print(
            f"epoch {epoch + 1}: validation loss {record['validation_loss']:.4f}, perplexity "
            f"{record['validation_perplexity']:.1f}, {accuracy.replace('_', ' ')} {record[accuracy]:.3f}"
        )

    def finish(self, context: RunContext, step: int) -> Path:
        return save_language_model(self.accelerator, self._saved_model(), self.tokenizer, self.recipe, context.run_dir)


class LanguageModelData(NamedTuple):
    """What pretraining reads: the tokenizer, the training data in the family's layout, validation blocks."""

    tokenizer: Any
    train: Any
    validation: Any
    train_tokens: TokenizedDocuments | None  # None for a stream
    validation_tokens: TokenizedDocuments | None
    continued: Any  # the model whose pretraining continues, or None
    max_positions: int | None
    backwards: bool


def read_language_model_data(recipe: PretrainRecipe, accelerator, resume_from: Path | None) -> LanguageModelData:
    """Text -> tokenizer -> token ids (cached) -> training and validation data, and the model continued if any."""
    family, corpus = family_of(recipe.model), recipe.corpus
    streaming = corpus.streaming  # a `datasets` stream, tokenised on the fly (data/streaming.py)
    text, stream = None, None
    if streaming:
        assert corpus.dataset is not None  # the recipe streams a `datasets` corpus only
        stream = StreamedDocuments.open(
            corpus.dataset, corpus.dataset_config, "train", corpus.text_column, corpus.dataset_files
        )
    else:
        text = read_corpus(recipe)
    checkpoint = recipe.model.checkpoint
    with recipe_key("model.checkpoint"):
        continued = load_language_model(recipe.model) if checkpoint is not None else None
    # A backward LM (corpus.reverse, or continuing one) reads every document's ids reversed (data/reverse.py).
    with recipe_key("corpus.reverse"):
        backwards = pretraining_direction(
            corpus.reverse, continued.config if continued is not None else None, checkpoint
        )
    max_positions = model_positions(recipe, family, continued)
    tokenizer = pretraining_tokenizer(recipe, accelerator, text, continued, resume_from)
    if continued is not None and recipe.tokenizer.new_vocabulary:  # resuming too: the saved state has the new rows
        # ULMFiT: old rows kept, new words at the mean
        from finetune.models.awd_lstm import AWDLSTMPreTrainedModel, with_new_vocabulary

        # new_vocabulary is awd_lstm's (the recipe refuses it for the others), which loads an AWD-LSTM checkpoint.
        assert checkpoint is not None and isinstance(continued, AWDLSTMPreTrainedModel)
        with recipe_key("model.checkpoint"):
            old_tokenizer = load_tokenizer(checkpoint)
        continued = with_new_vocabulary(continued, old_tokenizer.get_vocab(), tokenizer.get_vocab())
    # An LSTM or an n-gram model reads any length: no maximum, so that transformers never warns of one.
    tokenizer.model_max_length = max_positions if max_positions is not None else VERY_LARGE_INTEGER
    if stream is not None:
        train, validation = streamed_data(recipe, tokenizer, stream, accelerator, backwards)
        return LanguageModelData(tokenizer, train, validation, None, None, continued, max_positions, backwards)
    assert text is not None  # read above when the corpus is not streamed
    with accelerator.main_process_first():  # the main process fills the cache, the others then map it
        train_tokens, validation_tokens = text.tokenize(
            tokenizer, corpus.cache_dir, show_progress=accelerator.is_main_process
        )
    if backwards:  # a view of the cached forward ids
        train_tokens, validation_tokens = read_backwards(train_tokens), read_backwards(validation_tokens)
    train, validation = language_model_data(recipe, tokenizer, train_tokens, validation_tokens, accelerator)
    console.print(
        f"{recipe.model.family}: {train_tokens.token_count:,} training and {validation_tokens.token_count:,} "
        f"validation tokens{' (read backwards)' if backwards else ''}, in {len(train):,} and "
        f"{len(validation):,} {'batches' if family.reads_bptt_batches(recipe.model) else 'blocks'} of "
        f"{corpus.block_size} tokens"
    )
    return LanguageModelData(
        tokenizer, train, validation, train_tokens, validation_tokens, continued, max_positions, backwards
    )


def model_positions(recipe: PretrainRecipe, family: LanguageModelFamily, continued) -> int | None:
    """The position table's size of the model trained (None: an LSTM or an n-gram model has none); a continued
    transformer's own, which the blocks must fit."""
    max_positions = family.max_positions(recipe.model, recipe.corpus.block_size, continued)
    if continued is not None and max_positions is not None and recipe.corpus.block_size > max_positions:
        raise UserError(
            f"corpus.block_size {recipe.corpus.block_size} exceeds the {max_positions} positions "
            f"of {recipe.model.checkpoint}"
        )
    return max_positions


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


def read_corpus(recipe: PretrainRecipe) -> PretrainingText:
    """The training and validation text: a dataset or a task's text read now, text files only named (streamed
    when a tokenizer is trained on them or they are tokenised; not read at all when their ids are cached); a text
    too short for the layout by its size alone is refused now, before any tokenising."""
    return pretraining_text(recipe.corpus, recipe.seed, stream_needs(recipe))


def stream_needs(recipe: PretrainRecipe) -> tuple[StreamNeed, StreamNeed]:
    """The fewest tokens (a separator after each document included) the training text (a batch; ngram: a block)
    and the validation text (a block, or a BPTT row) give in the layout `language_model_data` builds."""
    block_size, batch_size, family = recipe.corpus.block_size, recipe.training.batch_size, family_of(recipe.model)
    if family.reads_bptt_batches(recipe.model):  # rows of at least bptt + 1 tokens (inputs and their next tokens)
        row, blocks = block_size + 1, batch_size
        what = "BPTT row"
    else:  # bert: [CLS] and block_size - 1 tokens of text; gpt2: block_size + 1 (the last one only a label)
        row = family.block_text_tokens(block_size)
        blocks = 1 if family.counted else batch_size  # an n-gram model is counted, not batched
        what = "block"
    keys = f"training.batch_size {batch_size}, corpus.block_size {block_size}"
    return (
        StreamNeed(blocks * row, f"{blocks} {what}{'s' * (blocks > 1)} of {row} tokens of text ({keys})"),
        StreamNeed(row, f"one {what} of {row} tokens of text (corpus.block_size {block_size})"),
    )


def streamed_validation_tokens(recipe: PretrainRecipe, tokenizer, documents: StreamedDocuments, accelerator):
    """A stream's validation text, tokenised in memory: the stream's first `validation_documents`, a split of the
    dataset, or validation files."""
    corpus = recipe.corpus
    if corpus.validation_documents is not None:
        texts = list(itertools.islice(documents(), corpus.validation_documents))
    elif corpus.validation_split is not None:  # read whole: a validation split is small beside the training text
        assert corpus.dataset is not None  # the recipe streams a `datasets` corpus only
        texts = list(
            StreamedDocuments.open(
                corpus.dataset, corpus.dataset_config, corpus.validation_split, corpus.text_column, corpus.dataset_files
            )()
        )
    else:
        texts = read_documents(corpus.validation_files)
    with accelerator.main_process_first():
        return tokenize_corpus(
            tokenizer,
            texts,
            corpus.cache_dir,
            "tokenizing the validation text",
            show_progress=accelerator.is_main_process,
            name="the validation text",
        )


def streamed_data(
    recipe: PretrainRecipe, tokenizer, documents: StreamedDocuments, accelerator, backwards: bool = False
):
    """A stream's training batches (bert or gpt2 layout) and the validation blocks (`streamed_validation_tokens`);
    `backwards`: every document read backwards."""
    corpus, family, training = recipe.corpus, family_of(recipe.model), recipe.training
    assert training.max_steps is not None  # the recipe asks a stream for training.max_steps
    validation_tokens = streamed_validation_tokens(recipe, tokenizer, documents, accelerator)
    if backwards:
        validation_tokens = read_backwards(validation_tokens)
    separator = family.separator_id(tokenizer)
    with recipe_key("masking.whole_word"):  # the one setting for_tokenizer can refuse
        rule = MaskingRule.for_tokenizer(tokenizer, recipe.masking) if family.masked else None
    start_id = family.block_start_id(tokenizer)
    train = StreamedBatches(
        documents,
        tokenizer,
        separator,
        corpus.block_size,
        training.batch_size,
        training.max_steps * training.gradient_accumulation_steps,
        recipe.seed,
        rule,
        start_id,
        held_out=corpus.validation_documents or 0,
        process_index=accelerator.process_index,
        num_processes=accelerator.num_processes,
        backwards=backwards,
    )
    blocks = PackedBlocks(
        DocumentStream(validation_tokens, separator),
        corpus.block_size + (start_id is None),
        start_id,
        "the validation text",
    )
    validation = (
        MaskedBlocks(blocks, rule, recipe.seed + 1, fixed_masks=True) if rule is not None else NextTokenBlocks(blocks)
    )
    console.print(
        f"{recipe.model.family}: streaming {documents.label} into {len(train):,} batches of "
        f"{training.batch_size} blocks of {corpus.block_size} tokens per process; "
        f"{validation_tokens.token_count:,} validation tokens in {len(validation):,} blocks"
    )
    return train, validation


def pretraining_tokenizer(recipe: PretrainRecipe, accelerator, text: PretrainingText | None, continued, resume_from):
    """The run's tokenizer: the resumed checkpoint's, the continued model's, a reused one, or one trained here."""
    family = family_of(recipe.model)
    if resume_from is not None:  # training a tokenizer twice can give other ids: always take the saved one
        with recipe_key("--resume"):
            return load_tokenizer(str(resume_from))
    checkpoint = recipe.model.checkpoint
    if continued is not None and not recipe.tokenizer.new_vocabulary:
        assert checkpoint is not None  # `continued` is the model loaded from it
        with recipe_key("model.checkpoint"):
            tokenizer = load_tokenizer(checkpoint)
            family.check_tokenizer(tokenizer, checkpoint)
        if len(tokenizer) > continued.config.vocab_size:
            raise UserError(
                f"model.checkpoint: the tokenizer of {checkpoint} has {len(tokenizer)} "
                f"tokens, the model only {continued.config.vocab_size}"
            )
        return tokenizer
    if recipe.tokenizer.path is not None:
        with recipe_key("tokenizer.path"):
            tokenizer = load_tokenizer(str(recipe.tokenizer.path))
            family.check_tokenizer(tokenizer, str(recipe.tokenizer.path))
        return tokenizer

    def train():
        # A stream has no text here: the recipe gives it tokenizer.path or model.checkpoint (a tokenizer returned above;
        # new_vocabulary is awd_lstm's, which is never streamed).
        assert text is not None
        count = len(text.split()[0]) if text.held_out else text.document_count()
        console.print(
            f"training a {family.tokenizer_kind} tokenizer ({recipe.tokenizer.vocab_size} pieces) on "
            f"{count:,} documents"
        )
        return family.train_tokenizer(text.tokenizer_training_documents(), recipe.tokenizer)

    return shared_tokenizer(accelerator, train)


def language_model_data(
    recipe: PretrainRecipe,
    tokenizer,
    train_tokens: TokenizedDocuments,
    validation_tokens: TokenizedDocuments,
    accelerator,
):
    """Training and validation datasets in the family's layout (masked blocks, next-token blocks, BPTT batches)."""
    family, block_size = family_of(recipe.model), recipe.corpus.block_size
    bptt = family.reads_bptt_batches(recipe.model)
    separator = family.separator_id(tokenizer)
    names = ("the training text", "the validation text")
    both = list(zip((train_tokens, validation_tokens), names))
    train: MaskedBlocks | NextTokenBlocks | BPTTBatches
    validation: MaskedBlocks | NextTokenBlocks | BPTTBatches
    if family.masked:
        with recipe_key("masking.whole_word"):  # the one setting for_tokenizer can refuse
            rule = MaskingRule.for_tokenizer(tokenizer, recipe.masking)
        # Blocks are cut from the (memory-mapped) ids as they are read: no copy of the corpus is made.
        blocks = [
            PackedBlocks(DocumentStream(tokens, separator), block_size, family.block_start_id(tokenizer), name)
            for tokens, name in both
        ]
        # Validation keeps the same masks at every evaluation so that its loss is comparable over time.
        train, validation = (
            MaskedBlocks(blocks[0], rule, recipe.seed),
            MaskedBlocks(blocks[1], rule, recipe.seed + 1, fixed_masks=True),
        )
    elif not bptt:  # gpt2 blocks; ngram: counted on the whole stream, validated on gpt2's blocks
        train, validation = (
            NextTokenBlocks(PackedBlocks(DocumentStream(tokens, separator), block_size + 1, name=name))
            for tokens, name in both
        )
    else:
        split = {"process_index": accelerator.process_index, "num_processes": accelerator.num_processes}
        train = BPTTBatches(
            train_tokens,
            separator,
            recipe.training.batch_size,
            block_size,
            recipe.seed,
            shuffle=True,
            name=names[0],
            **split,
        )
        rows = BPTTBatches.rows_that_fit(
            validation_tokens, block_size, accelerator.num_processes, recipe.training.batch_size
        )
        validation = BPTTBatches(
            validation_tokens, separator, rows, block_size, recipe.seed, shuffle=False, name=names[1], **split
        )
    if not family.counted and not bptt and len(train) < recipe.training.batch_size:
        raise UserError(
            f"the corpus gives {len(train)} training blocks, "
            f"fewer than training.batch_size={recipe.training.batch_size}"
        )
    return train, validation


def data_loaders(
    recipe: PretrainRecipe, train_data, validation_data, train_order: ResumableSampler | None
) -> tuple[DataLoader, DataLoader]:
    """Batches of blocks in `train_order`, or the BPTT batches in order (each item is already a batch), or a
    stream's batches (no order: None)."""
    # Starting a loader's iteration draws a seed for its workers from the loader's generator; a private one
    # leaves the global random state (dropout) untouched, so a resumed run draws the same dropout masks.
    common: dict[str, Any] = {
        "num_workers": recipe.training.num_workers,
        "generator": torch.Generator().manual_seed(recipe.seed),
    }
    if train_order is None:
        return (
            DataLoader(train_data, batch_size=None, **common),
            DataLoader(validation_data, batch_size=recipe.training.batch_size, **common),
        )
    if family_of(recipe.model).reads_bptt_batches(recipe.model):
        return (
            DataLoader(train_data, batch_size=None, sampler=train_order, **common),
            DataLoader(validation_data, batch_size=None, **common),
        )
    return (
        DataLoader(train_data, batch_size=recipe.training.batch_size, drop_last=True, sampler=train_order, **common),
        DataLoader(validation_data, batch_size=recipe.training.batch_size, **common),
    )


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
