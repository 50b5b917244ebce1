"""The model-family registry (models/families.py): every family answers what the code asks of it, lookups by name,
recipe section and model type agree, and an unknown family is refused in one line."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from finetune.errors import CheckpointError, UserError, recipe_key
from finetune.models.auto_lm import SPLIT_OUTPUT_TYPES
from finetune.models.families import (
    AWD_LSTM,
    BERT,
    CAUSAL_MODEL_TYPES,
    CAUSAL_TRANSFORMER,
    FAMILIES,
    GPT2,
    NGRAM,
    WHOLE_DOCUMENT_TYPES,
    family,
    family_of,
    family_of_model_type,
    is_decoder_type,
    is_recurrent,
)
from finetune.models.language_models import VocabularyOfSize
from finetune.recipes.language_models import (
    AWDLSTMModelConfig,
    CausalLMModelConfig,
    MaskedLMModelConfig,
    NGramModelConfig,
)

SECTIONS = {
    "bert": MaskedLMModelConfig(layers=1, hidden=16, heads=2),
    "gpt2": CausalLMModelConfig(family="gpt2", layers=1, hidden=16, heads=2),
    "causal_transformer": CausalLMModelConfig(family="gpt2", layers=1, hidden=16, heads=2, memory_length=4),
    "awd_lstm": AWDLSTMModelConfig(family="awd_lstm", embedding_size=8, hidden=12, layers=2),
    "ngram": NGramModelConfig(family="ngram"),
}


class Tokenizer:
    """The special tokens a data layout reads, and a length."""

    pad_token_id, bos_token_id, eos_token_id, sep_token_id, cls_token_id = 0, 1, 2, 3, 4
    mask_token, cls_token, sep_token, eos_token = "[MASK]", "[CLS]", "[SEP]", "<|endoftext|>"

    def __len__(self) -> int:
        return 50


def test_every_family_is_registered_under_its_name():
    assert set(FAMILIES) == {"bert", "gpt2", "causal_transformer", "awd_lstm", "ngram"}
    for name, found in FAMILIES.items():
        assert family(name) is found and found.name == name
        assert family_of_model_type(found.model_type) is found


def test_an_unknown_family_is_refused_in_one_line():
    with pytest.raises(UserError) as refused:
        family("t5")
    assert str(refused.value) == (
        "unknown model family 't5' (expected bert, gpt2, causal_transformer, awd_lstm, ngram)"
    )
    assert family_of_model_type("roberta") is None  # transformers' own: fine-tuned, never pretrained here


def test_every_family_has_a_section_here():
    assert set(SECTIONS) == set(FAMILIES)  # each family is asked what the code asks of it below


@pytest.mark.parametrize("name", SECTIONS)
def test_a_recipe_section_selects_its_family(name):
    assert family_of(SECTIONS[name]) is FAMILIES[name]
    sparse = CausalLMModelConfig(family="gpt2", layers=1, hidden=16, heads=2, attention="strided", attention_stride=4)
    assert family_of(sparse) is CAUSAL_TRANSFORMER and not CAUSAL_TRANSFORMER.reads_bptt_batches(sparse)


@pytest.mark.parametrize("name", [name for name in SECTIONS if name != "ngram"])
def test_every_trained_family_builds_groups_and_wraps_its_model(name):
    section, found = SECTIONS[name], FAMILIES[name]
    positions = found.max_positions(section, 16)
    assert positions == (None if found.recurrent else 16)
    with torch.device("meta"):
        model = found.build(section, VocabularyOfSize(50), positions)
    assert found.owns(model.config) and isinstance(model, found.model_class)
    groups = found.layer_groups(model)
    assert sum(len(group) for group in groups) == len(list(model.parameters()))
    assert len(range(len(groups))[found.layer_blocks]) == (2 if found.recurrent else 1)  # its layers, no more
    assert found.loss_module(section, model).language_model is model
    assert found.reads_bptt_batches(section) == (name in ("awd_lstm", "causal_transformer"))


def test_the_data_layouts():
    tokenizer = Tokenizer()
    assert (BERT.separator_id(tokenizer), BERT.block_start_id(tokenizer), BERT.block_text_tokens(8)) == (3, 4, 7)
    for causal in (GPT2, CAUSAL_TRANSFORMER, AWD_LSTM, NGRAM):
        assert (causal.separator_id(tokenizer), causal.block_start_id(tokenizer), causal.block_text_tokens(8)) == (
            2,
            None,
            9,
        )
    assert (BERT.tokenizer_kind, GPT2.tokenizer_kind) == ("WordPiece", "byte-level BPE")
    assert (BERT.accuracy_name, AWD_LSTM.accuracy_name) == ("masked_accuracy", "next_token_accuracy")
    tokenizer.mask_token = None
    with pytest.raises(CheckpointError, match=r"^the tokenizer of here has no mask_token, which bert") as refused:
        BERT.check_tokenizer(tokenizer, "here")
    assert refused.value.value == ["mask_token"]  # the stage names the key that gave "here" (stages/pretrain.py)
    GPT2.check_tokenizer(tokenizer, "here")


def test_what_is_known_of_a_loaded_config():
    assert CAUSAL_MODEL_TYPES[:4] == ("gpt2", "finetune_causal_transformer", "awd_lstm", "ngram")
    decoders = ("llama", "mistral", "qwen2", "gemma", "phi", "opt", "gpt_neox")
    assert CAUSAL_MODEL_TYPES[4:] == SPLIT_OUTPUT_TYPES == decoders
    assert WHOLE_DOCUMENT_TYPES == ("awd_lstm",)
    assert is_recurrent(AutoConfig.for_model("awd_lstm")) and not is_recurrent(AutoConfig.for_model("bert"))
    assert not is_recurrent(AutoConfig.for_model("roberta"))


def test_the_recipes_decoders_are_transformers_decoders_and_hold_those_tested():
    """recipes/ulmfit.py names decoder model types without importing transformers (a checkpoint whose config names no
    head continues as a causal LM): each is a decoder to transformers, and every decoder continued pretraining is
    tested on (gpt2 and SPLIT_OUTPUT_TYPES) is among them."""
    from finetune.recipes.ulmfit import DECODER_MODEL_TYPES

    assert all(is_decoder_type(model_type) for model_type in DECODER_MODEL_TYPES)
    assert {GPT2.model_type, *SPLIT_OUTPUT_TYPES} <= set(DECODER_MODEL_TYPES)


def test_a_checkpoint_of_another_family_is_refused_with_its_type():
    with (
        pytest.raises(
            UserError,
            match=r"^model.checkpoint: run/ckpt is a 'bert' model; model.family awd_lstm continues awd_lstm "
            r"checkpoints$",
        ),
        recipe_key("model.checkpoint"),
    ):  # as the stages name it
        AWD_LSTM.check_checkpoint(AutoConfig.for_model("bert"), "run/ckpt")
    GPT2.check_checkpoint(AutoConfig.for_model("gpt2"), "run/ckpt")


def test_ngram_is_counted_not_built():
    assert NGRAM.counted and not NGRAM.has_position_table
    with pytest.raises(UserError, match="counted from the corpus"):
        NGRAM.build(SECTIONS["ngram"], VocabularyOfSize(50), None)
