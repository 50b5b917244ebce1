"""Tiny checkpoints of every Hugging Face family issue 41 names, built offline from transformers' config classes.

`save_tiny_checkpoint(folder, model_type, head)` writes a Hugging Face folder (config.json, model.safetensors and a
tokenizer with the special tokens the family's own checkpoints carry), seeded, so that tests of continued
pretraining, fine-tuning and adapters run on every family without downloading anything.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

# Masked-LM families (AutoModelForMaskedLM) and causal-LM families (AutoModelForCausalLM) the toolkit supports.
MASKED_FAMILIES = (
    "bert",
    "roberta",
    "xlm-roberta",
    "deberta-v2",
    "modernbert",
    "distilbert",
    "albert",
    "mpnet",
    "electra",
)
CAUSAL_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gemma", "phi", "opt", "gpt_neox")

HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 32, 2, 2, 64, 64

# Sizes by each config class's own argument names (most families use BERT's names).
_COMMON = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE,
    max_position_embeddings=POSITIONS,
)
_SIZES: dict[str, dict[str, Any]] = {
    "bert": _COMMON,
    "roberta": _COMMON,
    "xlm-roberta": _COMMON,
    "deberta-v2": _COMMON | dict(relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"]),
    "modernbert": _COMMON | dict(global_attn_every_n_layers=1, local_attention=16),
    "distilbert": dict(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=INTERMEDIATE, max_position_embeddings=64),
    "albert": _COMMON | dict(embedding_size=16),
    "mpnet": _COMMON,
    "electra": _COMMON | dict(embedding_size=16),
    "gpt2": dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS),
    "llama": _COMMON | dict(num_key_value_heads=1),
    "mistral": _COMMON | dict(num_key_value_heads=1, sliding_window=None),
    "qwen2": _COMMON | dict(num_key_value_heads=1),
    "gemma": _COMMON | dict(num_key_value_heads=1, head_dim=16),
    "phi": _COMMON,
    "opt": dict(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        ffn_dim=INTERMEDIATE,
        word_embed_proj_dim=HIDDEN,
        max_position_embeddings=POSITIONS,
    ),
    "gpt_neox": _COMMON | dict(rotary_pct=0.5),
}
# The special tokens of the family's real tokenizers: BERT's, or RoBERTa's / a decoder's <s> </s> style.
_BERT_TOKENS = dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
_ROBERTA_TOKENS = dict(
    bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", cls_token="<s>", sep_token="</s>",
    mask_token="<mask>",
)  # fmt: skip
_DECODER_TOKENS = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")  # no pad: as Llama's and GPT-2's
_TOKENS = {
    "bert": _BERT_TOKENS,
    "distilbert": _BERT_TOKENS,
    "electra": _BERT_TOKENS,
    "albert": dict(_BERT_TOKENS),
    "modernbert": _BERT_TOKENS,
    # Qwen2's tokenizer class pads with <|endoftext|>, which is also its end of text (no bos)
    "qwen2": dict(eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<unk>"),
}
_WORDPIECE = ("bert", "distilbert", "electra", "albert", "modernbert")

WORDS = [
    "the",
    "film",
    "plot",
    "acting",
    "music",
    "ending",
    "story",
    "cast",
    "script",
    "was",
    "really",
    "very",
    "quite",
    "so",
    "great",
    "lovely",
    "awful",
    "boring",
    "dull",
]


def tiny_text(lines: int = 200, seed: int = 1) -> list[str]:
    """Short generated sentences, the corpus every tiny tokenizer is trained on."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) + " ." for _ in range(lines)]


def tiny_tokenizer(model_type: str):
    """A fast tokenizer with the special tokens of the family's real ones (WordPiece for BERT's kind, byte-level
    BPE otherwise); decoders have no pad token, as Llama's and GPT-2's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = _TOKENS.get(model_type, _DECODER_TOKENS if model_type in CAUSAL_FAMILIES else _ROBERTA_TOKENS)
    names = list(dict.fromkeys(special.values()))
    if model_type in _WORDPIECE:
        # Written, not trained: the WordPiece trainer breaks ties in hash-map order, so each process got another
        # vocabulary (and another model). Its characters, alone and as ##continuations, then every word.
        characters = sorted(set("".join(WORDS)) | {"."})
        pieces = [*names, *characters, *(f"##{character}" for character in characters), *sorted(WORDS)]
        vocabulary = {piece: index for index, piece in enumerate(dict.fromkeys(pieces))}
        backend = Tokenizer(models.WordPiece(vocabulary, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
    else:  # byte-level BPE's trainer is deterministic (the same merges in every process, checked)
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=300, min_frequency=1, special_tokens=names, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        backend.train_from_iterator(tiny_text(), trainer=trainer)
    if "cls_token" in special:  # encoders: <cls> A <sep>, as their real tokenizers
        cls, sep = special["cls_token"], special["sep_token"]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
        )
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=POSITIONS, **special)


def tiny_config(model_type: str, tokenizer, **overrides):
    """The family's config at tiny sizes, its vocabulary and special token ids the tokenizer's."""
    from transformers import CONFIG_MAPPING

    ids = {
        f"{name}_token_id": getattr(tokenizer, f"{name}_token_id")
        for name in ("pad", "bos", "eos")
        if getattr(tokenizer, f"{name}_token_id", None) is not None
    }
    if model_type == "modernbert":  # its config names them too, with BERT's defaults that do not fit 120 tokens
        ids |= {
            "cls_token_id": tokenizer.cls_token_id,
            "sep_token_id": tokenizer.sep_token_id,
            "bos_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id,
        }
    return CONFIG_MAPPING[model_type](**(_SIZES[model_type] | ids | {"vocab_size": len(tokenizer)} | overrides))


def save_tiny_checkpoint(folder: Path, model_type: str, head: str = "auto", seed: int = 0, **overrides) -> Path:
    """A tiny randomly initialised checkpoint of `model_type` saved in `folder` with its tokenizer.

    `head`: "masked_lm" (AutoModelForMaskedLM), "causal_lm" (AutoModelForCausalLM), "base" (AutoModel: a bare
    backbone, as sentence-embedding checkpoints ship) or "auto" (masked for encoders, causal for decoders).
    """
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    if head == "auto":
        head = "causal_lm" if model_type in CAUSAL_FAMILIES else "masked_lm"
    auto_class = {"masked_lm": AutoModelForMaskedLM, "causal_lm": AutoModelForCausalLM, "base": AutoModel}[head]
    tokenizer = tiny_tokenizer(model_type)
    torch.manual_seed(seed)
    model = auto_class.from_config(tiny_config(model_type, tokenizer, **overrides))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
