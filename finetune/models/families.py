"""The language-model families, one object each: everything the toolkit does differently per family, in one place.

| family             | objective           | tokenizer trained on the corpus | Hugging Face class                  |
|--------------------|---------------------|---------------------------------|-------------------------------------|
| bert               | masked tokens       | WordPiece (uncased by default)  | BertForMaskedLM                     |
| gpt2               | next token          | byte-level BPE                  | GPT2LMHeadModel                     |
| causal_transformer | next token          | byte-level BPE                  | CausalTransformerForCausalLM (ours) |
| awd_lstm           | next token, BPTT    | byte-level BPE                  | AWDLSTMForCausalLM (ours)           |
| ngram              | next token, counted | byte-level BPE                  | NGramForCausalLM (ours)             |
| auto_masked_lm     | masked tokens       | (continued: the checkpoint's)   | AutoModelForMaskedLM                |
| auto_causal_lm     | next token          | (continued: the checkpoint's)   | AutoModelForCausalLM                |

A recipe's model.family names the family, but for causal_transformer: what `model.family: gpt2` trains with
memory_length (Transformer-XL, read as BPTT batches) or a sparse attention pattern, which GPT2LMHeadModel lacks;
and for the auto families: what a bert or gpt2 section continues from a checkpoint of another transformers family.

A family knows its data layout (masked blocks, next-token blocks, BPTT batches), its tokenizer, how to build a model
from a recipe's model section and continue a checkpoint (refusing one of another family), the loss module that
trains it, its layer groups, its position table and what FLOP counting needs of it. Look one up by name
(`family("bert")`), by a recipe's model section (`family_of(recipe.model)`: a gpt2 section with memory or a sparse
pattern is the causal transformer; one continuing a roberta or llama checkpoint an auto family), or by a loaded
config's model_type (`family_of_model_type`: None for the families transformers ships, e.g. roberta). Code
elsewhere asks these objects instead of comparing family names, so adding a family is adding one object here.

Recipe-level rules (which sections a family takes) stay in recipes/language_models.py, one layer below, as attributes of
each family's model section. The classes are in models/family_classes.py; this module makes one object of each and
looks them up.
"""

from __future__ import annotations

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from finetune.errors import InputError
from finetune.models.auto_lm import SPLIT_OUTPUT_TYPES
from finetune.models.family_classes import (
    AutoCausalLMFamily,
    AutoMaskedLMFamily,
    AWDLSTMFamily,
    BertFamily,
    CausalTransformerFamily,
    GPT2Family,
    LanguageModelFamily,
    NGramFamily,
)
from finetune.models.hub import stored_model_type
from finetune.models.mean_pooling import backbone_config

BERT, GPT2, CAUSAL_TRANSFORMER, AWD_LSTM, NGRAM = (
    BertFamily(),
    GPT2Family(),
    CausalTransformerFamily(),
    AWDLSTMFamily(),
    NGramFamily(),
)
FAMILIES: dict[str, LanguageModelFamily] = {f.name: f for f in (BERT, GPT2, CAUSAL_TRANSFORMER, AWD_LSTM, NGRAM)}
_BY_MODEL_TYPE = {f.model_type: f for f in FAMILIES.values()}
# The masked and causal LMs of transformers' other families: what bert and gpt2 sections continue beside their own.
AUTO_MASKED_LM, AUTO_CAUSAL_LM = AutoMaskedLMFamily(), AutoCausalLMFamily()
_CONTINUED_BESIDE: dict[LanguageModelFamily, LanguageModelFamily] = {BERT: AUTO_MASKED_LM, GPT2: AUTO_CAUSAL_LM}
# Model types transformers knows only through this toolkit: their own family continues (or refuses) them.
_OWN_MODEL_TYPES = {f.model_type for f in FAMILIES.values() if f.registering_import}

# The causal model types `finetune pretrain` writes: ours and the decoders of transformers' families that continued
# pretraining is tested on, beside gpt2, those whose loss is fused with their decoder (SPLIT_OUTPUT_TYPES, checked
# against their own logits by tests/stages/test_continued_families.py); any other decoder with a causal-LM head
# continues too (AUTO_CAUSAL_LM), through its logits. What the fine-tuning stages read left to right; `finetune
# generate` and `finetune score` read any decoder (`reads_next_tokens`).
CAUSAL_MODEL_TYPES = tuple(f.model_type for f in FAMILIES.values() if not f.masked) + SPLIT_OUTPUT_TYPES
# Model types whose classifier reads any length (the AWD-LSTM: BPT3C chunks), so task.max_length left out means the
# whole document; they are also the ones fine-tuned with ULMFiT's techniques by default (training/techniques.py).
WHOLE_DOCUMENT_TYPES = tuple(f.model_type for f in FAMILIES.values() if f.recurrent)


def family(name: str) -> LanguageModelFamily:
    """The family of that name; an unknown one is refused in one line naming the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise InputError(f"unknown model family '{name}' (expected {', '.join(FAMILIES)})", value=name) from None


def family_of(model_config) -> LanguageModelFamily:
    """The family a recipe's model section trains: model.family's, but our causal transformer for a gpt2 section
    with Transformer-XL memory or a sparse attention pattern (GPT2LMHeadModel computes neither), and for a bert or
    gpt2 section continuing a checkpoint of another of transformers' families (its config.json's model_type, read
    where it is stored: `load_language_model` fetches a hub name's first), the masked or causal LM of any family."""
    if model_config.family == GPT2.recipe_family and (
        getattr(model_config, "memory_length", 0) > 0 or getattr(model_config, "attention", "dense") != "dense"
    ):
        return CAUSAL_TRANSFORMER
    named = family(model_config.family)
    checkpoint = getattr(model_config, "checkpoint", None)
    beside = _CONTINUED_BESIDE.get(named)
    if beside is None or checkpoint is None:
        return named
    model_type = stored_model_type(checkpoint)
    if model_type is None or model_type == named.model_type or model_type in _OWN_MODEL_TYPES:
        return named  # its own type; one of ours, which it refuses naming it; or not stored here (refused on load)
    return beside


def reads_next_tokens(config) -> bool:
    """Whether a loaded config is of a causal language model `finetune generate` and `score` read: one of this
    toolkit's causal families, or a decoder of transformers' families (llama, qwen2, ...)."""
    return is_decoder_type(config.model_type) and not getattr(config, "is_encoder_decoder", False)


def family_of_model_type(model_type: str) -> LanguageModelFamily | None:
    """The family of a loaded config's model_type; None for one of ours it is not (transformers' roberta, ...)."""
    return _BY_MODEL_TYPE.get(model_type)


def is_recurrent(config) -> bool:
    """Whether a loaded config is of a recurrent family (LSTM layers: no attention, no position table)."""
    found = family_of_model_type(config.model_type)
    return found is not None and found.recurrent


def is_decoder_type(model_type: str) -> bool:
    """Whether models of this type read left to right: a causal family of ours, or one transformers gives a
    causal-LM head and no masked-LM one (gpt2, llama, qwen2, opt, ...; BERT's kind has both)."""
    return model_type in CAUSAL_MODEL_TYPES or (
        model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def reads_left_to_right(config) -> bool:
    """Whether a loaded config's model (a classifier's encoder included) reads left to right: its classifier then
    pools the last real token, and its tagger tags a word at its last token, having read all of it."""
    return is_decoder_type(backbone_config(config).model_type)
