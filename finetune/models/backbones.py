"""Layer groups of Hugging Face backbones: the one list that discriminative LRs and unfreezing share.

`layer_groups(model)` returns the model's parameters in groups ordered bottom (embeddings) to top
(task head). Supporting a new family means adding one entry to `LAYER_GROUP_FINDERS`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from transformers import PreTrainedModel

from finetune.errors import CheckpointError
from finetune.models.awd_lstm import AWD_LSTM_TYPE, awd_lstm_layer_groups
from finetune.models.causal_transformer import CAUSAL_TRANSFORMER_TYPE
from finetune.models.mean_pooling import backbone_config

Groups = list[list[nn.Parameter]]
Finder = Callable[[PreTrainedModel], Groups]


def _module_at(root: nn.Module, path: str) -> nn.Module | None:
    """The submodule at a dotted `path`, or None where this config does not build it."""
    module: nn.Module | None = root
    for name in path.split("."):
        module = getattr(module, name, None)
    return module


def _parameters_of(root: nn.Module, paths: tuple[str, ...]) -> list[nn.Parameter]:
    """The parameters of the submodules at `paths`, skipping those this config does not build."""
    return [
        parameter
        for path in paths
        if (module := _module_at(root, path)) is not None
        for parameter in module.parameters()
    ]


def stacked_groups(embeddings: tuple[str, ...], blocks: str, with_first_block: tuple[str, ...] = ()) -> Finder:
    """A finder for a stack of blocks: [modules at `embeddings`], [block 0 and `with_first_block`], ..., [block N-1].

    Paths are dotted and relative to `model.base_model`, so one finder serves the bare backbone and every head
    on it. A path may name a module that only some configs build (ELECTRA's projection, DeBERTa's conv).
    """

    def finder(model: PreTrainedModel) -> Groups:
        base = model.base_model
        stack = _module_at(base, blocks)
        assert isinstance(stack, nn.ModuleList)  # every config of a family builds its stack of blocks
        groups = [_parameters_of(base, embeddings)] + [list(block.parameters()) for block in stack]
        if with_first_block:
            groups[1] += _parameters_of(base, with_first_block)
        return groups

    return finder


_bert_groups = stacked_groups(("embeddings",), "encoder.layer")


LAYER_GROUP_FINDERS: dict[str, Finder] = {
    "bert": _bert_groups,
    "roberta": _bert_groups,
    "xlm-roberta": _bert_groups,
    # ELECTRA projects small embeddings up to the hidden size before block 0: part of the embedding layer.
    "electra": stacked_groups(("embeddings", "embeddings_project"), "encoder.layer"),
    "distilbert": stacked_groups(("embeddings",), "transformer.layer"),
    # DeBERTa's relative-position table (and, in v2, the LayerNorm the encoder applies to it alone) is position
    # information every block reads, like BERT's position embeddings: in the bottom group it learns at the lowest
    # rate and thaws last, and while frozen no gradient flows back into the frozen blocks that read it. v2's conv
    # mixes the embeddings into block 0's output before block 1 sees it, so it thaws with block 0.
    "deberta": stacked_groups(("embeddings", "encoder.rel_embeddings"), "encoder.layer"),
    "deberta-v2": stacked_groups(
        ("embeddings", "encoder.rel_embeddings", "encoder.LayerNorm"),
        "encoder.layer",
        with_first_block=("encoder.conv",),
    ),
    # ModernBERT has rotary positions (no table); its final_norm sits above the last block, so the head gets it.
    "modernbert": stacked_groups(("embeddings",), "layers"),
    # ALBERT shares one set of block weights across all layers: one group per shared set (usually one in all),
    # and the projection up to the hidden size belongs to the embeddings as in ELECTRA.
    "albert": stacked_groups(("embeddings", "encoder.embedding_hidden_mapping_in"), "encoder.albert_layer_groups"),
    # MPNet's relative-position buckets are position information every block reads, as DeBERTa's table.
    "mpnet": stacked_groups(("embeddings", "encoder.relative_attention_bias"), "encoder.layer"),
    AWD_LSTM_TYPE: awd_lstm_layer_groups,
    # GPT-2's final norm sits above the last block (the head group); its output layer is tied to wte.
    "gpt2": stacked_groups(("wte", "wpe"), "h"),
    # Decoders with rotary positions (no table): the token embedding below the blocks, the final norm with the head.
    **dict.fromkeys(("llama", "mistral", "qwen2", "gemma", "phi"), stacked_groups(("embed_tokens",), "layers")),
    "gpt_neox": stacked_groups(("embed_in",), "layers"),
    # OPT's learned positions, and the projection some sizes put between its embeddings and the blocks.
    "opt": stacked_groups(("decoder.embed_tokens", "decoder.embed_positions", "decoder.project_in"), "decoder.layers"),
    # Ours (models/causal_transformer.py): Transformer-XL's global biases u and v are position information every
    # block reads, like DeBERTa's relative table, so they sit with the embeddings; the final norm is the head's.
    CAUSAL_TRANSFORMER_TYPE: stacked_groups(
        ("token_embedding", "position_embedding", "relative_position_biases"), "layers"
    ),
}


def layer_groups(model: PreTrainedModel) -> Groups:
    """Every parameter of `model` exactly once, grouped bottom to top; the last group is the task head."""
    family = backbone_config(model.config).model_type  # a mean-pooling head's groups are its encoder's + the head
    finder = LAYER_GROUP_FINDERS.get(family)
    if finder is None:
        supported = ", ".join(sorted(LAYER_GROUP_FINDERS))
        raise CheckpointError(
            f"model family '{family}' has no layer groups yet (supported: {supported}); "
            "add a finder to LAYER_GROUP_FINDERS in finetune/models/backbones.py",
            value=family,
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
