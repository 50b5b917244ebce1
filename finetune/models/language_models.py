"""The language-model families of `finetune pretrain`, behind one interface.

| family   | objective              | tokenizer trained on the corpus | Hugging Face class                        |
|----------|------------------------|---------------------------------|-------------------------------------------|
| bert     | masked tokens          | WordPiece (uncased by default)  | BertForMaskedLM                           |
| gpt2     | next token             | byte-level BPE                  | GPT2LMHeadModel; with memory_length (BPTT |
|          |                        |                                 | batches) or a sparse attention pattern:   |
|          |                        |                                 | CausalTransformerForCausalLM (ours)       |
| awd_lstm | next token, BPTT       | byte-level BPE                  | AWDLSTMForCausalLM (ours)                 |
| ngram    | next token, counted    | byte-level BPE                  | NGramForCausalLM (ours)                   |

Each family's model is wrapped in a module whose forward is `(input_ids, labels) -> (mean loss,
labelled tokens, correct predictions or None)`, so the training loop and validation never branch on it. The
n-gram baseline is counted, not trained (models/ngram.py): it has no sizes to build, and only validation calls it.
The AWD-LSTM's training loss also carries the gradient of its activation penalties (AR/TAR), not their value.
"""

from __future__ import annotations

from torch import nn
from transformers import AutoConfig, BertForMaskedLM, GPT2LMHeadModel

from finetune.data.tokenizers import train_byte_level_bpe, train_wordpiece
from finetune.errors import UserError
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.backbones import layer_groups
from finetune.models.causal_lm import (MemoryNextTokenLM, NextTokenLM, RecurrentNextTokenLM, build_causal_lm,
                                       load_causal_lm)
from finetune.models.causal_transformer import CausalTransformerForCausalLM, build_causal_transformer
from finetune.models.hub import load_model, load_pretrained, resolve_checkpoint
from finetune.models.masked_lm import SparseMaskedLM, build_masked_lm, load_masked_lm
from finetune.models.ngram import NGramForCausalLM, NGramNextTokenLM

# The Hugging Face class of each family's language model (for a checkpoint's config: built, not loaded, by profile).
LANGUAGE_MODEL_CLASSES = {"bert": BertForMaskedLM, "gpt2": GPT2LMHeadModel, "awd_lstm": AWDLSTMForCausalLM,
                          "ngram": NGramForCausalLM}

# What validation calls the share of labelled tokens predicted right.
ACCURACY_NAME = {"bert": "masked_accuracy", "gpt2": "next_token_accuracy", "awd_lstm": "next_token_accuracy",
                 "ngram": "next_token_accuracy"}


def uses_causal_transformer(model_config) -> bool:
    """Whether a gpt2 recipe asks for our own model (Transformer-XL memory, a sparse attention pattern) rather than
    GPT2LMHeadModel, which computes neither."""
    return model_config.family == "gpt2" and (model_config.memory_length > 0 or model_config.attention != "dense")


def reads_bptt_batches(model_config) -> bool:
    """Whether the model carries a state from batch to batch (the AWD-LSTM's, Transformer-XL's memory), so reads
    the corpus as BPTT batches in order, row i of each continuing row i of the one before."""
    return model_config.family == "awd_lstm" or getattr(model_config, "memory_length", 0) > 0


def train_tokenizer(family: str, documents: list[str], tokenizer_config):
    """WordPiece for the masked LM (as BERT), byte-level BPE for the causal families (as GPT-2)."""
    train = train_wordpiece if family == "bert" else train_byte_level_bpe
    return train(documents, tokenizer_config.vocab_size, tokenizer_config.lowercase, tokenizer_config.min_frequency)


def check_tokenizer(family: str, tokenizer, source: str, key: str) -> None:
    """An existing tokenizer must have the special tokens the family's data layout uses."""
    needed = ("mask_token", "cls_token", "sep_token") if family == "bert" else ("eos_token",)
    missing = [name for name in needed if getattr(tokenizer, name) is None]
    if missing:
        raise UserError(f"{key}: the tokenizer of {source} has no {', '.join(missing)}, which {family} "
                        "pretraining needs")


def document_separator_id(family: str, tokenizer) -> int:
    """The token packed after every document: [SEP] for BERT, the end-of-text token for causal LMs."""
    return tokenizer.sep_token_id if family == "bert" else tokenizer.eos_token_id


class VocabularyOfSize:
    """What `build_language_model` reads of a tokenizer, for one not trained yet: its size (the ids of the special
    tokens change no shape)."""

    pad_token_id = bos_token_id = eos_token_id = 0

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def build_language_model(model_config, tokenizer, max_positions: int) -> nn.Module:
    """A randomly initialised Hugging Face model of the recipe's family and size."""
    if model_config.family == "ngram":  # e.g. `finetune profile`: there is nothing to size or to train
        raise UserError("model.family ngram is counted from the corpus by `finetune pretrain`; it has no sizes to "
                        "build and no training to profile or range-test")
    if model_config.family == "bert":
        return build_masked_lm(model_config, len(tokenizer), max_positions, tokenizer.pad_token_id)
    if uses_causal_transformer(model_config):
        return build_causal_transformer(model_config, len(tokenizer), max_positions, tokenizer)
    if model_config.family == "gpt2":
        return build_causal_lm(model_config, len(tokenizer), max_positions, tokenizer)
    config = AWDLSTMConfig(
        vocab_size=len(tokenizer), embedding_size=model_config.embedding_size, hidden_size=model_config.hidden,
        num_layers=model_config.layers, cell=model_config.cell, pad_token_id=tokenizer.pad_token_id,
        embedding_init_range=model_config.embedding_init_range, **awd_lstm_dropouts(model_config),
    )
    return AWDLSTMForCausalLM._from_config(config)


def load_language_model(model_config) -> nn.Module:
    """An existing checkpoint of the recipe's family, to continue pretraining (ULMFiT's second stage).

    Dropout keys given in the recipe replace the checkpoint's; the others keep its values.
    """
    given = model_config.model_fields_set
    if model_config.family == "bert":
        return load_masked_lm(model_config.checkpoint, model_config.dropout if "dropout" in given else None)
    if model_config.family == "gpt2":
        return load_causal_lm(model_config.checkpoint, model_config.dropout if "dropout" in given else None)
    dropouts = {name: value for name, value in awd_lstm_dropouts(model_config).items() if name in given}
    source = resolve_checkpoint(model_config.checkpoint)
    config = load_pretrained(AutoConfig.from_pretrained, source, "model.checkpoint")
    if config.model_type != "awd_lstm":
        raise UserError(f"model.checkpoint: {model_config.checkpoint} is a '{config.model_type}' model; "
                        "model.family awd_lstm continues awd_lstm checkpoints")
    for name, value in dropouts.items():
        setattr(config, name, value)
    return load_model(AWDLSTMForCausalLM, source, "model.checkpoint", config=config)


def awd_lstm_dropouts(model_config) -> dict[str, float]:
    """The five AWD-LSTM dropouts of a recipe, named as in AWDLSTMConfig."""
    return {name: getattr(model_config, name) for name in
            ("output_dropout", "hidden_dropout", "input_dropout", "embedding_dropout", "weight_dropout")}


def loss_module(model_config, model: nn.Module) -> nn.Module:
    """The model wrapped so that its forward returns the family's training loss (see the module docstring)."""
    if model_config.family == "awd_lstm":
        return RecurrentNextTokenLM(model, model_config.activation_regularization,
                                    model_config.temporal_activation_regularization)
    if isinstance(model, CausalTransformerForCausalLM):
        return MemoryNextTokenLM(model)
    wrappers = {"bert": SparseMaskedLM, "gpt2": NextTokenLM, "ngram": NGramNextTokenLM}
    return wrappers[model_config.family](model)


def language_model_layer_groups(family: str, model: nn.Module) -> list[list[nn.Parameter]]:
    """The layer groups that discriminative learning rates of language-model training step down from the top.

    AWD-LSTM as ULMFiT/fastai split it for language modelling: the LSTM layers bottom to top, then the embedding
    together with the decoder it is tied to, on top. The embedding is both the first and the last layer of a tied
    LM; on top it learns at the full LR, which ULMFiT's stage 2 needs: the rows of the target vocabulary's new
    tokens start at the mean row, and at the bottom group's LR (lr / 2.6^3) they barely moved (bench/README.md,
    ULMFiT). The classifier's groups keep the embedding at the bottom (models/backbones.py), as fastai's do.
    Transformer families keep the backbone order.
    """
    groups = layer_groups(model)
    if family != "awd_lstm":
        return groups
    embedding, *layers, head = groups
    return layers + [embedding + head]

