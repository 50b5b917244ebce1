"""Task heads on Hugging Face backbones: load a checkpoint as a sequence classifier or regressor."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from finetune.console import console
from finetune.errors import UserError
from finetune.glue.specs import TaskSpec

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_checkpoint(name: str, key: str = "model.checkpoint") -> str:
    """A local model folder as is; a hub name (`org/model`) for transformers to fetch; anything else an error."""
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{key}: {path} has no config.json (not a Hugging Face model folder)")
        return str(path)
    if path.exists() or not _HUB_NAME.match(name):
        raise UserError(f"{key}: no such model folder: {name}")
    return name


def _from_hub_or_disk(loader, name: str, key: str, **kwargs):
    """Call a transformers `from_pretrained`, turning a failed download or bad folder into one line."""
    try:
        return loader(name, **kwargs)
    except OSError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{key}: cannot load '{name}': {first_line}") from None


def load_tokenizer(name: str, key: str = "model.checkpoint"):
    """The tokenizer saved with a checkpoint."""
    return _from_hub_or_disk(AutoTokenizer.from_pretrained, resolve_checkpoint(name, key), key)


def label_config(spec: TaskSpec) -> dict:
    """The config entries that store the task's label mapping with the checkpoint."""
    if spec.is_regression:
        return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"}, "label2id": {"score": 0}}
    return {
        "num_labels": spec.num_labels,
        "problem_type": "single_label_classification",
        "id2label": dict(enumerate(spec.labels)),
        "label2id": {label: index for index, label in enumerate(spec.labels)},
    }


def load_classifier(backbone_config, spec: TaskSpec, classifier_dropout: float):
    """A sequence-classification model for `spec` on the backbone, pretrained or freshly initialised."""
    source = resolve_checkpoint(backbone_config.checkpoint)
    config = _from_hub_or_disk(AutoConfig.from_pretrained, source, "model.checkpoint",
                               classifier_dropout=classifier_dropout, **label_config(spec))
    if backbone_config.init == "random":
        return AutoModelForSequenceClassification.from_config(config)
    return _from_hub_or_disk(AutoModelForSequenceClassification.from_pretrained, source, "model.checkpoint",
                             config=config)


def fitted_max_length(requested: int, model) -> int:
    """`task.max_length`, shortened to the positions the model has (a checkpoint pretrained on short blocks)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and requested > limit:
        console.print(f"task.max_length {requested} exceeds the model's {limit} positions: truncating to {limit}")
        return limit
    return requested


def load_finetuned(name: str, spec: TaskSpec, key: str):
    """A fine-tuned checkpoint whose stored label mapping must match the task's labels, in order."""
    source = resolve_checkpoint(name, key)
    model = _from_hub_or_disk(AutoModelForSequenceClassification.from_pretrained, source, key)
    expected = label_config(spec)["id2label"]
    stored = {int(index): label for index, label in model.config.id2label.items()}
    if stored != expected:
        raise UserError(f"{key}: {name} predicts labels {stored}, but task '{spec.name}' has {expected}")
    return model
