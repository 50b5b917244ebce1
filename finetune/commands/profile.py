"""`finetune profile`: what a training recipe will cost before it runs: parameters, FLOPs, memory and time.

Nothing is trained, downloaded or written, and no data is read. The model is built on PyTorch's meta device
(shapes without storage) from the recipe's sizes, or from a checkpoint's config.json (a hub name only from the
local cache), so its parameter count is exact at any size. Per-step sizes come from the recipe (batch, block size
or BPTT, task.max_length); totals only with training.max_steps, since the steps per epoch depend on the data,
which profile does not count. FLOPs follow models/flops.py, memory models/sizes.py. The time is an estimate:
a step's FLOPs over this machine's matmul rate (measured here in a fraction of a second) at an assumed MFU.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from finetune.errors import CheckpointError, UserError, recipe_key
from finetune.kinds.registry import kind_named
from finetune.models.adapters import attach_adapter, idle_parameters
from finetune.models.backbones import layer_groups
from finetune.models.families import family_of, is_recurrent
from finetune.models.flops import (
    adapter_training_flops,
    lookup_tables,
    matmul_gflops,
    multiply_adds_per_token,
    training_flops,
)
from finetune.models.heads import fitted_max_length
from finetune.models.hub import load_pretrained, load_tokenizer, resolve_checkpoint
from finetune.models.language_models import VocabularyOfSize
from finetune.models.mean_pooling import backbone_config
from finetune.models.recurrent_cells import QRNNLayer, WeightDropout
from finetune.models.sizes import (
    BYTES_PER_VALUE,
    TRAINING_BYTES_PER_PARAMETER,
    lstm_layer_activation_bytes,
    parameter_count,
    transformer_layer_activation_bytes,
)
from finetune.recipes import FinetuneRecipe, IntermediateRecipe, PretrainRecipe, UlmfitRecipe
from finetune.recipes.intermediate import INTERMEDIATE_UPSTREAM
from finetune.recipes.multitask import MultiTaskRecipe
from finetune.recipes.ulmfit import ULMFIT_UPSTREAM
from finetune.training.loop import device_and_precision
from finetune.training.techniques import backbone_of, resolve_techniques
from finetune.training.unfreezing import trainable_group_count, trainable_group_count_at_step

DEFAULT_MFU = 0.5  # bench/README.md: the masked-LM pretraining reached 64-65% on a 2-core CPU; GPUs reach 30-60%
MB = 1e6
WHOLE_DOCUMENT_PROFILE_LENGTH = 512  # tokens per example counted for a classifier that reads whole documents
PRECISION_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class BuiltModel:
    """A stage's model on the meta device, its layer groups, and where its sizes came from."""

    model: PreTrainedModel
    groups: list[list[nn.Parameter]]
    blocks: slice  # which groups are layers (transformer blocks or LSTM layers)
    source: str
    adapter: str | None = None  # with model.adapter: the run's line about it (its groups hold frozen weights too)

    @property
    def unfrozen_groups(self) -> list[int]:
        """The indices of the groups that unfreezing thaws: every one, or with an adapter those it trains in."""
        if self.adapter is None:
            return list(range(len(self.groups)))
        return [index for index, group in enumerate(self.groups) if any(p.requires_grad for p in group)]


def profile_recipe(recipe, matmul_rate: float | None = None, mfu: float = DEFAULT_MFU) -> dict:
    """The profile of a pretrain or finetune recipe, or of each stage of a flow (ulmfit, intermediate) under
    "stages": a stage that starts from an earlier one's checkpoint is sized on that stage's model, not run yet; of a
    multitask recipe, each task's step (the encoder with that task's head) under "stages"."""
    rates = MatmulRates(matmul_rate)
    if isinstance(recipe, (UlmfitRecipe, IntermediateRecipe)):
        upstream_of = ULMFIT_UPSTREAM if isinstance(recipe, UlmfitRecipe) else INTERMEDIATE_UPSTREAM
        profiles = []
        models: dict[str, PreTrainedModel] = {}  # each stage's model: what a later stage starting from it is sized on
        for section, stage in recipe.stage_recipes().items():
            if stage is None:  # general_lm: {checkpoint: PATH}: stage 2 reads that checkpoint's config
                continue
            upstream = models.get(upstream_of.get(section, ""))
            stage = with_techniques(stage, upstream, section)
            built = stage_model(stage, upstream, section)
            profiles.append({"section": section, **stage_profile(stage, built, rates, mfu)})
            models[section] = built.model
        return {"stage": recipe.stage, "stages": profiles}
    if isinstance(recipe, MultiTaskRecipe):  # a step trains one task: each task's step, on the shared encoder
        profiles = []
        for index, task in enumerate(recipe.tasks):
            task = with_techniques(task)
            section = f"tasks.{index} ({task.task.name})"
            profiles.append({"section": section, **stage_profile(task, stage_model(task), rates, mfu)})
        return {"stage": recipe.stage, "stages": profiles}
    if not isinstance(recipe, (PretrainRecipe, FinetuneRecipe)):
        raise TypeError(f"profile_recipe takes a training recipe, not a {type(recipe).__name__}")
    recipe = with_techniques(recipe)
    return stage_profile(recipe, stage_model(recipe), rates, mfu)


# ---------------------------------------------------------------------------------------------
# The model, built on the meta device
# ---------------------------------------------------------------------------------------------


def stage_model(recipe, upstream: PreTrainedModel | None = None, section: str = "") -> BuiltModel:
    """The stage's model as it would start training, with its adapter if the recipe has one (models/adapters.py);
    `upstream`: the previous ulmfit stage's model, whose config stands in for its checkpoint until that stage has
    run."""
    built = backbone_model(recipe, upstream, section)
    adapter = getattr(recipe.model, "adapter", None)
    if adapter is None:
        return built
    prefix = f"{section}." if section else ""
    with torch.device("meta"), recipe_key(f"{prefix}model.adapter"):
        summary = attach_adapter(built.model, adapter, built.groups, recipe.model.checkpoint).summary
    finder = family_of(recipe.model).layer_groups if isinstance(recipe, PretrainRecipe) else layer_groups
    idle = idle_parameters(built.model)  # the head's original copy: in memory (counted there), never computed
    groups = [[parameter for parameter in group if id(parameter) not in idle] for group in finder(built.model)]
    return replace(built, groups=groups, adapter=summary)


def backbone_model(recipe, upstream: PreTrainedModel | None = None, section: str = "") -> BuiltModel:
    """The stage's model without an adapter (see `stage_model`)."""
    prefix = f"{section}." if section else ""
    config, source = stage_checkpoint_config(recipe, upstream, prefix)
    with torch.device("meta"):
        if isinstance(recipe, FinetuneRecipe):
            model = kind_named(recipe.task.kind).profile_model(recipe, config)
            return BuiltModel(model, layer_groups(model), slice(1, -1), source)
        family = family_of(recipe.model)
        if config is None:
            if family.counted:
                raise UserError(
                    f"model.family {recipe.model.family} is counted from the corpus by `finetune "
                    "pretrain`; it has no sizes to build and no training to profile or range-test"
                )
            model = family.build(recipe.model, pretraining_vocabulary(recipe), max_positions(recipe))
            source += (
                "; vocabulary: the tokenizer at tokenizer.path"
                if recipe.tokenizer.path is not None
                else "; vocabulary: at most tokenizer.vocab_size (the run trains its tokenizer on the corpus)"
            )
        else:
            with recipe_key(f"{prefix}model.checkpoint"):
                family.check_checkpoint(config, recipe.model.checkpoint)
            if recipe.tokenizer.new_vocabulary:  # at most this many pieces, trained on the new text
                config.vocab_size = recipe.tokenizer.vocab_size
                source += f"; vocabulary: at most tokenizer.vocab_size={recipe.tokenizer.vocab_size}"
            model = family.from_config(config)
    assert isinstance(model, PreTrainedModel)  # every family's model is a transformers one (typed nn.Module there)
    return BuiltModel(model, family.layer_groups(model), family.layer_blocks, source)


def stage_checkpoint_config(recipe, upstream: PreTrainedModel | None, prefix: str):
    """(config, where it came from) of the checkpoint the stage starts from, or (None, ...) for a model built from
    the recipe's sizes."""
    checkpoint = recipe.model.checkpoint
    if checkpoint is None:
        return None, "the recipe's sizes"
    if upstream is not None and not (Path(checkpoint) / "config.json").is_file():
        return copy.deepcopy(upstream.config), "the previous stage's model (not trained yet)"
    return checkpoint_config(checkpoint, f"{prefix}model.checkpoint", getattr(recipe.model, "trust_remote_code", False))


def with_techniques(recipe, upstream: PreTrainedModel | None = None, section: str = ""):
    """A finetune recipe with the techniques it leaves open decided by its backbone, as the stage decides them."""
    if not isinstance(recipe, FinetuneRecipe):
        return recipe
    config, _ = stage_checkpoint_config(recipe, upstream, f"{section}." if section else "")
    return resolve_techniques(recipe, backbone_of(config, recipe.model.checkpoint, local_files_only=True)).recipe


def checkpoint_config(name: str, key: str, trust_remote_code: bool):
    """A checkpoint's config.json, from its folder or the local Hugging Face cache: profile downloads nothing."""
    with recipe_key(key):
        source = resolve_checkpoint(name)
        try:
            config = load_pretrained(
                AutoConfig.from_pretrained, source, trust_remote_code=trust_remote_code, local_files_only=True
            )
        except CheckpointError as error:
            if Path(name).is_dir():
                raise
            raise UserError(
                f"{key}: {name} is no local folder, and its config.json is not in the local Hugging Face "
                "cache (profile downloads nothing: give a folder, or load the model once with a "
                "network)"
            ) from error
    return config, f"{name} (config.json)"


def pretraining_vocabulary(recipe: PretrainRecipe) -> VocabularyOfSize:
    """A reused tokenizer's exact size, else tokenizer.vocab_size: a tokenizer trained on the corpus has at most
    that many pieces (it is trained when the run starts)."""
    if recipe.tokenizer.path is not None:
        with recipe_key("tokenizer.path"):
            return VocabularyOfSize(len(load_tokenizer(str(recipe.tokenizer.path))))
    return VocabularyOfSize(recipe.tokenizer.vocab_size)


def max_positions(recipe: PretrainRecipe) -> int | None:
    """The position table of a new transformer, as the pretrain stage sizes it (an LSTM or an n-gram model has none)."""
    return family_of(recipe.model).max_positions(recipe.model, recipe.corpus.block_size)


# ---------------------------------------------------------------------------------------------
# The figures
# ---------------------------------------------------------------------------------------------


def stage_profile(recipe, built: BuiltModel, rates: MatmulRates, mfu: float) -> dict:
    """Parameters, FLOPs, memory and time of one training stage, as a JSON-ready dict."""
    model, groups, training = built.model, built.groups, recipe.training
    thawable = built.unfrozen_groups
    if isinstance(recipe, PretrainRecipe):
        seq_len = recipe.corpus.block_size
        # The sparse masked LM decodes only the masked positions; the causal families decode every one.
        top_fraction = family_of(recipe.model).decoded_fraction(recipe)
        trainable = len(thawable)  # pretraining never freezes a group
    else:
        # Whole documents (an AWD-LSTM without task.max_length) have no length before the data is read.
        fitted = fitted_max_length(kind_named(recipe.task.kind).profile_window(recipe), model)
        seq_len = fitted or WHOLE_DOCUMENT_PROFILE_LENGTH
        top_fraction, trainable = 1 / seq_len, trainable_at_start(recipe, len(thawable))  # the head: once per example
    # The first group (bottom to top) that trains in the whole run, and at its start.
    first_group, first_group_at_start = thawable[0], thawable[len(thawable) - trainable]
    multiply_adds = multiply_adds_per_token(model, groups, seq_len, top_fraction, built.blocks)
    if built.adapter is None:
        flops = (training_flops(multiply_adds, len(groups)), training_flops(multiply_adds, trainable))
    else:  # LoRA's matrices and the head: what gets weight gradients, beside the frozen weights of their groups
        adapted = [[parameter for parameter in group if parameter.requires_grad] for group in groups]
        trained = multiply_adds_per_token(model, adapted, seq_len, top_fraction, built.blocks, layer_terms=False)
        flops = (
            adapter_training_flops(multiply_adds, trained, first_group),
            adapter_training_flops(multiply_adds, trained, first_group_at_start),
        )
    compute = compute_summary(recipe, flops, seq_len)
    compute["decoded_fraction"] = top_fraction if isinstance(recipe, PretrainRecipe) else None
    compute["whole_documents"] = not isinstance(recipe, PretrainRecipe) and fitted is None
    parameters = parameter_summary(model, groups, first_group, first_group_at_start)
    parameters.update(layer_groups=len(thawable), trainable_groups_at_start=trainable, adapter=built.adapter)
    return {
        "stage": recipe.stage,
        "model": model_summary(recipe, model, built.source),
        "parameters": parameters,
        "compute": compute,
        "memory_mb": memory_summary(
            model, built, parameters, compute["tokens_per_step"] // training.gradient_accumulation_steps, seq_len
        ),
        "time_estimate": time_estimate(recipe, rates, mfu, compute),
    }


def compute_summary(recipe, flops: tuple[float, float], seq_len: int) -> dict:
    """FLOPs per token and per optimizer step (`flops` per token: all groups trainable, and at the start), and with
    max_steps the run's."""
    training = recipe.training
    examples_per_step = training.batch_size * training.gradient_accumulation_steps
    # task.both_orders reads every pair twice: (a, b) and (b, a).
    orders = 2 if getattr(getattr(recipe, "task", None), "both_orders", False) else 1
    tokens_per_step = examples_per_step * seq_len * orders
    per_token, at_start = flops
    # finetune's seeds: one run each; with draws, one per draw and seed
    runs = len(getattr(recipe, "seeds", None) or [None]) * (getattr(recipe, "draws", None) or 1)
    steps = training.max_steps
    return {
        "sequence_length": seq_len,
        "examples_per_step": examples_per_step,
        "tokens_per_step": tokens_per_step,
        "flops_per_token": per_token,
        "flops_per_token_at_start": at_start,
        "flops_per_step": per_token * tokens_per_step,
        "flops_per_step_at_start": at_start * tokens_per_step,
        "steps": steps,
        "runs": runs,
        "total_flops": per_token * tokens_per_step * steps * runs if steps else None,
    }


def parameter_summary(model: nn.Module, groups: list[list[nn.Parameter]], first: int, first_at_start: int) -> dict:
    """Total, embedding tables and the rest, and what trains: in the groups from `first` up (every one that ever
    trains) and from `first_at_start` up (at the start); with an adapter only its trainable parameters there."""
    total = parameter_count(model)
    lookups = lookup_tables(model)
    embeddings = sum(parameter.numel() for parameter in model.parameters() if id(parameter) in lookups)

    def trained_from(index: int) -> int:
        return sum(parameter.numel() for group in groups[index:] for parameter in group if parameter.requires_grad)

    return {
        "total": total,
        "embeddings": embeddings,
        "other": total - embeddings,
        "trainable": trained_from(first),
        "trainable_at_start": trained_from(first_at_start),
        "first_trainable_group": first_at_start,  # bottom to top, counting every group (the adapter's too)
    }


def memory_summary(model: PreTrainedModel, built: BuiltModel, parameters: dict, tokens: int, seq_len: int) -> dict:
    """fp32 weights, gradients and AdamW's two moments in MB (with every group trainable, the most a run reaches,
    and at the start), and the activation estimate of one micro-batch of `tokens` tokens (frozen layers keep none)."""
    layer_bytes = layer_activation_bytes(model, tokens, seq_len)
    block_groups = range(len(built.groups))[built.blocks]
    first_trainable = parameters["first_trainable_group"]
    trainable_layers = round(
        len(layer_bytes) * sum(index >= first_trainable for index in block_groups) / len(block_groups)
    )
    total, trainable, at_start = parameters["total"], parameters["trainable"], parameters["trainable_at_start"]
    memory = {
        "weights": total * BYTES_PER_VALUE / MB,
        "gradients": trainable * BYTES_PER_VALUE / MB,
        "adamw": 2 * trainable * BYTES_PER_VALUE / MB,
        "gradients_at_start": at_start * BYTES_PER_VALUE / MB,
        "adamw_at_start": 2 * at_start * BYTES_PER_VALUE / MB,
        "activations_estimate": sum(layer_bytes) / MB,
        "activations_estimate_at_start": sum(layer_bytes[len(layer_bytes) - trainable_layers :]) / MB,
    }
    # Weights, and for what trains its gradient and AdamW's two moments (16 bytes a parameter in all).
    training_bytes = total * BYTES_PER_VALUE + trainable * (TRAINING_BYTES_PER_PARAMETER - BYTES_PER_VALUE)
    memory["total_estimate"] = training_bytes / MB + memory["activations_estimate"]
    return memory


def trainable_at_start(recipe: FinetuneRecipe, num_groups: int) -> int:
    """The layer groups (from the top) that train in the first step, as the finetune stage freezes them."""
    unfreezing = recipe.unfreezing
    assert unfreezing.mode is not None  # decided by with_techniques, as the finetune stage decides it
    if unfreezing.mode == "gradual" and (unfreezing.every_steps or unfreezing.every_fraction):
        return trainable_group_count_at_step(0, num_groups, unfreezing.initial_groups, 1)
    return trainable_group_count(
        0, num_groups, unfreezing.mode, unfreezing.initial_groups, unfreezing.groups_per_epoch or 1, unfreezing.schedule
    )


def layer_activation_bytes(model: PreTrainedModel, tokens: int, seq_len: int) -> list[float]:
    """The activation estimate of each layer, bottom to top, for one micro-batch of `tokens` tokens."""
    config = backbone_config(model.config)
    if is_recurrent(config):
        # torch types a submodule as Tensor | Module: the AWD-LSTM's `layers` are models/recurrent_cells.py's.
        layers = cast("Iterable[WeightDropout | QRNNLayer]", model.base_model.layers)
        return [lstm_layer_activation_bytes(tokens, layer.input_size, layer.hidden_size) for layer in layers]
    hidden = config.hidden_size
    intermediate = next(
        (value for name in ("intermediate_size", "n_inner", "hidden_dim") if (value := getattr(config, name, None))),
        4 * hidden,
    )
    per_layer = transformer_layer_activation_bytes(tokens, seq_len, hidden, intermediate, config.num_attention_heads)
    return [per_layer] * config.num_hidden_layers


def model_summary(recipe, model: PreTrainedModel, source: str) -> dict:
    """Family, sizes and where they came from."""
    config = backbone_config(model.config)
    if is_recurrent(config):
        sizes = {"layers": config.num_layers, "embedding_size": config.embedding_size, "hidden": config.hidden_size}
    else:
        sizes = {
            "layers": config.num_hidden_layers,
            "hidden": config.hidden_size,
            "heads": config.num_attention_heads,
            "positions": getattr(config, "max_position_embeddings", None),
        }
    sizes["vocabulary"] = config.vocab_size
    family: str
    if isinstance(recipe, PretrainRecipe):
        trained = family_of(recipe.model)
        kind, family = trained.description, trained.shown_name(recipe.model, config)
    else:
        family, labels = config.model_type, model.config.num_labels
        kind = kind_named(recipe.task.kind).profile_description(recipe, int(labels or 0))
    return {"family": family, "kind": kind, "sizes": sizes, "source": source}


class MatmulRates:
    """The matmul rate per (device, precision): the one given (--matmul-gflops), or measured here once."""

    def __init__(self, given: float | None = None):
        self.given = given
        self.measured: dict[tuple[str, torch.dtype], float] = {}

    def rate(self, device: str, dtype: torch.dtype) -> float:
        if self.given is not None:
            return self.given
        if (device, dtype) not in self.measured:
            # A few products: well under a second on a CPU (a GPU's are larger: matmul_gflops sizes them)
            self.measured[device, dtype] = matmul_gflops(
                repeats=5 if device == "cpu" else 20, device=device, dtype=dtype
            )
        return self.measured[device, dtype]


def time_estimate(recipe, rates: MatmulRates, mfu: float, compute: dict) -> dict:
    """Seconds per step (and for the run, with max_steps): the step's FLOPs at `mfu` of the matmul rate."""
    device, dtype = matmul_setting(recipe.training)
    rate = rates.rate(device, dtype)
    useful = rate * 1e9 * mfu  # FLOP/s
    per_step = compute["flops_per_step"] / useful
    return {
        "device": device,
        "precision": PRECISION_NAMES[dtype],
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "matmul_gflops": rate,
        "matmul_measured": rates.given is None,
        "mfu_assumed": mfu,
        "seconds_per_step": per_step,
        "seconds_per_step_at_start": compute["flops_per_step_at_start"] / useful,
        "seconds_total": compute["total_flops"] / useful if compute["total_flops"] is not None else None,
    }


def matmul_setting(training) -> tuple[str, torch.dtype]:
    """The device and matmul precision the run would use (the training loop's rule)."""
    on_cpu, precision = device_and_precision(training)
    dtype = next((dtype for dtype, name in PRECISION_NAMES.items() if name == precision), torch.float32)
    return ("cpu" if on_cpu else "cuda"), dtype
