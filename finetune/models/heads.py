"""Task heads on Hugging Face backbones: load a checkpoint as a sequence classifier or regressor."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForSequenceClassification

from finetune.console import console
from finetune.errors import UserError
from finetune.glue.specs import TaskSpec
from finetune.models.hub import load_pretrained, resolve_checkpoint


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
    config = load_pretrained(AutoConfig.from_pretrained, source, "model.checkpoint",
                             classifier_dropout=classifier_dropout, **label_config(spec))
    try:
        if backbone_config.init == "random":
            return AutoModelForSequenceClassification.from_config(config)
        return load_pretrained(AutoModelForSequenceClassification.from_pretrained, source, "model.checkpoint",
                               config=config)
    except ValueError as error:
        if "Unrecognized configuration class" not in str(error):
            raise
        raise UserError(f"model.checkpoint: {backbone_config.checkpoint} is a '{config.model_type}' model, which has "
                        "no sequence-classification head yet") from None


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
    model = load_pretrained(AutoModelForSequenceClassification.from_pretrained, source, key)
    expected = label_config(spec)["id2label"]
    stored = {int(index): label for index, label in model.config.id2label.items()}
    if stored != expected:
        raise UserError(f"{key}: {name} predicts labels {stored}, but task '{spec.name}' has {expected}")
    return model
