"""The pretrain stage's data: the text read (files, a dataset or a stream), the tokenizer (trained, reused or the
continued model's), the token ids (cached) and the training and validation data in the family's layout (masked blocks,
next-token blocks, BPTT batches, streamed batches) with their loaders. stages/pretrain.py trains on what it returns."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from finetune.console import console
from finetune.data.causal import BPTTBatches, NextTokenBlocks
from finetune.data.corpus import MaskedBlocks, read_documents
from finetune.data.masking import MaskingRule
from finetune.data.pretraining_text import PretrainingText, StreamNeed, pretraining_text
from finetune.data.reverse import pretraining_direction, read_backwards
from finetune.data.sampling import ResumableSampler
from finetune.data.streaming import StreamedBatches, StreamedDocuments
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.data.token_cache import tokenize_corpus
from finetune.data.tokenizers import shared_tokenizer
from finetune.errors import UserError, recipe_key
from finetune.models.families import family_of
from finetune.models.family_classes import LanguageModelFamily
from finetune.models.hub import load_tokenizer
from finetune.models.language_models import load_language_model
from finetune.recipes import PretrainRecipe


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
