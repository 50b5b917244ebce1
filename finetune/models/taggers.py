"""Token-classification models (task kind tokens): a tag per token on a pretrained backbone, saved so that
`AutoModelForTokenClassification.from_pretrained` loads them with their tags (config.id2label)."""

from __future__ import annotations

import copy

from transformers import AutoConfig, AutoModelForTokenClassification
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

from finetune.errors import CheckpointError
from finetune.models.families import CAUSAL_MODEL_TYPES
from finetune.models.hub import load_model, load_pretrained, resolve_checkpoint


def tag_config(tags) -> dict:
    """The config entries that store the tags with the checkpoint."""
    return {"num_labels": len(tags), "id2label": dict(enumerate(tags)),
            "label2id": {tag: index for index, tag in enumerate(tags)}}


def refuse_without_tagging_head(config, checkpoint: str) -> None:
    """A family transformers has no token-classification class for (the AWD-LSTM, an n-gram model): one line."""
    if type(config) not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING:
        raise CheckpointError(f"{checkpoint} is a '{config.model_type}' model, which has no token-classification "
                              "head yet: tag with a transformer encoder (BERT family), GPT-2 or the AWD-LSTM",
                              source=checkpoint, value=config.model_type)


def load_tagger(backbone_config, tags, classifier_dropout: float | None = None):
    """A token-classification model for `tags` on the backbone, pretrained or freshly initialised (init random)."""
    source, trusted = resolve_checkpoint(backbone_config.checkpoint), backbone_config.trust_remote_code
    dropout = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
    config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trusted, **dropout,
                             **tag_config(tags))
    refuse_without_tagging_head(config, backbone_config.checkpoint)
    if backbone_config.init == "random":
        return AutoModelForTokenClassification.from_config(config, trust_remote_code=trusted)
    stored = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trusted)
    # A tagger of other tags (a warm start) gets a new output layer; anything else must fit as stored.
    label_counts = (stored.num_labels, len(tags)) if getattr(stored, "architectures", None) and any(
        name.endswith("ForTokenClassification") for name in stored.architectures) else None
    return load_model(AutoModelForTokenClassification, source, trust_remote_code=trusted, label_counts=label_counts,
                      config=config)


def tagger_skeleton(stored, tags, checkpoint: str):
    """The tagger `load_tagger` builds on a checkpoint whose config is `stored`, with fresh weights and no file read
    (`finetune profile`, under `torch.device("meta")`)."""
    config = copy.deepcopy(stored)
    config.update(tag_config(tags))
    refuse_without_tagging_head(config, checkpoint)
    return AutoModelForTokenClassification.from_config(config)


def load_finetuned_tagger(name: str, *, trust_remote_code: bool = False):
    """A fine-tuned tagger (a `finetune` run's checkpoint of kind tokens) with its tags in config.id2label."""
    source = resolve_checkpoint(name)
    config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trust_remote_code)
    refuse_without_tagging_head(config, name)
    architectures = getattr(config, "architectures", None) or []
    if not any(architecture.endswith("ForTokenClassification") for architecture in architectures):
        raise CheckpointError(f"{name} is no tagger ({', '.join(architectures) or 'no architecture'}): fine-tune it "
                              "on a task of kind tokens first", source=name)
    return load_model(AutoModelForTokenClassification, source, trust_remote_code=trust_remote_code, config=config)


def reads_left_to_right(config) -> bool:
    """Whether a tagger's encoder reads left to right (GPT-2, the AWD-LSTM): it then tags each word at its last
    token, having read all of it, where an encoder that reads both ways tags it at its first."""
    return config.model_type in CAUSAL_MODEL_TYPES


def model_tags(model) -> tuple[str, ...]:
    """A tagger's tags, in output order."""
    return tuple(model.config.id2label[index] for index in range(model.config.num_labels))
