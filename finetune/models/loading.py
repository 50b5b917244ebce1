"""Loading checkpoints whole: `load_model` reads a folder of weights, a hub name, or a LoRA adapter folder as its base
with the adapter merged in, so that predict, eval, generate and a later stage read any of them the same way.

An adapter checkpoint (models/adapters.py writes it) is a folder with peft's adapter_config.json and
adapter_model.safetensors, the model's config.json (its labels, and in `architectures` the class the adapter was
trained on), the tokenizer and finetune_recipe.yaml. Its base, adapter_config.json's base_model_name_or_path, may be
an adapter checkpoint itself (ULMFiT's stage 3 with LoRA on stage 2's LoRA language model), loaded the same way.
models/hub.py reads plain folders and names; this module sits above it, so that hub imports nothing of adapters.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModel

from finetune.console import console
from finetune.errors import CheckpointError
from finetune.models.hub import (
    _first_line,
    _held_load_report,
    is_classifier,
    load_model_folder,
    load_pretrained,
    resolve_checkpoint,
    stored_architectures,
)
from finetune.models.mean_pooling import MeanPoolingConfig, load_encoder_weights

ADAPTER_CONFIG_FILE = "adapter_config.json"  # peft's names
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# The Auto classes whose models the toolkit trains: one of them built the model an adapter was trained on.
TRAINED_AUTO_CLASSES = (
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForMultipleChoice",
    "AutoModelForMaskedLM",
    "AutoModelForCausalLM",
)


def load_model(
    model_class, name: str, *, trust_remote_code: bool = False, label_counts: tuple[int, int] | None = None, **kwargs
):
    """`model_class`'s model from `name` (hub.load_model_folder's arguments): a LoRA adapter's folder loads as its
    base with the adapter merged in."""
    if Path(name).is_dir() and is_adapter_checkpoint(name):
        return load_adapter_checkpoint(
            model_class, name, trust_remote_code=trust_remote_code, label_counts=label_counts, **kwargs
        )
    return load_model_folder(
        model_class, name, trust_remote_code=trust_remote_code, label_counts=label_counts, **kwargs
    )


def is_adapter_checkpoint(name: str | Path) -> bool:
    """Whether a local folder holds a peft adapter (adapter_config.json) rather than whole weights."""
    return (Path(name) / ADAPTER_CONFIG_FILE).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base checkpoint an adapter folder names, resolved (a CheckpointError when it is gone)."""
    try:
        stored = json.loads((Path(folder) / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {ADAPTER_CONFIG_FILE} ({_first_line(error)})", source=folder) from None
    base = stored.get("base_model_name_or_path") if isinstance(stored, dict) else None
    if not isinstance(base, str) or not base:
        raise CheckpointError(f"{ADAPTER_CONFIG_FILE} names no base_model_name_or_path", source=folder)
    try:
        return resolve_checkpoint(base)
    except CheckpointError as error:
        raise CheckpointError(
            f"{folder} is a LoRA adapter on {base}, which cannot be read ({error.reason}): put that "
            f"checkpoint back, or load a merged model (`finetune merge {folder} MERGED` where the base is there)",
            value=base,
        ) from None


def trained_class(config, folder: str | Path):
    """The model class an adapter was trained on, named by its config.json's `architectures`."""
    name = (getattr(config, "architectures", None) or [None])[0]
    for auto_name in TRAINED_AUTO_CLASSES:
        mapping = getattr(transformers, auto_name)._model_mapping
        if type(config) in mapping and mapping[type(config)].__name__ == name:
            return mapping[type(config)]
    found = getattr(transformers, name, None) if name else None
    if found is None:
        raise CheckpointError(f"config.json names no model class the adapter was trained on ({name})", source=folder)
    return found


def load_base_model(model_class, base: str, config, trust_remote_code: bool = False, **kwargs):
    """The model an adapter was trained on, before training: `config`'s model of `model_class` with the base
    checkpoint's weights (a head the base does not hold starts fresh: the adapter file holds the trained one)."""
    if isinstance(config, MeanPoolingConfig):  # our head on the base's encoder, as models/heads.py builds it
        encoder = load_model(AutoModel, base, trust_remote_code=trust_remote_code)
        return load_encoder_weights(model_class(config), encoder)
    stored = load_pretrained(AutoConfig.from_pretrained, base, trust_remote_code=trust_remote_code)
    # A warm start from a classifier of other labels: its output layer, of another size, is renewed.
    counts = (stored.num_labels, config.num_labels) if is_classifier(stored) else None
    return load_model(
        model_class, base, trust_remote_code=trust_remote_code, config=config, label_counts=counts, **kwargs
    )


def load_adapter_checkpoint(model_class, folder: str, *, trust_remote_code: bool = False, config=None, **kwargs):
    """An adapter checkpoint as a plain model of `model_class` (an Auto class or a model class): its base with the
    adapter merged in. `config` and the other keywords are `load_model`'s; another class or config than the adapter
    was trained with (a classifier on a masked LM's adapter) reads the merged weights as from a folder."""
    from peft import PeftModel

    stored = load_pretrained(AutoConfig.from_pretrained, folder, trust_remote_code=trust_remote_code)
    own_class = trained_class(stored, folder)
    label_counts = kwargs.pop("label_counts", None)  # the folder's own head to `config`'s (a warm start)
    same = config is None or config.to_dict() == stored.to_dict()
    with _held_load_report() as report:
        model = load_base_model(own_class, adapter_base(folder), stored, trust_remote_code, **(kwargs if same else {}))
        report.discard()  # the head it lists as new is in the adapter file
    merged = PeftModel.from_pretrained(model, folder).merge_and_unload()
    merged.config._name_or_path = str(folder)
    mapping = getattr(model_class, "_model_mapping", None)
    wanted = mapping[type(stored)] if mapping is not None and type(stored) in mapping else model_class
    if same and wanted is own_class:
        return merged
    with tempfile.TemporaryDirectory() as scratch:  # the merged weights read as a folder of them would be
        merged.save_pretrained(scratch)
        return load_model(
            model_class,
            scratch,
            trust_remote_code=trust_remote_code,
            config=config,
            label_counts=label_counts,
            **kwargs,
        )


def load_for_continued_pretraining(
    model_class,
    name: str,
    dropout: float | None,
    dropout_fields: Callable[[Any], Iterable[str]],
    check: Callable[[Any], None],
    **options,
):
    """A pretrained checkpoint as `model_class` (a family's class or an Auto class), to continue pretraining it
    (`model.checkpoint`).

    `check(config)` refuses a checkpoint of another family in one line; `dropout`, when given, replaces the
    checkpoint's own in every config field `dropout_fields(config)` names. The weights load in float32 whatever
    the checkpoint stores (bf16 hub weights included): mixed precision is the training loop's, by autocast.
    """
    source = resolve_checkpoint(name)
    config = load_pretrained(AutoConfig.from_pretrained, source)
    check(config)
    if dropout is not None:
        for field in dropout_fields(config):
            setattr(config, field, dropout)
    stored = [str(architecture) for architecture in config.architectures or []]
    if lacks_language_model_head(stored):
        # A bare encoder or decoder (a sentence-embedding checkpoint): transformers calls the tie of the head it
        # lacks "corrupted"; what happens is that the head starts fresh, which one line says instead.
        console.print(
            f"{name} holds no language-model head (a {stored[0]}): the head starts fresh, its output layer tied "
            "to the input embeddings where the family ties them",
            markup=False,
            highlight=False,
        )
        with _held_load_report() as report:
            model = load_model(model_class, source, config=config, dtype=torch.float32, **options)
            report.records[:] = [record for record in report.records if _TIE_WARNING not in record.getMessage()]
        return model
    return load_model(model_class, source, config=config, dtype=torch.float32, **options)


def lacks_language_model_head(architectures: list[str]) -> bool:
    """Whether a checkpoint whose config.json names these model classes holds no language-model head (a bare encoder
    or decoder: a sentence-embedding checkpoint), so that continuing it starts the head fresh; False when it names
    none (nothing known)."""
    return bool(architectures) and not any(name.endswith(LANGUAGE_MODEL_HEADS) for name in architectures)


def starts_head_fresh(name: str) -> bool | None:
    """Whether continuing checkpoint `name` starts its language-model head fresh (`lacks_language_model_head` of its
    stored config.json); None when its config is not stored on this machine yet (a hub name not fetched)."""
    architectures = stored_architectures(name)
    return None if architectures is None else lacks_language_model_head(architectures)


# Class-name endings of checkpoints that hold a language-model head (masked or causal; BERT's pretraining heads too).
LANGUAGE_MODEL_HEADS = ("ForMaskedLM", "ForCausalLM", "LMHeadModel", "ForPreTraining")
_TIE_WARNING = "This checkpoint seem corrupted. The tied weights mapping"
