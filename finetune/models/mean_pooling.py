"""A classification head on the mean of an encoder's last layer over the real tokens (`pooling: mean`).

Sentence-embedding checkpoints (sentence-transformers models such as all-MiniLM-L6-v2) were trained to be
read this way; their [CLS] position and BERT pooler, which the family's own sequence-classification head
reads, never were. The head is dropout and one linear layer, as in BERT's head without the pooler.

This file is self-contained (torch, transformers and scalar_mix.py beside it, imported relatively): `save_pretrained`
copies it and scalar_mix.py into the checkpoint (transformers' remote code, `register_for_auto_class` below) and
records them in config.json's "auto_map", so a plain transformers install loads the classifier with
`AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)`, no `import finetune`. Importing
this module also registers model type "mean_pooling_classifier" with AutoConfig and
AutoModelForSequenceClassification, so after `import finetune` every checkpoint, those saved before the auto_map
too, loads without `trust_remote_code`. Keep it so: no import of finetune here or in scalar_mix.py
(tests/models/test_mean_pooling_export.py runs the copy in a process without finetune).

The checkpoint is also a sentence-transformers model: "AutoModel" in auto_map names `MeanPoolingEncoder` (the
encoder, with the scalar mix if any: the states the head averages), and modules.json, sentence_bert_config.json
and 1_Pooling/config.json (mean pooling) make `SentenceTransformer(folder, trust_remote_code=True).encode(texts)`
the vectors the classifier's linear layer reads (before its dropout).

With `scalar_mix` (`pooling: scalar_mix`) the average is taken over ELMo's learned mix of the embedding output and
every layer's (scalar_mix.py) instead of over the last layer.

Checkpoint format:

- config.json: "model_type": "mean_pooling_classifier", "auto_map" (AutoConfig, AutoModel,
  AutoModelForSequenceClassification; absent in checkpoints saved before it was added), "encoder" (the encoder's own
  config, model_type included), "classifier_dropout" (null: the encoder's hidden dropout), "scalar_mix" (false when
  absent), the label mapping and problem_type.
- model.safetensors: encoder.* (the encoder's own parameter names, no pooler), classifier.weight
  (num_labels, hidden_size) and classifier.bias; with scalar_mix also scalar_mix.layer_weights
  (num_hidden_layers + 1,), embedding output first, and scalar_mix.gamma ().
- mean_pooling.py and scalar_mix.py: this module and the one it imports, as they were when the checkpoint was saved.
- modules.json, sentence_bert_config.json, 1_Pooling/config.json: the sentence-transformers pipeline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.configuration_utils import SubConfigSpec
from transformers.modeling_outputs import BaseModelOutput, SequenceClassifierOutput

from .scalar_mix import ScalarMix  # relative: save_pretrained copies the file beside this one


@strict
class MeanPoolingConfig(PretrainedConfig):
    """A mean-pooling classifier: the encoder's config under `encoder`, and the head's dropout."""

    model_type = "mean_pooling_classifier"
    # Read by transformers from the class, never changed. Not annotated: @strict would take an annotated name for a
    # config field.
    sub_configs_defaults = {"encoder": SubConfigSpec(config_class=AutoConfig, model_type="bert")}  # noqa: RUF012

    encoder: PretrainedConfig | dict | None = None
    classifier_dropout: float | None = None  # None: the encoder's hidden dropout (BERT's head does the same)
    pad_token_id: int | None = None  # the stage records the tokenizer's here, as for any classifier
    scalar_mix: bool = False  # pool ELMo's learned mix of every layer (embedding output included), not the last one
    # The mean divided by its length, as a sentence-transformers Normalize module does (all-MiniLM-L6-v2's last
    # module): what method contrastive's head reads when the checkpoint's sentence embeddings are normalised.
    normalize: bool = False


def backbone_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the network under the head: the encoder's for a mean-pooling classifier, else `config`."""
    return _encoder_of(config) if isinstance(config, MeanPoolingConfig) else config


def _encoder_of(config: MeanPoolingConfig) -> PretrainedConfig:
    """`config.encoder`, which transformers makes a config when the config is made (of a dict, or of the defaults
    for None: sub_configs_defaults)."""
    encoder = config.encoder
    assert isinstance(encoder, PretrainedConfig)
    return encoder


def head_dropout(config: MeanPoolingConfig) -> float:
    """The recipe's classifier_dropout, else the rate the family's own head uses (BERT: its hidden dropout)."""
    if config.classifier_dropout is not None:
        return config.classifier_dropout
    for name in ("classifier_dropout", "hidden_dropout_prob", "seq_classif_dropout"):  # DistilBERT: the last
        if (value := getattr(config.encoder, name, None)) is not None:
            return value
    return 0.1


def mean_over_real_tokens(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(batch, time, size) -> (batch, size): the average over positions the mask marks (all when there is none)."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    real = attention_mask.bool().unsqueeze(-1)
    # Filled, not multiplied: whatever stands at padded positions never reaches the sum. A row with no real token
    # (not produced by the collators) would divide by zero: it pools to zeros instead.
    return hidden.masked_fill(~real, 0.0).sum(dim=1) / real.sum(dim=1).clamp(min=1)


class _MeanPoolingBase(PreTrainedModel):
    """The encoder (its pooler dropped) and, with `scalar_mix`, the mix of its layers: what both models share."""

    config_class = MeanPoolingConfig
    config: MeanPoolingConfig
    base_model_prefix = "encoder"  # `model.base_model` is the encoder, where the layer-group finders look
    main_input_name = "input_ids"

    def __init__(self, config: MeanPoolingConfig):
        super().__init__(config)
        self.encoder = AutoModel.from_config(config.encoder)
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler = None  # BERT-style [CLS] pooler: unused here, and it would never get a gradient
        # Every family's hidden_states hold the embedding output and one entry per layer: num_hidden_layers + 1.
        layers = _encoder_of(config).num_hidden_layers + 1
        self.scalar_mix = ScalarMix(layers) if config.scalar_mix else None

    def normalized(self, pooled: Tensor) -> Tensor:
        """(batch, hidden) pooled vectors, each divided by its length when the config says `normalize`."""
        return nn.functional.normalize(pooled, dim=-1) if getattr(self.config, "normalize", False) else pooled

    def token_states(self, input_ids: Tensor | None, attention_mask: Tensor | None, **encoder_inputs) -> Tensor:
        """(batch, time, hidden): the last layer's states, or the scalar mix of every layer's."""
        mixing = self.scalar_mix is not None
        encoded = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=mixing, **encoder_inputs
        )
        return self.scalar_mix(encoded.hidden_states) if self.scalar_mix is not None else encoded.last_hidden_state


class MeanPoolingEncoder(_MeanPoolingBase):
    """The states a mean-pooling classifier averages, without its head: sentence-transformers' "AutoModel" (its
    Pooling module then takes the mean over the real tokens, as the classifier does)."""

    _keys_to_ignore_on_load_unexpected = [r"^classifier\."]  # noqa: RUF012 (transformers reads it from the class)

    def __init__(self, config: MeanPoolingConfig):
        super().__init__(config)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The scalar mix's starting weights; the encoder's modules get the encoder's own scheme."""
        if isinstance(module, ScalarMix):
            module.reset_parameters()

    def forward(
        self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None, **encoder_inputs
    ) -> BaseModelOutput:
        """last_hidden_state (batch, time, hidden): the states the classifier's head pools."""
        return BaseModelOutput(last_hidden_state=self.token_states(input_ids, attention_mask, **encoder_inputs))


class MeanPoolingForSequenceClassification(_MeanPoolingBase):
    """Any transformers encoder, its last layer averaged over the real tokens, then dropout and a linear layer."""

    def __init__(self, config: MeanPoolingConfig):
        super().__init__(config)
        self.dropout = nn.Dropout(head_dropout(config))
        num_labels = config.num_labels
        assert num_labels is not None  # transformers gives every config a label count (2 by default)
        self.classifier = nn.Linear(_encoder_of(config).hidden_size, num_labels)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The head as BERT initialises its classifier; the encoder's modules get the encoder's own scheme."""
        if module is self.classifier:
            init.normal_(module.weight, mean=0.0, std=getattr(self.config.encoder, "initializer_range", 0.02))
            init.zeros_(module.bias)
        elif isinstance(module, ScalarMix):
            module.reset_parameters()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        **encoder_inputs,
    ) -> SequenceClassifierOutput:
        """Logits (batch, num_labels); with `labels`, cross-entropy, or MSE for regression (transformers' rules)."""
        hidden = self.token_states(input_ids, attention_mask, **encoder_inputs)
        logits = self.classifier(self.dropout(self.normalized(mean_over_real_tokens(hidden, attention_mask))))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        """transformers' load of a saved mean-pooling classifier; given a mean-pooling `config` and any other
        checkpoint (a bare encoder, a masked LM, a classifier: what a LoRA adapter records as its base), that
        checkpoint's encoder under a new head, so that `PeftModel.from_pretrained(AutoModelForSequenceClassification
        .from_pretrained(BASE, config=AutoConfig.from_pretrained(ADAPTER, trust_remote_code=True)), ADAPTER)` is the
        model the adapter was trained on. (transformers alone would look for "encoder."-prefixed names in BASE, find
        a masked LM's "bert." ones, and start the encoder from random weights with a warning.)"""
        if isinstance(config, MeanPoolingConfig) and not _holds_mean_pooling_weights(pretrained_model_name_or_path):
            for auto_only in ("adapter_kwargs", "_from_auto"):  # the Auto class's own, which AutoModel sets again
                kwargs.pop(auto_only, None)
            encoder = AutoModel.from_pretrained(pretrained_model_name_or_path, config=_encoder_of(config), **kwargs)
            return load_encoder_weights(cls(config), encoder)
        return super().from_pretrained(pretrained_model_name_or_path, *args, config=config, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """transformers' save (which copies this file and scalar_mix.py beside the weights), the encoder named for
        AutoModel in auto_map, and the files that make the folder a sentence-transformers model."""
        self.config.auto_map = {
            **(getattr(self.config, "auto_map", None) or {}),
            "AutoModel": _qualified(MeanPoolingEncoder),
        }
        super().save_pretrained(save_directory, *args, **kwargs)
        write_sentence_transformers_files(
            Path(save_directory), _encoder_of(self.config).hidden_size, getattr(self.config, "normalize", False)
        )


def _holds_mean_pooling_weights(name: str | os.PathLike) -> bool:
    """Whether the checkpoint `name` (a folder or a hub name) is a saved mean-pooling classifier, by its config.json."""
    config, _ = PretrainedConfig.get_config_dict(name)
    return config.get("model_type") == MeanPoolingConfig.model_type


def _qualified(cls: type) -> str:
    """auto_map's name for a class of this file: "mean_pooling.ClassName", as transformers writes its own entries."""
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


def write_sentence_transformers_files(folder: Path, hidden_size: int, normalize: bool = False) -> None:
    """modules.json (the folder's encoder, then a mean Pooling, then with `normalize` a Normalize),
    sentence_bert_config.json and 1_Pooling/config.json."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": False}, indent=2) + "\n")
    pooling = {"word_embedding_dimension": hidden_size, "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")


def mean_pooling_classifier(
    encoder_config: PretrainedConfig,
    pretrained_encoder: nn.Module | None,
    classifier_dropout: float | None,
    scalar_mix: bool = False,
    **label_config,
) -> MeanPoolingForSequenceClassification:
    """A new mean-pooling classifier on an encoder of `encoder_config`, with `pretrained_encoder`'s weights if given.

    `pretrained_encoder` is what `AutoModel.from_pretrained` loads from the checkpoint (a bare encoder, a masked
    LM's or a fine-tuned classifier's, each without its head); its pooler, if any, is left behind.
    """
    config = MeanPoolingConfig(
        encoder=encoder_config.to_dict(), classifier_dropout=classifier_dropout, scalar_mix=scalar_mix, **label_config
    )
    model = MeanPoolingForSequenceClassification(config)
    return model if pretrained_encoder is None else load_encoder_weights(model, pretrained_encoder)


def load_encoder_weights(
    model: MeanPoolingForSequenceClassification, pretrained_encoder: nn.Module
) -> MeanPoolingForSequenceClassification:
    """`model` with `pretrained_encoder`'s weights in its encoder (its pooler, if any, left behind)."""
    missing, unexpected = model.encoder.load_state_dict(pretrained_encoder.state_dict(), strict=False)
    unexpected = [name for name in unexpected if not name.startswith("pooler.")]
    if missing or unexpected:  # the same config built both: a difference is a bug, not a user mistake
        raise RuntimeError(f"encoder weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


AutoConfig.register(MeanPoolingConfig.model_type, MeanPoolingConfig, exist_ok=True)
AutoModelForSequenceClassification.register(MeanPoolingConfig, MeanPoolingForSequenceClassification, exist_ok=True)
# What save_pretrained records in auto_map and copies into the folder (transformers' remote code).
MeanPoolingConfig.register_for_auto_class("AutoConfig")
MeanPoolingForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
