"""Extractive question-answering models (task kind spans): a start and an end score per token on a pretrained
backbone, saved so that `AutoModelForQuestionAnswering.from_pretrained` (and the question-answering pipeline) loads
them. `config.version_2_with_negative` records whether the model may answer "no answer" (SQuAD 2.0)."""

from __future__ import annotations

import copy

from transformers import AutoConfig, AutoModelForQuestionAnswering
from transformers.models.auto.modeling_auto import MODEL_FOR_QUESTION_ANSWERING_MAPPING

from finetune.errors import CheckpointError
from finetune.models.hub import load_model, load_pretrained, resolve_checkpoint

NO_ANSWER_KEY = "version_2_with_negative"  # Hugging Face run_qa's name for it


def refuse_without_qa_head(config, checkpoint: str) -> None:
    """A family transformers has no question-answering class for (the AWD-LSTM, an n-gram model): one line."""
    if type(config) not in MODEL_FOR_QUESTION_ANSWERING_MAPPING:
        raise CheckpointError(f"{checkpoint} is a '{config.model_type}' model, which has no question-answering head: "
                              "answer questions with a transformer encoder (BERT family)", source=checkpoint,
                              value=config.model_type)


def load_qa_model(backbone_config, version_2: bool):
    """A question-answering model on the backbone, pretrained or freshly initialised (init random)."""
    source, trusted = resolve_checkpoint(backbone_config.checkpoint), backbone_config.trust_remote_code
    config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trusted)
    config.update({NO_ANSWER_KEY: version_2})  # saved in config.json (from_pretrained drops unknown keywords)
    refuse_without_qa_head(config, backbone_config.checkpoint)
    if backbone_config.init == "random":
        return AutoModelForQuestionAnswering.from_config(config, trust_remote_code=trusted)
    return load_model(AutoModelForQuestionAnswering, source, trust_remote_code=trusted, config=config)


def qa_skeleton(stored, checkpoint: str):
    """The model `load_qa_model` builds on a checkpoint whose config is `stored`, with fresh weights and no file
    read (`finetune profile`, under `torch.device("meta")`)."""
    config = copy.deepcopy(stored)
    refuse_without_qa_head(config, checkpoint)
    return AutoModelForQuestionAnswering.from_config(config)


def load_finetuned_qa(name: str, *, trust_remote_code: bool = False):
    """A fine-tuned question-answering model (a `finetune` run's checkpoint of kind spans)."""
    source = resolve_checkpoint(name)
    config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trust_remote_code)
    refuse_without_qa_head(config, name)
    architectures = getattr(config, "architectures", None) or []
    if not any(architecture.endswith("ForQuestionAnswering") for architecture in architectures):
        raise CheckpointError(f"{name} is no question-answering model ({', '.join(architectures) or 'no architecture'})"
                              ": fine-tune it on a task of kind spans first", source=name)
    return load_model(AutoModelForQuestionAnswering, source, trust_remote_code=trust_remote_code, config=config)


def answers_no_answer(model) -> bool:
    """Whether the model may predict "no answer" (trained on SQuAD 2.0-style data)."""
    return bool(getattr(model.config, NO_ANSWER_KEY, False))
