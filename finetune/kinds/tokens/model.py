"""Token-classification models (task kind tokens): a tag per token on a pretrained backbone, saved so that
`AutoModelForTokenClassification.from_pretrained` loads them with their tags (config.id2label)."""

from __future__ import annotations

from finetune.kinds.tokens.recipe import TokensSection
from finetune.models.task_heads import TaskHead


def tag_config(tags) -> dict:
    """The config entries that store the tags with the checkpoint."""
    return {
        "num_labels": len(tags),
        "id2label": dict(enumerate(tags)),
        "label2id": {tag: index for index, tag in enumerate(tags)},
    }


TAGGER = TaskHead(
    TokensSection,
    "tagger",
    "token-classification head",
    "tag with an encoder (bert, roberta, deberta-v2, ...), a decoder with one (gpt2, llama, qwen2, ...) or the "
    "awd_lstm",
)


def load_tagger(backbone_config, tags, classifier_dropout: float | None = None):
    """A token-classification model for `tags` on the backbone, pretrained or freshly initialised (init random); a
    tagger of other tags (a warm start) gets a new output layer, anything else must fit as stored."""
    dropout = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
    return TAGGER.build(backbone_config, {**dropout, **tag_config(tags)}, new_labels=len(tags))


def tagger_skeleton(stored, tags, checkpoint: str):
    """The tagger `load_tagger` builds on a checkpoint whose config is `stored`, with fresh weights and no file read
    (`finetune profile`, under `torch.device("meta")`)."""
    return TAGGER.skeleton(stored, checkpoint, tag_config(tags))


def load_finetuned_tagger(name: str, *, trust_remote_code: bool = False):
    """A fine-tuned tagger (a `finetune` run's checkpoint of kind tokens) with its tags in config.id2label."""
    return TAGGER.load_finetuned(name, trust_remote_code=trust_remote_code)


def model_tags(model) -> tuple[str, ...]:
    """A tagger's tags, in output order."""
    return tuple(model.config.id2label[index] for index in range(model.config.num_labels))
