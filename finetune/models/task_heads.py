"""What every task kind with a Hugging Face Auto class of its own does alike (tagging, multiple choice, question
answering): build its model on a backbone, size it for `finetune profile`, and load a fine-tuned one, each refusing a
family the Auto class has no model for in one line.

Each kind's Auto class is its recipe section's `auto_class_name` (kinds/K/recipe.py): this layer lies below the kinds'
objects (finetune/kinds/registry.py) and above the recipes, so it asks the recipes' table of sections (TASK_SECTIONS)
which kinds a checkpoint can be fine-tuned for.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import transformers
from transformers import AutoConfig

from finetune.errors import CheckpointError
from finetune.models.backbones import layer_groups
from finetune.models.hub import load_pretrained, resolve_checkpoint
from finetune.models.loading import load_model
from finetune.recipes.task import TASK_SECTIONS

if TYPE_CHECKING:  # finetune.kinds.recipe loads through finetune.recipes, whose package imports every section
    from finetune.kinds.recipe import TaskSection

AUTO_CLASS_PREFIX = "AutoModel"  # AutoModelForTokenClassification: a saved model's class ends ForTokenClassification


def auto_class_of(section: type[TaskSection]) -> Any:
    """transformers' Auto class of a kind's models (its section's auto_class_name): transformers' own classes and
    those registered with it (ours: the AWD-LSTM's classifier and tagger, GPT-2's multiple-choice head)."""
    return getattr(transformers, section.auto_class_name)


def has_a_head(section: type[TaskSection], config) -> bool:
    """Whether the kind's Auto class has a model for this config's family (its config class -> model class mapping)."""
    return type(config) in auto_class_of(section)._model_mapping


def kinds_with_a_head(config) -> list[str]:
    """The task kinds (task.kind) a checkpoint of this config can be fine-tuned for: those with a head for it."""
    return [kind for kind, section in TASK_SECTIONS.items() if has_a_head(section, config)]


def no_head_refusal(checkpoint: str, config, head: str, instead: str) -> CheckpointError:
    """One line for a family without `head` ("multiple-choice head"): what the checkpoint is, the task kinds it
    can be fine-tuned for, and `instead` (which models have that head)."""
    kinds = kinds_with_a_head(config)
    can = f"it fine-tunes for task kinds {', '.join(kinds)}" if kinds else "it has a head for no task kind"
    return CheckpointError(
        f"{checkpoint} is a '{config.model_type}' model, which has no {head}: {can}; {instead}", value=config.model_type
    )


@dataclass(frozen=True)
class TaskHead:
    """A task kind's Auto class (its section's) and how its messages name it."""

    section: type[TaskSection]  # the kind's recipe section: its kind_name and auto_class_name
    called: str  # what a model of the kind is called: "tagger", ...
    head: str  # what a family without one lacks: "token-classification head", ...
    instead: str  # what a user who wants the kind can use instead: which models have such a head

    @property
    def auto_class(self) -> Any:
        """e.g. AutoModelForTokenClassification."""
        return auto_class_of(self.section)

    @property
    def kind(self) -> str:
        """The task kind that trains one (task.kind)."""
        return self.section.kind_name

    @property
    def class_ending(self) -> str:
        """What the name of such a model's class ends with (config.json's architectures): ForTokenClassification."""
        return self.section.auto_class_name.removeprefix(AUTO_CLASS_PREFIX)

    def refuse_family_without(self, config, checkpoint: str) -> None:
        """A family the Auto class has no model for (a decoder for multiple choice, an n-gram model): one line."""
        if not has_a_head(self.section, config):
            raise no_head_refusal(checkpoint, config, self.head, self.instead)

    def is_saved_in(self, config) -> bool:
        """Whether a checkpoint's config.json says it holds a model of this kind."""
        return any(name.endswith(self.class_ending) for name in getattr(config, "architectures", None) or [])

    def build(
        self,
        backbone_config,
        config_keys: dict | None = None,
        extra_keys: dict | None = None,
        new_labels: int | None = None,
    ):
        """The kind's model on the backbone, pretrained or freshly initialised (init random). `config_keys` go to
        `from_pretrained`; `extra_keys`, which it would drop (keys no config class declares), are set after.
        `new_labels`: a checkpoint of this kind already (a warm start) gets a new output layer of that size."""
        source, trusted = resolve_checkpoint(backbone_config.checkpoint), backbone_config.trust_remote_code
        config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trusted, **(config_keys or {}))
        config.update(extra_keys or {})
        self.refuse_family_without(config, backbone_config.checkpoint)
        if backbone_config.init == "random":
            return self.auto_class.from_config(config, trust_remote_code=trusted)
        label_counts = None
        if new_labels is not None:
            stored = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trusted)
            label_counts = (stored.num_labels, new_labels) if self.is_saved_in(stored) else None
        return load_model(self.auto_class, source, trust_remote_code=trusted, label_counts=label_counts, config=config)

    def skeleton(self, stored, checkpoint: str, config_keys: dict | None = None):
        """The model `build` makes on a checkpoint whose config is `stored`, with fresh weights and no file read
        (`finetune profile`, under `torch.device("meta")`)."""
        config = copy.deepcopy(stored)
        config.update(config_keys or {})
        self.refuse_family_without(config, checkpoint)
        return self.auto_class.from_config(config)

    def load_finetuned(self, name: str, *, trust_remote_code: bool = False):
        """A `finetune` run's checkpoint of this kind; another model is refused in one line."""
        source = resolve_checkpoint(name)
        config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trust_remote_code)
        self.refuse_family_without(config, name)
        if not self.is_saved_in(config):
            architectures = ", ".join(getattr(config, "architectures", None) or []) or "no architecture"
            raise CheckpointError(
                f"{name} is no {self.called} ({architectures}): fine-tune it on a task of kind {self.kind} first",
                source=name,
            )
        return load_model(self.auto_class, source, trust_remote_code=trust_remote_code, config=config)


def renew_head(model) -> int:
    """Fresh weights for the task head a fine-tuned checkpoint brought, which `model.new_head` replaces even where
    its labels are the task's (an intermediate task's head must not carry over to the target task: STILTs trains the
    target's head anew). The head is what lies outside the backbone (`model.base_model`, so a BERT pooler stays as
    pretrained) and in the top layer group (so a bidirectional AWD-LSTM's backward encoder stays too). Returns the
    parameters renewed."""
    head = {id(parameter) for parameter in layer_groups(model)[-1]}
    head -= {id(parameter) for parameter in model.base_model.parameters()}
    renewed = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if not own or any(id(parameter) not in head for parameter in own):
            continue
        for parameter in own:
            parameter._is_hf_initialized = False  # transformers skips tensors so marked
        model._init_weights(module)
        renewed += sum(parameter.numel() for parameter in own)
    return renewed
