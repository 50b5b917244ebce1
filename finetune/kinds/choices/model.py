"""Multiple-choice models (task kind choices): a score per choice on a pretrained backbone, saved so that
`AutoModelForMultipleChoice.from_pretrained` loads them.

Encoders use transformers' own class (BertForMultipleChoice and its kin: the pooled [CLS] of each (question, choice)
pair, a linear scorer). transformers has none for GPT-2, so this module adds GPT's (Radford et al. 2018): each
choice read as question + delimiter + choice + delimiter, the last token's state scored by a linear layer.
Importing this module registers it with AutoModelForMultipleChoice (what a loading script must do too).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModelForMultipleChoice, GPT2Config, GPT2Model, GPT2PreTrainedModel
from transformers.modeling_outputs import MultipleChoiceModelOutput
from transformers.models.auto.modeling_auto import MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES

from finetune.kinds.choices.recipe import ChoicesSection
from finetune.models.task_heads import TaskHead


class GPT2ForMultipleChoice(GPT2PreTrainedModel):
    """GPT's multiple-choice head: the state of each choice's last real token (right padding: the attention mask
    says which), dropout and a linear scorer; logits of shape (questions, choices)."""

    reads_last_token = True  # EncodedChoices encodes GPT's way for it: question, delimiter, choice, delimiter

    def __init__(self, config: GPT2Config):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(config.summary_first_dropout if dropout is None else dropout)
        self.scorer = nn.Linear(config.n_embd, 1)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> MultipleChoiceModelOutput:
        questions, choices, length = input_ids.shape
        flat_mask = attention_mask.reshape(-1, length)
        states = self.transformer(input_ids.reshape(-1, length), attention_mask=flat_mask).last_hidden_state
        last = flat_mask.sum(dim=1) - 1
        pooled = states[torch.arange(states.shape[0], device=states.device), last]
        logits = self.scorer(self.dropout(pooled)).view(questions, choices)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return MultipleChoiceModelOutput(loss=loss, logits=logits)


AutoModelForMultipleChoice.register(GPT2Config, GPT2ForMultipleChoice, exist_ok=True)
REGISTERING_IMPORT = "import finetune.kinds.choices.model  # registers GPT-2's multiple-choice head\n"


def choice_registering_import(model_type: str) -> str:
    """The import a loading script needs for a multiple-choice model of `model_type`: ours (GPT-2's) registers
    with the Auto class on import; transformers' own need none."""
    return "" if model_type in MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES else REGISTERING_IMPORT


def reads_last_token(model) -> bool:
    """Whether the model scores a choice GPT's way (a delimiter between question and choice, and at the end)."""
    return getattr(model, "reads_last_token", False)


CHOICES = TaskHead(
    ChoicesSection,
    "multiple-choice model",
    "multiple-choice head",
    "answer multiple-choice questions with an encoder (bert, roberta, deberta-v2, mpnet, ...) or gpt2",
)


def load_choice_model(backbone_config, classifier_dropout: float | None = None):
    """A multiple-choice model on the backbone, pretrained or freshly initialised (init random)."""
    dropout = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
    return CHOICES.build(backbone_config, dropout)


def choice_model_skeleton(stored, checkpoint: str):
    """The model `load_choice_model` builds on a checkpoint whose config is `stored`, with fresh weights and no file
    read (`finetune profile`, under `torch.device("meta")`)."""
    return CHOICES.skeleton(stored, checkpoint)


def load_finetuned_choice_model(name: str, *, trust_remote_code: bool = False):
    """A fine-tuned multiple-choice model (a `finetune` run's checkpoint of kind choices)."""
    return CHOICES.load_finetuned(name, trust_remote_code=trust_remote_code)
