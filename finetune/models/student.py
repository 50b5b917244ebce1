"""A smaller model made of some of a checkpoint's blocks (`model.keep_layers`): DistilBERT's initialisation of its
student, every other layer of its teacher, which the student then learns from (kinds/distillation.py) or is
fine-tuned alone.

The blocks kept are the model's own modules, moved into a shorter stack: the embeddings, the final norm and the
task head stay as they are. The config says the new depth, so the saved checkpoint loads in transformers as a
model of that many layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from transformers import PreTrainedModel

from finetune.errors import CheckpointError, InputError
from finetune.models.backbones import stack_of_blocks
from finetune.models.mean_pooling import backbone_config

DEPTH_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")  # what families call their number of blocks
PER_LAYER_KEYS = ("layer_types",)  # per-block lists in a config (attention kind per layer): cut like the stack


def kept_blocks(keep: str | Sequence[int], depth: int) -> list[int]:
    """The block numbers `keep` names in a stack of `depth`: every_other (0, 2, 4, ...) or a list, in range."""
    blocks = list(range(0, depth, 2)) if isinstance(keep, str) else [int(block) for block in keep]
    outside = [block for block in blocks if block >= depth]
    if outside:
        raise InputError(
            f"block {outside[0]} is out of range: the model has {depth} blocks (0 to {depth - 1})", value=blocks
        )
    if len(blocks) == depth and blocks == list(range(depth)):
        raise InputError(f"{blocks} keeps all {depth} blocks; leave it out", value=blocks)
    return blocks


def keep_blocks(model: PreTrainedModel, keep: str | Sequence[int]) -> str:
    """Make `model` the model of the blocks `keep` names (model.keep_layers), in place; returns what it kept, for the
    caller to say after its key. Refusals are InputErrors for the caller to name the key (errors.recipe_key)."""
    config = backbone_config(model.config)
    found = stack_of_blocks(model.base_model)
    depth_key = next((key for key in DEPTH_KEYS if isinstance(getattr(config, key, None), int)), None)
    if found is None or depth_key is None or getattr(config, depth_key) != len(found[1]):
        raise CheckpointError(
            f"a '{config.model_type}' model has no stack of blocks its config counts, to keep some "
            "of (BERT-style encoders and GPT-style decoders have one)",
            value=config.model_type,
        )
    path, stack = found
    blocks = kept_blocks(keep, len(stack))
    parent_path, _, name = path.rpartition(".")
    parent = model.base_model.get_submodule(parent_path) if parent_path else model.base_model
    setattr(parent, name, nn.ModuleList([stack[block] for block in blocks]))
    for number, block in enumerate(getattr(parent, name)):
        for module in block.modules():  # decoders' attention knows its place in the key/value cache
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = number
    depth = len(stack)
    setattr(config, depth_key, len(blocks))
    for key in PER_LAYER_KEYS:
        values = getattr(config, key, None)
        if isinstance(values, list) and len(values) == depth:
            setattr(config, key, [values[block] for block in blocks])
    return f"{len(blocks)} of the {depth} blocks kept ({', '.join(map(str, blocks))})"
