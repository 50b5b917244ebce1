"""Extractive question-answering models (task kind spans): a start and an end score per token on a pretrained
backbone, saved so that `AutoModelForQuestionAnswering.from_pretrained` (and the question-answering pipeline) loads
them. `config.version_2_with_negative` records whether the model may answer "no answer" (SQuAD 2.0)."""

from __future__ import annotations

from finetune.kinds.spans.recipe import SpansSection
from finetune.models.task_heads import TaskHead

NO_ANSWER_KEY = "version_2_with_negative"  # Hugging Face run_qa's name for it


QA = TaskHead(
    SpansSection,
    "question-answering model",
    "question-answering head",
    "answer questions with an encoder (bert, roberta, deberta-v2, ...) or a decoder with one (gpt2, llama, "
    "qwen2, mistral, opt, gpt_neox)",
)


def load_qa_model(backbone_config, version_2: bool):
    """A question-answering model on the backbone, pretrained or freshly initialised (init random)."""
    # Set after loading and saved in config.json: from_pretrained drops a keyword no config class declares.
    return QA.build(backbone_config, extra_keys={NO_ANSWER_KEY: version_2})


def qa_skeleton(stored, checkpoint: str):
    """The model `load_qa_model` builds on a checkpoint whose config is `stored`, with fresh weights and no file
    read (`finetune profile`, under `torch.device("meta")`)."""
    return QA.skeleton(stored, checkpoint)


def load_finetuned_qa(name: str, *, trust_remote_code: bool = False):
    """A fine-tuned question-answering model (a `finetune` run's checkpoint of kind spans)."""
    return QA.load_finetuned(name, trust_remote_code=trust_remote_code)


def answers_no_answer(model) -> bool:
    """Whether the model may predict "no answer" (trained on SQuAD 2.0-style data)."""
    return bool(getattr(model.config, NO_ANSWER_KEY, False))
