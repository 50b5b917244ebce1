"""Tokenizers trained on the corpus with the `tokenizers` library, saved in Hugging Face format."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from accelerate.utils import broadcast_object_list
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

WORDPIECE_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
END_OF_TEXT, PAD = "<|endoftext|>", "<|pad|>"  # GPT-2's document separator; a pad for fine-tuning batches


def train_wordpiece(
    lines: Iterable[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer learnt from `lines`, with [CLS] A [SEP] (B [SEP]) templates.

    The trainer breaks ties between equally frequent merges in hash-map order, so two trainings on
    the same text can give different vocabularies (huggingface/tokenizers#1794). Train once per run
    (`shared_tokenizer`) and reuse the saved one (`tokenizer.path`) to reproduce a run exactly.
    """
    tokenizer = _bert_pipeline(models.WordPiece(unk_token="[UNK]"), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=WORDPIECE_SPECIAL_TOKENS, show_progress=False
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return _with_bert_templates(tokenizer)


def wordpiece_of_vocabulary(tokens: Iterable[str], lowercase: bool = True) -> PreTrainedTokenizerFast:
    """The tokenizer `train_wordpiece` makes, of a vocabulary given in order (the special tokens go first): the same
    pieces every time, where training breaks ties at random."""
    vocabulary = {token: index for index, token in enumerate(dict.fromkeys([*WORDPIECE_SPECIAL_TOKENS, *tokens]))}
    return _with_bert_templates(_bert_pipeline(models.WordPiece(vocabulary, unk_token="[UNK]"), lowercase))


def _bert_pipeline(model, lowercase: bool) -> Tokenizer:
    """BERT's normalizer, pre-tokenizer and decoder around a WordPiece model."""
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _with_bert_templates(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return wrap_tokenizer(tokenizer)


def train_byte_level_bpe(
    lines: Iterable[str], vocab_size: int, lowercase: bool = False, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE tokenizer learnt from `lines`: any text round-trips, nothing is unknown."""
    tokenizer = Tokenizer(models.BPE())
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    # No space invented before the first word (as GPT-2), so decoding gives back exactly the text encoded.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Fixes offsets only; it adds no special tokens (packing puts <|endoftext|> between documents).
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT, PAD],
        # All 256 bytes from the start, so text unseen in training still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Training does not split off special tokens as encoding does; without this, their literal text in the
    # corpus would spend merges on "<|", "endoftext" and "|>".
    specials = re.compile("|".join(map(re.escape, [END_OF_TEXT, PAD])))
    tokenizer.train_from_iterator((piece for line in lines for piece in specials.split(line) if piece), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=PAD,
        model_max_length=1024,  # GPT-2's context; the stage sets the model's own
        # WordPiece's decode clean-up would turn " ." into "." and break the round trip; saved as off.
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )


def wrap_tokenizer(tokenizer: Tokenizer, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around a `tokenizers` object with BERT's special tokens."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=model_max_length,
        # BERT needs segment ids for sentence pairs; the template sets them.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def shared_tokenizer(accelerator, train: Callable[[], PreTrainedTokenizerFast]) -> PreTrainedTokenizerFast:
    """Train on the main process only and send the result to the others, so every rank uses the same ids."""
    payload = [train() if accelerator.is_main_process else None]
    if accelerator.num_processes > 1:
        # The whole tokenizer travels (pickled, its backend as JSON), so it keeps its own special tokens.
        payload = broadcast_object_list(payload, from_process=0)
    tokenizer = payload[0]
    assert tokenizer is not None  # trained by the main process (the only one, or broadcast from it to the others)
    return tokenizer
