"""Layer groups of Hugging Face backbones: the one list that discriminative LRs and unfreezing share.

`layer_groups(model)` returns the model's parameters in groups ordered bottom (embeddings) to top
(task head). Supporting a new family means adding one entry to `LAYER_GROUP_FINDERS`.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from finetune.errors import UserError
from finetune.models.awd_lstm import awd_lstm_layer_groups

Groups = list[list[nn.Parameter]]


def _encoder_groups(model: nn.Module) -> Groups:
    """BERT-shaped encoders: [embeddings], [block 0], ..., [block N-1], [everything above: pooler, head]."""
    base = model.base_model
    groups = [list(base.embeddings.parameters())]
    groups += [list(block.parameters()) for block in base.encoder.layer]
    return groups


def _gpt2_groups(model: nn.Module) -> Groups:
    """GPT-2 decoders: [token and position embeddings], [block 0], ..., [block N-1], [final norm, head]."""
    base = model.base_model
    return [list(base.wte.parameters()) + list(base.wpe.parameters())] + [list(block.parameters()) for block in base.h]


LAYER_GROUP_FINDERS: dict[str, Callable[[nn.Module], Groups]] = {
    "bert": _encoder_groups,
    "roberta": _encoder_groups,
    "awd_lstm": awd_lstm_layer_groups,
    "gpt2": _gpt2_groups,
}


def layer_groups(model: nn.Module) -> Groups:
    """Every parameter of `model` exactly once, grouped bottom to top; the last group is the task head."""
    family = model.config.model_type
    finder = LAYER_GROUP_FINDERS.get(family)
    if finder is None:
        supported = ", ".join(sorted(LAYER_GROUP_FINDERS))
        raise UserError(
            f"model family '{family}' has no layer groups yet (supported: {supported}); "
            "add a finder to LAYER_GROUP_FINDERS in finetune/models/backbones.py"
        )
    groups = finder(model)
    grouped = {id(parameter) for group in groups for parameter in group}
    # Whatever the finder did not claim sits above the backbone: the pooler and the task head.
    head = [parameter for parameter in model.parameters() if id(parameter) not in grouped]
    groups.append(head)
    counted = sum(len(group) for group in groups)
    if counted != len(list(model.parameters())) or len({id(p) for g in groups for p in g}) != counted:
        raise RuntimeError(f"layer groups of '{family}' do not cover every parameter exactly once")
    return groups
