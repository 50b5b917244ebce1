"""Where a profiled training step's time goes: torch.profiler's events, their self CPU time summed into categories.

Used by bench/step_profile.py. Not a benchmark. Two pure parts:

- `category_of(name)`: the category an event's own name says (None for a name that says nothing, e.g. aten::mul),
  from the op's name, its backward node's name (`NativeLayerNormBackward0` -> native_layer_norm -> layer norm), a
  custom autograd Function's name (`CpuDropout`, `_ChunkedLinearCrossEntropy`), the optimizer's record_function
  (`Optimizer.step#AdamW.step`) or a module label that bench/step_profile.py records (`module: RNNDropout`).
- `attribute(events)`: an event named as a matrix product (mm, addmm, bmm, linear, matmul, their backward nodes) is
  a product wherever it runs, one inside the LSTM's backward or the chunked cross-entropy too (the floor of
  bench/_products.py counts it there). Any other event's self time goes to the highest-ranked category among its
  own name, its enclosing events' names and, inside backward, the forward op that made the autograd node (linked
  by the node's sequence number), products left out: so an aten::mul inside CpuDropout is dropout, its backward too;
  every elementwise op inside aten::lstm or a QRNN layer is the recurrence; the AdamW step's foreach kernels are the
  optimizer; a copy inside aten::matmul or addmm is a copy (or the loss's, inside the chunked cross-entropy), not a
  product.

Self time is the time inside an op and not inside any op it calls, on the thread that called it (intra-op threads
work inside it), so the categories add up to the step's time in ops; the rest of the step's wall time is Python and
the loop between ops.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

PRODUCTS = "matrix products"
LAYER_NORM = "layer norm"
ACTIVATIONS = "GELU / activations"
SOFTMAX = "softmax"
DROPOUT = "dropout"
EMBEDDING_BACKWARD = "embedding backward"
CROSS_ENTROPY = "cross-entropy / log-softmax"
OPTIMIZER = "optimizer (AdamW, clipping, foreach)"
RECURRENCE = "LSTM cells (recurrence)"
COPIES = "copies / casts / indexing / views"
OTHER = "other ops"

# The table's rows, in the order the profile prints them.
CATEGORIES = (PRODUCTS, LAYER_NORM, ACTIVATIONS, SOFTMAX, DROPOUT, EMBEDDING_BACKWARD, CROSS_ENTROPY, OPTIMIZER,
              RECURRENCE, COPIES, OTHER)  # fmt: skip
# When an op's name and the events around it say different things, the first of these wins: a product is a product
# wherever it runs; an elementwise op inside the recurrence, the loss, the optimizer or dropout is theirs; a copy
# inside a layer norm is the layer norm's.
PRIORITY = (PRODUCTS, RECURRENCE, CROSS_ENTROPY, OPTIMIZER, DROPOUT, EMBEDDING_BACKWARD, LAYER_NORM, SOFTMAX,
            ACTIVATIONS, COPIES)  # fmt: skip
RANK = {category: rank for rank, category in enumerate(PRIORITY)}

BACKWARD_ROOT = "autograd::engine::evaluate_function: "  # the engine's event around each autograd node it runs
MODULE_LABEL = "module: "  # bench/step_profile.py's record_function around the modules of MODULE_CATEGORIES
# Modules whose ops have no telling names (a dropout mask multiplied in by hand, a recurrence written out): their
# forward is labelled while profiling. Only these exact classes: a model's own class name may contain "LSTM".
MODULE_CATEGORIES = {
    "RNNDropout": DROPOUT,  # models/awd_lstm.py: variational dropout, bernoulli_ then mul and div
    "EmbeddingDropout": DROPOUT,  # word dropout: a mask over the whole embedding matrix
    "WeightDropout": DROPOUT,  # DropConnect on the hidden-to-hidden weights (the LSTM inside is the recurrence's)
    "_UnpackedLSTM": RECURRENCE,
    "_UnpackedRNN": RECURRENCE,
    "QRNNLayer": RECURRENCE,
}

# Patterns on an op's key (see `op_key`), tried in this order; the first that matches names the category.
_PATTERNS = (
    (EMBEDDING_BACKWARD, re.compile(r"embedding_(dense_|sparse_)?backward")),
    (PRODUCTS, re.compile(r"_?(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|mv|addmv|addmm_activation|dot)_?")),
    (RECURRENCE, re.compile(r".*(lstm|mkldnn_rnn|rnn_tanh|rnn_relu|gru|forget_mult).*")),
    (CROSS_ENTROPY, re.compile(r".*(cross_entropy|log_softmax|nll_loss|logsumexp).*")),
    (OPTIMIZER, re.compile(r"_foreach_.*|_fused_adamw?_?|adamw?")),
    (DROPOUT, re.compile(r".*(dropout|bernoulli).*")),
    (LAYER_NORM, re.compile(r".*(layer_norm|rms_norm).*")),
    (SOFTMAX, re.compile(r".*softmax.*")),
    (ACTIVATIONS, re.compile(r"(gelu|tanh|sigmoid|relu|silu|threshold|elu|hardtanh)_?(backward)?")),
    (
        COPIES,
        re.compile(
            r"copy_|to|_to_copy|clone|contiguous|cat|stack|embedding|index|index_select|index_put_?|index_add_?|"
            r"_index_put_impl_|gather|scatter_?|scatter_add_?|masked_fill_?|masked_select|where|"
            r"view|_unsafe_view|reshape|permute|transpose|t|slice|select|as_strided|narrow|expand|unbind|split|"
            r"split_with_sizes|chunk|squeeze|unsqueeze|flatten|detach|empty|empty_like|empty_strided|new_empty|"
            r"zeros|zeros_like|ones|ones_like|zero_|fill_|resize_|lift_fresh|alias|unsafe_view|to_copy"
        ),
    ),
)


def snake_case(name: str) -> str:
    """CamelCase as snake_case: NativeLayerNorm -> native_layer_norm, _ChunkedLinearCrossEntropy ->
    _chunked_linear_cross_entropy, ToCopy -> to_copy."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def op_key(name: str) -> str:
    """The op an event's name stands for, in aten's spelling: aten::gelu -> gelu; a backward node
    (`NativeLayerNormBackward0`, `CpuDropoutBackward`, with or without the engine's prefix) -> the forward op it
    differentiates; a custom Function's name -> its snake_case."""
    name = name.removeprefix(BACKWARD_ROOT).removeprefix("aten::")
    backward = re.fullmatch(r"(\w+?)Backward\d*", name)
    if backward:
        return snake_case(backward.group(1))
    return snake_case(name) if re.search(r"[A-Z]", name) else name


def category_of(name: str) -> str | None:
    """The category an event's own name says (the module docstring), or None."""
    if name.startswith(MODULE_LABEL):
        return MODULE_CATEGORIES.get(name.removeprefix(MODULE_LABEL))
    if name.startswith("Optimizer."):  # torch.optim's record_function: Optimizer.step#AdamW.step, .zero_grad
        return OPTIMIZER
    key = op_key(name)
    if key == "embedding" and name.removeprefix(BACKWARD_ROOT).startswith("EmbeddingBackward"):
        return EMBEDDING_BACKWARD
    for category, pattern in _PATTERNS:
        if pattern.fullmatch(key):
            return category
    return None


def _highest(categories: Iterable[str | None]) -> str | None:
    known = [category for category in categories if category is not None]
    return min(known, key=RANK.__getitem__) if known else None


def _is_backward(event) -> bool:
    """Whether the event runs inside the autograd engine's backward pass."""
    while event is not None:
        if event.name.startswith(BACKWARD_ROOT):
            return True
        event = event.cpu_parent
    return False


def forward_ops(events: list) -> dict[int, object]:
    """Sequence number -> the forward event that made that autograd node: the last one to start with that number
    (ops that make no node record the number the next node will take; the one that makes it comes last)."""
    made = {}
    for event in sorted(events, key=lambda event: event.time_range.start):
        if event.sequence_nr >= 0 and not _is_backward(event):
            made[event.sequence_nr] = event
    return made


def attribute(events: list) -> dict[str, float]:
    """Self CPU time (microseconds) per category (CATEGORIES; OTHER for what nothing names), over `events`
    (torch.profiler's `events()`: FunctionEvent objects with name, cpu_parent, sequence_nr, time_range and
    self_cpu_time_total)."""
    made = forward_ops(events)
    memo: dict[int, str | None] = {}

    def context(event) -> str | None:
        """The highest category of the event's own name and the events around it, products left out: what an op
        inside a product (the bias copied into addmm's output, a copy aten::matmul makes of an operand, the bias
        gradient's sum beside AddmmBackward0) does is not the product itself."""
        if id(event) not in memo:
            own = category_of(event.name)
            candidates = [None if own == PRODUCTS else own]
            if event.cpu_parent is not None:
                candidates.append(context(event.cpu_parent))
            elif event.name.startswith(BACKWARD_ROOT) and event.sequence_nr in made:
                candidates.append(context(made[event.sequence_nr]))  # the forward op this node differentiates
            memo[id(event)] = _highest(candidates)
        return memo[id(event)]

    totals: dict[str, float] = defaultdict(float)
    for event in events:
        category = PRODUCTS if category_of(event.name) == PRODUCTS else context(event)
        totals[category or OTHER] += event.self_cpu_time_total
    return {name: totals.get(name, 0.0) for name in CATEGORIES}


def top_ops(events: list, count: int) -> list[tuple[str, float, str, str]]:
    """The `count` event names with the most self CPU time: (name, microseconds, the category of its own name or
    "-", the enclosing event its time was mostly spent in or "-" at the top)."""
    totals: dict[str, float] = defaultdict(float)
    by_parent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in events:
        totals[event.name] += event.self_cpu_time_total
        parent = event.cpu_parent.name.removeprefix(BACKWARD_ROOT) if event.cpu_parent is not None else "-"
        by_parent[event.name][parent] += event.self_cpu_time_total
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
    return [
        (name, micros, category_of(name) or "-", max(by_parent[name].items(), key=lambda item: item[1])[0])
        for name, micros in ranked
    ]
