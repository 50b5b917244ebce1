"""Language models of transformers' own families (roberta, deberta-v2, modernbert, llama, qwen2, ...), continued
through `AutoModelForMaskedLM` / `AutoModelForCausalLM` and their own forward (SDPA where the family has it).

BERT and GPT-2 checkpoints keep their faster routes (models/masked_lm.py, models/causal_lm.py); these serve every
other family with a language-model head. Each keeps what can be kept of those routes:
- a masked LM decodes only the masked positions (Cramming's sparse prediction): the encoder runs, then the family's
  MLM head (`MASKED_LM_HEADS`, its forward after the encoder written as a call) reads the masked rows alone. A
  family missing from the table decodes every position through its own forward and picks the masked ones after;
- a causal LM takes the base model's last hidden state into `linear_cross_entropy` with the output embeddings (no
  logits tensor) for the families whose logits are exactly that product (`SPLIT_OUTPUT_TYPES`); the others (Gemma
  2's soft-capping, Cohere's and Granite's logit scaling, any family not checked) go through the model's logits.
tests/stages/test_continued_families.py checks both routes against the model's own full logits for every family listed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn
from transformers import PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from finetune.errors import CheckpointError, InputError
from finetune.models.linear_cross_entropy import linear_cross_entropy, logits_cross_entropy
from finetune.models.loading import load_for_continued_pretraining
from finetune.models.masked_lm import MaskedLMOutput
from finetune.models.objectives import LanguageModelLoss
from finetune.tasks.specs import IGNORE_INDEX

Head = Callable[[Any, torch.Tensor], torch.Tensor]  # (masked LM, hidden states) -> logits


def _deberta_head(model, hidden: torch.Tensor) -> torch.Tensor:
    """DeBERTa-v2/v3's MLM head: the legacy one (`cls`), or the newer one that reads the word embeddings."""
    if model.legacy:
        return model.cls(hidden)
    return model.lm_predictions(hidden, model.deberta.embeddings.word_embeddings)


# model_type -> its masked LM's head as a call on (model, last hidden states): what the family's
# *ForMaskedLM.forward does after the encoder, so that it can be applied to the masked rows only.
MASKED_LM_HEADS: dict[str, Head] = {
    "roberta": lambda model, hidden: model.lm_head(hidden),
    "xlm-roberta": lambda model, hidden: model.lm_head(hidden),
    "mpnet": lambda model, hidden: model.lm_head(hidden),
    "deberta-v2": _deberta_head,
    "modernbert": lambda model, hidden: model.decoder(model.head(hidden)),
    "distilbert": lambda model, hidden: model.vocab_projector(
        model.vocab_layer_norm(model.activation(model.vocab_transform(hidden)))
    ),
    "albert": lambda model, hidden: model.predictions(hidden),
    "electra": lambda model, hidden: model.generator_lm_head(model.generator_predictions(hidden)),
}

# Causal families whose logits are exactly the output embeddings applied to the base model's last hidden state
# (no soft-capping, no scaling): their loss is fused with the decoder.
SPLIT_OUTPUT_TYPES = ("llama", "mistral", "qwen2", "gemma", "phi", "opt", "gpt_neox")

# What an ELECTRA discriminator checkpoint's config.json names (replaced-token detection: no MLM head).
ELECTRA_DISCRIMINATOR = "ElectraForPreTraining"

_WHAT_CONTINUES = (
    "continued pretraining takes an encoder with a masked-LM head (model.family: bert) or a decoder (model.family: "
    "gpt2)"
)


def masked_lm_refusal(config) -> str | None:
    """Why a checkpoint's config cannot be continued as a masked LM through AutoModelForMaskedLM, as the rest of a
    sentence "NAME is ..."; None when it can."""
    model_type, architectures = config.model_type, config.architectures or []
    if ELECTRA_DISCRIMINATOR in architectures:
        return (
            f"an ELECTRA discriminator ({ELECTRA_DISCRIMINATOR}: replaced-token detection, no masked-LM head): "
            "continue its generator checkpoint instead (e.g. google/electra-base-generator), or fine-tune this one "
            "with `finetune finetune`"
        )
    if getattr(config, "is_encoder_decoder", False):
        return f"a '{model_type}' model, an encoder-decoder: {_WHAT_CONTINUES}"
    if model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return (
                f"a '{model_type}' model (a decoder, no masked-LM head): set model.family: gpt2 to continue it "
                "as a causal LM"
            )
        return f"a '{model_type}' model, which has no language-model head in transformers: {_WHAT_CONTINUES}"
    return None


def causal_lm_refusal(config) -> str | None:
    """Why a checkpoint's config cannot be continued as a causal LM through AutoModelForCausalLM (the rest of
    "NAME is ..."); None when it can."""
    model_type = config.model_type
    if getattr(config, "is_encoder_decoder", False):
        return f"a '{model_type}' model, an encoder-decoder: {_WHAT_CONTINUES}"
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:  # transformers also builds these as decoders: not trained so
        return (
            f"a '{model_type}' model (an encoder with a masked-LM head): set model.family: bert to continue it as "
            "a masked LM"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"a '{model_type}' model, which has no language-model head in transformers: {_WHAT_CONTINUES}"
    return None


def dropout_fields(config) -> list[str]:
    """The dropout probabilities of a config, whatever its family calls them (hidden_dropout_prob, attention_dropout,
    resid_pdrop, ...): the float fields named dropout or pdrop."""
    return [
        name
        for name, value in config.to_dict().items()
        if ("dropout" in name or "pdrop" in name) and isinstance(value, float)
    ]


def usable_positions(model: PreTrainedModel) -> int | None:
    """How many positions a block may have: config.max_position_embeddings (rotary models have it too) less the
    rows a RoBERTa-style table keeps below its first position (its padding index and those before it); None for a
    model without a bound."""
    positions = getattr(model.config, "max_position_embeddings", None)
    table = getattr(getattr(model.base_model, "embeddings", None), "position_embeddings", None)
    if positions is not None and isinstance(table, nn.Embedding) and table.padding_idx is not None:
        return positions - table.padding_idx - 1  # positions count from padding_idx + 1 (fairseq's convention)
    return positions


class AutoMaskedLM(LanguageModelLoss):
    """A masked LM of transformers' own families whose forward returns the loss at the masked positions, decoding
    only those where `MASKED_LM_HEADS` knows the family's head."""

    def __init__(self, masked_lm: PreTrainedModel):
        super().__init__()
        self.masked_lm = masked_lm
        self.head = MASKED_LM_HEADS.get(masked_lm.config.model_type)  # None: every position decoded

    @property
    def language_model(self) -> PreTrainedModel:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.masked_lm

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> MaskedLMOutput:
        model, selected = self.masked_lm, labels != IGNORE_INDEX
        if self.head is None:
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[selected]
        else:
            hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            logits = self.head(model, hidden[selected])
        return logits_cross_entropy(logits, labels[selected], count_correct=not self.training)


class AutoNextTokenLM(LanguageModelLoss):
    """A causal LM of transformers' own families whose forward returns the next-token loss (labels are the next
    tokens already), fused with the decoder where the family's logits are a plain product (`SPLIT_OUTPUT_TYPES`)."""

    def __init__(self, causal_lm: PreTrainedModel):
        super().__init__()
        self.causal_lm = causal_lm
        self.split_output = causal_lm.config.model_type in SPLIT_OUTPUT_TYPES

    @property
    def language_model(self) -> PreTrainedModel:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.causal_lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> MaskedLMOutput:
        model = self.causal_lm
        if not self.split_output:
            logits = model(input_ids=input_ids, use_cache=False).logits
            return logits_cross_entropy(logits, labels, count_correct=not self.training)
        hidden = model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state  # no key/value cache
        output = model.get_output_embeddings()
        return linear_cross_entropy(hidden, output.weight, output.bias, labels, count_correct=not self.training)


class ContinuedThroughAutoClass:
    """What the masked and causal LMs of transformers' other families (models/families.py) share: continued from a
    checkpoint through their Auto class (`auto_class`) and the loss modules above, never built from sizes; a
    checkpoint without that head is refused by `refusal`, one line naming its model_type and what to do instead."""

    model_type = ""  # any model type `refusal` lets through (owns)
    recipe_family: str  # the family's attributes this mixin reads
    auto_class: str
    refusal: Any  # models/auto_lm.py's masked_lm_refusal or causal_lm_refusal: config -> why not, or None
    loss_class: Any  # the LanguageModelLoss wrapping a loaded model

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        raise InputError(
            f"model.family {self.recipe_family} builds {self.recipe_family} models; others are continued "
            "(model.checkpoint)"
        )

    def load(self, model_config) -> PreTrainedModel:
        given, checkpoint = model_config.model_fields_set, model_config.checkpoint
        dropout = model_config.dropout if "dropout" in given else None
        check = functools.partial(self.check_checkpoint, checkpoint=checkpoint)
        return load_for_continued_pretraining(self.auto_model_class(), checkpoint, dropout, dropout_fields, check)

    def auto_model_class(self):
        """transformers' Auto class that loads and builds the family's models (named by `auto_class`)."""
        return getattr(transformers, self.auto_class)

    def check_checkpoint(self, config, checkpoint: str) -> None:
        refusal = self.refusal(config)
        if refusal is not None:
            raise CheckpointError(f"{checkpoint} is {refusal}", value=config.model_type)

    def from_config(self, config) -> PreTrainedModel:
        return self.auto_model_class().from_config(config)

    def loss_module(self, model_config, model: nn.Module) -> nn.Module:
        assert isinstance(model, PreTrainedModel)  # what the family loads
        return self.loss_class(model)

    def owns(self, config) -> bool:
        return self.refusal(config) is None

    def shown_name(self, model_config, config) -> str:
        return config.model_type
