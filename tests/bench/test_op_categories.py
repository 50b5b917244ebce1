"""bench/_op_categories.py: the category an op's name says, and a profile's self time summed by category with the
events around each op (and, in backward, the forward op that made its autograd node) deciding what a name does not."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from _op_categories import (  # bench/ scripts are top-level modules
    ACTIVATIONS,
    CATEGORIES,
    COPIES,
    CROSS_ENTROPY,
    DROPOUT,
    EMBEDDING_BACKWARD,
    LAYER_NORM,
    OPTIMIZER,
    OTHER,
    PRODUCTS,
    RECURRENCE,
    SOFTMAX,
    attribute,
    category_of,
    op_key,
    top_ops,
)

ROOT = "autograd::engine::evaluate_function: "


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("aten::mm", PRODUCTS),
        ("aten::addmm_", PRODUCTS),
        ("aten::linear", PRODUCTS),
        ("aten::matmul", PRODUCTS),
        ("aten::baddbmm", PRODUCTS),
        (ROOT + "AddmmBackward0", PRODUCTS),
        ("BmmBackward0", PRODUCTS),
        ("aten::native_layer_norm", LAYER_NORM),
        ("NativeLayerNormBackward0", LAYER_NORM),
        ("aten::native_layer_norm_backward", LAYER_NORM),
        ("aten::gelu", ACTIVATIONS),
        ("aten::gelu_backward", ACTIVATIONS),
        ("TanhBackward0", ACTIVATIONS),
        ("aten::_softmax", SOFTMAX),
        ("aten::_softmax_backward_data", SOFTMAX),
        ("aten::_log_softmax", CROSS_ENTROPY),  # a log-softmax is the loss's, not attention's softmax
        ("LogSoftmaxBackward0", CROSS_ENTROPY),
        ("aten::nll_loss_forward", CROSS_ENTROPY),
        ("_ChunkedLinearCrossEntropy", CROSS_ENTROPY),  # models/linear_cross_entropy.py's autograd Function
        (ROOT + "_ChunkedLinearCrossEntropyBackward", CROSS_ENTROPY),
        ("aten::native_dropout", DROPOUT),
        ("aten::bernoulli_", DROPOUT),
        ("CpuDropout", DROPOUT),  # models/cpu_dropout.py's
        ("CpuDropoutBackward", DROPOUT),
        ("EmbeddingBackward0", EMBEDDING_BACKWARD),
        (ROOT + "EmbeddingBackward0", EMBEDDING_BACKWARD),
        ("aten::embedding_dense_backward", EMBEDDING_BACKWARD),
        ("aten::embedding", COPIES),  # the forward lookup is an index_select
        ("Optimizer.step#AdamW.step", OPTIMIZER),
        ("Optimizer.zero_grad#AdamW.zero_grad", OPTIMIZER),
        ("aten::_fused_adamw_", OPTIMIZER),
        ("aten::_foreach_mul_", OPTIMIZER),
        ("aten::lstm", RECURRENCE),
        ("aten::mkldnn_rnn_layer_backward", RECURRENCE),
        ("MkldnnRnnLayerBackward0", RECURRENCE),
        ("_ForgetMult", RECURRENCE),  # the QRNN's recurrence
        ("aten::copy_", COPIES),
        ("aten::_to_copy", COPIES),
        ("ToCopyBackward0", COPIES),
        ("aten::t", COPIES),
        ("UnsafeViewBackward0", COPIES),
        ("module: RNNDropout", DROPOUT),
        ("module: _UnpackedLSTM", RECURRENCE),
    ],
)
def test_an_ops_name_says_its_category(name, category):
    assert category_of(name) == category


@pytest.mark.parametrize(
    "name",
    ["aten::mul", "aten::add_", "MulBackward0", "aten::sum", "torch::autograd::AccumulateGrad", "module: BertLayer"],
)
def test_a_name_that_says_nothing_has_no_category(name):
    assert category_of(name) is None


def test_a_model_class_named_after_its_cell_is_not_the_recurrence():
    # Only the labelled module classes count: a whole AWD-LSTM model must not become "LSTM cells".
    assert category_of("module: AWDLSTMForCausalLM") is None


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("aten::gelu", "gelu"),
        ("NativeLayerNormBackward0", "native_layer_norm"),
        (ROOT + "CpuDropoutBackward", "cpu_dropout"),
        ("_ChunkedLinearCrossEntropy", "_chunked_linear_cross_entropy"),
        ("ToCopyBackward0", "to_copy"),
    ],
)
def test_op_key_names_the_forward_op_in_atens_spelling(name, key):
    assert op_key(name) == key


class Events:
    """Fake torch.profiler FunctionEvents, started in the order they are made."""

    def __init__(self):
        self.all = []

    def add(self, name, self_us=0.0, parent=None, sequence=-1):
        event = SimpleNamespace(
            name=name,
            self_cpu_time_total=self_us,
            cpu_parent=parent,
            sequence_nr=sequence,
            time_range=SimpleNamespace(start=len(self.all)),
        )
        self.all.append(event)
        return event


def a_step() -> list:
    """A forward and backward of dropout, a linear layer and a layer norm, and an AdamW step."""
    events = Events()
    dropout = events.add("CpuDropout", 2, sequence=5)
    events.add("aten::mul", 10, dropout)  # the mask applied: a name that says nothing
    linear = events.add("aten::linear", 1, sequence=6)
    addmm = events.add("aten::addmm", 20, linear, sequence=6)
    events.add("aten::copy_", 3, addmm)  # the bias copied into the output: a copy, not the product
    events.add("aten::mul", 4, sequence=7)  # a residual scaling: nothing names it
    norm = events.add("aten::layer_norm", 1, sequence=8)
    events.add("aten::native_layer_norm", 6, norm, sequence=8)
    # Backward: each node under the engine's event, linked to its forward op by the sequence number.
    root = events.add(ROOT + "NativeLayerNormBackward0", 1, sequence=8)
    node = events.add("NativeLayerNormBackward0", 1, root, sequence=8)
    events.add("aten::native_layer_norm_backward", 9, node)
    root = events.add(ROOT + "AddmmBackward0", 1, sequence=6)
    node = events.add("AddmmBackward0", 1, root, sequence=6)
    events.add("aten::mm", 30, node)
    events.add("aten::sum", 5, root)  # the bias gradient beside the node
    root = events.add(ROOT + "MulBackward0", 1, sequence=5)  # the mask's mul: dropout, from its forward op
    node = events.add("MulBackward0", 1, root, sequence=5)
    events.add("aten::mul", 8, node)
    root = events.add(ROOT + "MulBackward0", 1, sequence=7)  # the residual scaling's: nothing
    events.add("aten::mul", 1, events.add("MulBackward0", 1, root, sequence=7))
    events.add(ROOT + "torch::autograd::AccumulateGrad", 1)
    step = events.add("Optimizer.step#AdamW.step", 4)
    events.add("aten::_fused_adamw_", 40, step)
    return events.all


def test_each_events_self_time_goes_to_one_category():
    totals = attribute(a_step())
    assert list(totals) == list(CATEGORIES)
    assert totals[PRODUCTS] == 1 + 20 + 1 + 1 + 30  # linear, addmm, AddmmBackward0's two events, mm
    assert totals[COPIES] == 3
    assert totals[DROPOUT] == 2 + 10 + 1 + 1 + 8
    assert totals[LAYER_NORM] == 1 + 6 + 1 + 1 + 9
    assert totals[OPTIMIZER] == 4 + 40
    assert totals[OTHER] == 4 + 5 + 1 + 1 + 1 + 1  # residual scaling both ways, bias gradient, AccumulateGrad
    assert sum(totals.values()) == sum(event.self_cpu_time_total for event in a_step())


def test_top_ops_rank_names_by_self_time_and_say_where_they_ran():
    assert top_ops(a_step(), 3) == [
        ("aten::_fused_adamw_", 40, OPTIMIZER, "Optimizer.step#AdamW.step"),
        ("aten::mm", 30, PRODUCTS, "AddmmBackward0"),
        ("aten::mul", 23, "-", "CpuDropout"),  # 10 of its 23 inside CpuDropout, the most of any one place
    ]
