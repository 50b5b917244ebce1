"""LoRA adapters through peft: put one on a model in place, group what it trains, save it, load and merge it back.

`attach_adapter` wraps a Hugging Face model with peft's LoRA *in place*: the model object the stages train, prepare
with accelerate and call keeps working (its adapted linear layers now add B A), and the returned PeftModel is only
what a checkpoint saves. The head, whatever its family calls it (the modules holding the top layer group's
parameters and nothing else), trains fully as peft's `modules_to_save`, so it is saved in the adapter file too.

An adapter checkpoint is a folder with peft's adapter_config.json and adapter_model.safetensors (LoRA matrices and
the head: `PeftModel.from_pretrained(base, folder)` loads it), the model's config.json (its labels, and in
`architectures` the class the adapter was trained on), the tokenizer and finetune_recipe.yaml. Its base is the
checkpoint named by adapter_config.json's base_model_name_or_path, an absolute path for a local folder; it may be
an adapter checkpoint itself (ULMFiT's stage 3 with LoRA on stage 2's LoRA language model), loaded the same way.
`load_model` (models/loading.py) reads such a folder as base + adapter, merged into a plain model, so predict, eval,
generate and a later stage read it as any checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import transformers
from torch import nn

from finetune.errors import InputError
from finetune.models.backbones import Groups
from finetune.models.hub import _first_line
from finetune.models.loading import ADAPTER_CONFIG_FILE
from finetune.models.mean_pooling import backbone_config

ALL_LINEAR = "all-linear"  # peft's every linear layer but the output layer


class Adapted(NamedTuple):
    """A model with an adapter put in it: the PeftModel that a checkpoint saves, and the run's line about it."""

    model: Any  # peft's PeftModel around the adapted model
    summary: str


def carries_adapter(model: nn.Module) -> bool:
    """Whether peft has put an adapter in this model (it sets `peft_config` on the model it adapts in place): the
    fast training routes that read weights directly (models/masked_lm.py, causal_lm.py) would skip it."""
    return getattr(model, "peft_config", None) is not None


def base_reference(checkpoint: str) -> str:
    """What an adapter records as its base: a local folder's absolute path (so the adapter loads from any working
    directory), a hub name as it is."""
    return str(Path(checkpoint).resolve()) if Path(checkpoint).is_dir() else checkpoint


def head_modules(model: nn.Module, head: list[nn.Parameter]) -> tuple[list[str], list[nn.Parameter]]:
    """(names of the largest modules that hold head parameters and nothing else, head parameters outside them).

    A parameter outside them shares its module with backbone weights (a masked LM's output bias beside the decoder
    tied to the embeddings): peft can train only whole modules beside an adapter, so it stays frozen.
    """
    head_ids = {id(parameter) for parameter in head}
    chosen: list[str] = []
    covered: set[int] = set()
    for name, module in model.named_modules():  # a parent comes before its children
        parameters = list(module.parameters())
        inside = any(name.startswith(f"{taken}.") for taken in chosen)
        if name and parameters and not inside and all(id(parameter) in head_ids for parameter in parameters):
            chosen.append(name)
            covered.update(id(parameter) for parameter in parameters)
    return chosen, [parameter for parameter in head if id(parameter) not in covered]


def default_target_modules(model_type: str) -> tuple[list[str] | str, str]:
    """(peft's LoRA targets for a family, where they come from): its own choice (names, or a pattern), else every
    linear layer."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as CHOICES

    if model_type in CHOICES:
        choice = CHOICES[model_type]
        return choice if isinstance(choice, str) else list(choice), f"peft's choice for {model_type}"
    return ALL_LINEAR, f"every linear layer of the blocks: peft has no choice for {model_type}"


def attach_adapter(model, adapter, groups: Groups, base: str, recurrent: bool = False) -> Adapted:
    """Put the recipe's LoRA adapter (`adapter`: recipes/adapters.py's section) on `model` in place, the head (the
    top of its layer `groups`) trained fully; returns the PeftModel a checkpoint saves. `base`: the checkpoint the
    model was loaded from; `recurrent`: the model is an LSTM (models/families.py knows, which imports this module
    through the loaders). Refusals are InputErrors, named by the caller (`recipe_key("model.adapter")`)."""
    from peft import LoraConfig, get_peft_model

    model_type = backbone_config(model.config).model_type
    if recurrent:
        raise InputError(
            f"LoRA adapts a transformer's linear layers; {base} is a '{model_type}' model: train it without an "
            "adapter (ULMFiT's gradual unfreezing and discriminative LRs fine-tune it whole)",
            value=model_type,
        )
    head, left_frozen = head_modules(model, groups[-1])
    targets, chosen_by = (
        (adapter.target_modules, "model.adapter.target_modules")
        if adapter.target_modules
        else default_target_modules(model_type)
    )
    # GPT-2 stores its linear layers transposed (Conv1D): peft wants to be told, else it warns and finds out.
    transposed = any(isinstance(module, transformers.pytorch_utils.Conv1D) for module in model.modules())
    config = LoraConfig(
        fan_in_fan_out=transposed,
        r=adapter.rank,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=targets,
        modules_to_save=head or None,
    )
    try:
        adapted = get_peft_model(model, config)
    except ValueError as error:  # no such layer, or one LoRA cannot adapt: peft's first line says which
        raise InputError(
            f"LoRA cannot adapt {', '.join(_as_list(targets))} of this '{model_type}' model ({_first_line(error)}); "
            f"its linear layers: {', '.join(linear_layer_names(model))}",
            value=targets,
        ) from None
    # Set after: get_peft_model takes the model's own name_or_path, which a model built here (mean pooling) lacks.
    adapted.peft_config["default"].base_model_name_or_path = base_reference(base)
    return Adapted(adapted, adapter_summary(adapted, adapter, chosen_by, head, left_frozen))


def adapter_summary(adapted, adapter, chosen_by: str, head: list[str], left_frozen: list[nn.Parameter]) -> str:
    """The run's line about its adapter: where LoRA went (and who chose it), the head, what trains."""
    from peft.tuners.lora import LoraLayer

    # The layers that got LoRA: peft's all-linear resolves to names of the head too, which it then leaves out.
    targets = sorted(
        {name.rpartition(".")[2] for name, module in adapted.named_modules() if isinstance(module, LoraLayer)}
    )
    parameters = list(adapted.parameters())
    trainable = sum(parameter.numel() for parameter in parameters if parameter.requires_grad)
    # The frozen ones are the model's own, the head's original copy included: its size before the adapter.
    frozen = sum(parameter.numel() for parameter in parameters if not parameter.requires_grad)
    kept = sum(parameter.numel() for parameter in left_frozen)
    note = f"; {kept:,} head parameters stay frozen (their module holds tied weights too)" if kept else ""
    return (
        f"adapter: LoRA rank {adapter.rank}, alpha {adapter.alpha:g}, dropout {adapter.dropout:g} on "
        f"{', '.join(targets)} ({chosen_by}); trained fully: {', '.join(head) or 'nothing'}{note}; "
        f"{trainable:,} trainable parameters, {trainable / frozen:.2%} of the model's {frozen:,}"
    )


def linear_layer_names(model: nn.Module) -> list[str]:
    """The distinct last names of a model's linear layers (what target_modules may name)."""
    linear = (nn.Linear, transformers.pytorch_utils.Conv1D)
    return sorted({name.rpartition(".")[2] for name, module in model.named_modules() if isinstance(module, linear)})


def trainable_groups(groups: Groups) -> Groups:
    """The layer groups of an adapted model, each holding only its trainable parameters (its LoRA matrices, the
    head); a group left with none (the embeddings, without LoRA there) is dropped: thawing it would train nothing."""
    kept = [[parameter for parameter in group if parameter.requires_grad] for group in groups]
    return [group for group in kept if group]


def idle_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters peft keeps but never runs: each head module's original beside its trained copy."""
    from peft.utils import ModulesToSaveWrapper

    return {
        id(parameter)
        for module in model.modules()
        if isinstance(module, ModulesToSaveWrapper)
        for parameter in module.original_module.parameters()
    }


def save_adapter(adapted, folder: Path) -> None:
    """The adapter in peft's format, with the model's config.json (labels, the class it was trained on) beside it."""
    card = Path(folder) / "README.md"
    had_card = card.exists()
    # save_embedding_layers=False: peft would otherwise look the base up on the hub to see if its vocabulary grew.
    adapted.save_pretrained(str(folder), save_embedding_layers=False)
    if not had_card:
        card.unlink(missing_ok=True)  # peft's empty template: the run writes its own card
    model = adapted.get_base_model()
    pin_target_modules(Path(folder) / ADAPTER_CONFIG_FILE, adapted_module_names(model))
    model.config.architectures = [type(model).__name__]  # what save_pretrained records for a whole model
    model.config.save_pretrained(str(folder))


def adapted_module_names(model: nn.Module) -> list[str]:
    """The full names of the modules that got LoRA, as peft matches them in the model it adapts."""
    from peft.tuners.lora import LoraLayer

    return [name for name, module in model.named_modules() if isinstance(module, LoraLayer)]


def pin_target_modules(config_file: Path, names: list[str]) -> None:
    """Record the adapted modules in adapter_config.json by their full names (one pattern peft matches whole), not by
    their last names ("query"). Loaded on a model of another class, whose modules are named differently (a family's
    own classifier, "bert.encoder...", where the adapter was trained on a mean-pooling head, "encoder.encoder..."),
    peft then stops with "Target modules ... not found in the base model" instead of leaving the LoRA matrices and
    the head unloaded with a warning and predicting at chance."""
    stored = json.loads(config_file.read_text())
    stored["target_modules"] = "|".join(re.escape(name) for name in names)
    config_file.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")


def _as_list(targets: Any) -> list[str]:
    return [targets] if isinstance(targets, str) else sorted(targets)
