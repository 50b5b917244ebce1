"""The language models of `finetune pretrain`, behind one interface: the functions the pretrain stage calls, each
asking the model family (models/families.py, which holds the table of families and what differs between them).

Each family's model is wrapped in a module whose forward is `(input_ids, labels) -> (mean loss,
labelled tokens, correct predictions or None)`, so the training loop and validation never branch on it. The
n-gram baseline is counted, not trained (models/ngram.py): it has no sizes to build, and only validation calls it.
The AWD-LSTM's training loss also carries the gradient of its activation penalties (AR/TAR), not their value.
"""

from __future__ import annotations

from torch import nn
from transformers import AutoConfig, PreTrainedModel

from finetune.models.families import AWD_LSTM, CAUSAL_TRANSFORMER, FAMILIES, family, family_of
from finetune.models.hub import load_pretrained, resolve_checkpoint

# The Hugging Face class of each family's language model (for a checkpoint's config: built, not loaded, by profile).
LANGUAGE_MODEL_CLASSES = {name: found.model_class for name, found in FAMILIES.items()}

# What validation calls the share of labelled tokens predicted right.
ACCURACY_NAME = {name: found.accuracy_name for name, found in FAMILIES.items()}


def uses_causal_transformer(model_config) -> bool:
    """Whether a gpt2 recipe asks for our own model (Transformer-XL memory, a sparse attention pattern) rather than
    GPT2LMHeadModel, which computes neither."""
    return family_of(model_config) is CAUSAL_TRANSFORMER


def reads_bptt_batches(model_config) -> bool:
    """Whether the model carries a state from batch to batch (the AWD-LSTM's, Transformer-XL's memory), so reads
    the corpus as BPTT batches in order, row i of each continuing row i of the one before."""
    return family_of(model_config).reads_bptt_batches(model_config)


def train_tokenizer(family_name: str, documents: list[str], tokenizer_config):
    """WordPiece for the masked LM (as BERT), byte-level BPE for the causal families (as GPT-2)."""
    return family(family_name).train_tokenizer(documents, tokenizer_config)


def check_tokenizer(family_name: str, tokenizer, source: str) -> None:
    """An existing tokenizer must have the special tokens the family's data layout uses."""
    family(family_name).check_tokenizer(tokenizer, source)


def document_separator_id(family_name: str, tokenizer) -> int:
    """The token packed after every document: [SEP] for BERT, the end-of-text token for causal LMs."""
    return family(family_name).separator_id(tokenizer)


class VocabularyOfSize:
    """What `build_language_model` reads of a tokenizer, for one not trained yet: its size (the ids of the special
    tokens change no shape)."""

    pad_token_id = bos_token_id = eos_token_id = 0

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def build_language_model(model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
    """A randomly initialised Hugging Face model of the recipe's family and size."""
    return family_of(model_config).build(model_config, tokenizer, max_positions)


def load_language_model(model_config) -> PreTrainedModel:
    """An existing checkpoint of the recipe's family, to continue pretraining (ULMFiT's second stage).

    Dropout keys given in the recipe replace the checkpoint's; the others keep its values.
    """
    # config.json first (a hub name's is fetched into the cache): family_of reads its model_type where it is stored.
    load_pretrained(AutoConfig.from_pretrained, resolve_checkpoint(model_config.checkpoint))
    return family_of(model_config).load(model_config)


def awd_lstm_dropouts(model_config) -> dict[str, float]:
    """The five AWD-LSTM dropouts of a recipe, named as in AWDLSTMConfig."""
    return AWD_LSTM.dropouts(model_config)


def loss_module(model_config, model: nn.Module) -> nn.Module:
    """The model wrapped so that its forward returns the family's training loss (see the module docstring)."""
    return family_of(model_config).loss_module(model_config, model)


def own_head_parameters(language_model: PreTrainedModel) -> list[nn.Parameter]:
    """The trainable parameters of a language model's head that are its own: those outside its base model (a masked
    LM's transform and output bias; an untied decoder's output layer), not a tied output layer, which is the input
    embedding; with a LoRA adapter, the head's copy that trains (peft's modules_to_save), not the frozen original."""
    base = {id(parameter) for parameter in language_model.base_model.parameters()}
    return [p for p in language_model.parameters() if id(p) not in base and p.requires_grad]


def language_model_layer_groups(family_name: str, model: PreTrainedModel) -> list[list[nn.Parameter]]:
    """The layer groups that discriminative learning rates of language-model training step down from the top
    (the AWD-LSTM's embedding on top with its decoder, as ULMFiT; transformers in the backbone order)."""
    return family(family_name).layer_groups(model)
