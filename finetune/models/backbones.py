"""Layer groups of Hugging Face backbones: the one list that discriminative LRs and unfreezing share.

`layer_groups(model)` returns the model's parameters in groups ordered bottom (embeddings) to top
(task head). A family with an entry in `LAYER_GROUP_FINDERS` is grouped as written there; any other by its stack of
identical blocks (`found_groups`), which says in one line what it found.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from transformers import PreTrainedModel

from finetune.console import console
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
# Llama's kind (Mistral, Qwen2, Gemma, Phi): token embeddings, a stack of blocks, a final norm (the head's, as GPT-2's);
# the rotary embeddings hold no parameters.
_decoder_groups = stacked_groups(("embed_tokens",), "layers")


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
    AWD_LSTM_TYPE: awd_lstm_layer_groups,
    # MPNet's relative-position bias table is read by every block, like DeBERTa's: with the embeddings.
    "mpnet": stacked_groups(("embeddings", "encoder.relative_attention_bias"), "encoder.layer"),
    # GPT-2's final norm sits above the last block (the head group); its output layer is tied to wte.
    "gpt2": stacked_groups(("wte", "wpe"), "h"),
    "llama": _decoder_groups,
    "mistral": _decoder_groups,
    "qwen2": _decoder_groups,
    "gemma": _decoder_groups,
    "phi": _decoder_groups,
    # OPT's project_in maps smaller embeddings up to the hidden size (as ELECTRA's projection): the embeddings';
    # its final norm and project_out (back down to the embedding size) sit above the last block: the head's.
    "opt": stacked_groups(("decoder.embed_tokens", "decoder.embed_positions", "decoder.project_in"), "decoder.layers"),
    "gpt_neox": stacked_groups(("embed_in",), "layers"),
    # Ours (models/causal_transformer.py): Transformer-XL's global biases u and v are position information every
    # block reads, like DeBERTa's relative table, so they sit with the embeddings; the final norm is the head's.
    CAUSAL_TRANSFORMER_TYPE: stacked_groups(
        ("token_embedding", "position_embedding", "relative_position_biases"), "layers"
    ),
}


def stack_of_blocks(base: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(path, list) of the base model's stack of blocks: the longest ModuleList of modules of one class that sits in
    no other list (a block's own list of experts or heads is no stack); the first of equally long ones."""
    lists = [(path, module) for path, module in base.named_modules() if isinstance(module, nn.ModuleList)]
    stacks = [
        (path, module)
        for path, module in lists
        if len(module)
        and len({type(block) for block in module}) == 1
        and not any(path.startswith(f"{outer}.") for outer, _ in lists)
    ]
    return max(stacks, key=lambda stack: len(stack[1]), default=None)


def found_groups(model: PreTrainedModel) -> Groups:
    """For a family without a finder of its own: [what the base model holds below its stack of blocks], [block 0],
    ..., [block N-1]; `layer_groups` puts the rest (a final norm, the task head) on top. One printed line names them.

    Below the stack: the parameters the base model registers before it (transformers registers a model's modules in
    the order its forward runs them) and every embedding table (a relative-position table registered after it).
    """
    family = backbone_config(model.config).model_type
    if getattr(model.config, "is_encoder_decoder", False):
        raise CheckpointError(
            f"a '{family}' model is an encoder-decoder, whose layers fine-tuning cannot order in one stack: "
            "fine-tune an encoder (bert, roberta, deberta-v2, ...) or a decoder (gpt2, llama, qwen2, ...)",
            value=family,
        )
    base = model.base_model
    found = stack_of_blocks(base)
    if found is None:
        raise CheckpointError(
            f"a '{family}' model has no stack of identical blocks to put in layer groups: fine-tune a transformer "
            "encoder (bert, roberta, ...) or decoder (gpt2, llama, ...)",
            value=family,
        )
    path, stack = found
    in_stack = {id(parameter) for parameter in stack.parameters()}
    below, passed_the_stack = [], False
    for name, parameter in base.named_parameters():
        if id(parameter) in in_stack:
            passed_the_stack = True
        elif not passed_the_stack or isinstance(base.get_submodule(name.rpartition(".")[0]), nn.Embedding):
            below.append(parameter)
    groups = [below] + [list(block.parameters()) for block in stack]
    console.print(_found_groups_line(model, family, path, stack, below), markup=False, highlight=False, soft_wrap=True)
    return groups


def _found_groups_line(model: PreTrainedModel, family: str, path: str, stack: nn.ModuleList, below) -> str:
    """What `found_groups` found, in one line: the modules of the bottom group, the blocks, and those on top."""
    base_prefix = "" if model.base_model is model else f"{model.base_model_prefix}."
    depth = len(f"{base_prefix}{path}".split("."))  # names as deep as the stack's: its siblings

    def modules(parameters) -> str:
        wanted = {id(parameter) for parameter in parameters}
        names = [
            ".".join(name.split(".")[:-1][:depth]) or name
            for name, parameter in model.named_parameters()
            if id(parameter) in wanted
        ]
        return ", ".join(dict.fromkeys(names)) or "nothing"

    grouped = {id(parameter) for parameter in [*below, *stack.parameters()]}
    top = [parameter for parameter in model.parameters() if id(parameter) not in grouped]
    return (
        f"layer groups of this '{family}' model, found by its stack of blocks (the family has no finder of its "
        f"own): embeddings [{modules(below)}], {len(stack)} blocks [{base_prefix}{path}: "
        f"{type(stack[0]).__name__}], head [{modules(top)}]"
    )


def layer_groups(model: PreTrainedModel) -> Groups:
    """Every parameter of `model` exactly once, grouped bottom to top; the last group is the task head."""
    family = backbone_config(model.config).model_type  # a mean-pooling head's groups are its encoder's + the head
    groups = LAYER_GROUP_FINDERS.get(family, found_groups)(model)
    grouped = {id(parameter) for group in groups for parameter in group}
    # Whatever the finder did not claim sits above the backbone: the pooler and the task head.
    head = [parameter for parameter in model.parameters() if id(parameter) not in grouped]
    groups.append(head)
    counted = sum(len(group) for group in groups)
    if counted != len(list(model.parameters())) or len({id(p) for g in groups for p in g}) != counted:
        raise RuntimeError(f"layer groups of '{family}' do not cover every parameter exactly once")
    return groups
