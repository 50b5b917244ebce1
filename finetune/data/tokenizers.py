"""Tokenizers trained on the corpus with the `tokenizers` library, saved in Hugging Face format."""

from __future__ import annotations

from typing import Callable, Iterable

from accelerate.utils import broadcast_object_list
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

WORDPIECE_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece(lines: Iterable[str], vocab_size: int, lowercase: bool = True,
                    min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer learnt from `lines`, with [CLS] A [SEP] (B [SEP]) templates.

    The trainer breaks ties between equally frequent merges in hash-map order, so two trainings on
    the same text can give different vocabularies (huggingface/tokenizers#1794). Train once per run
    (`shared_tokenizer`) and reuse the saved one (`tokenizer.path`) to reproduce a run exactly.
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=WORDPIECE_SPECIAL_TOKENS,
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return wrap_tokenizer(tokenizer)


def wrap_tokenizer(tokenizer: Tokenizer, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around a `tokenizers` object with BERT's special tokens."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=model_max_length,
        # BERT needs segment ids for sentence pairs; the template sets them.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def shared_tokenizer(accelerator, train: Callable[[], PreTrainedTokenizerFast]) -> PreTrainedTokenizerFast:
    """Train on the main process only and send the result to the others, so every rank uses the same ids."""
    payload = [train().backend_tokenizer.to_str() if accelerator.is_main_process else None]
    if accelerator.num_processes > 1:
        payload = broadcast_object_list(payload, from_process=0)
    return wrap_tokenizer(Tokenizer.from_str(payload[0]))

