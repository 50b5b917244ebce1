"""bench/_products.py: the matrix products of a training step (the floor that bench/clm_pretrain.py and
bench/mlm_pretrain.py print as their ceiling), against a hand count and against the FLOPs the benchmarks' MFU counts."""

from __future__ import annotations

import sys

import pytest

from finetune.models.flops import training_flops_per_token
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from _products import (  # bench/ scripts are top-level modules
    Product,
    bound_line,
    causal_lm_products,
    expected_masked_rows,
    masked_lm_products,
    products_bound,
    products_seconds,
    with_gradients,
)


def test_each_forward_product_comes_with_its_two_gradients():
    assert with_gradients([Product(2, 3, 4, 5, 6)]) == [
        Product(2, 3, 4, 5, 6),  # forward: (4 x 5) @ (5 x 6)
        Product(2, 3, 4, 6, 5),  # the input's gradient: (4 x 6) @ (6 x 5)
        Product(2, 3, 5, 4, 6),  # the other operand's: (5 x 4) @ (4 x 6)
    ]


def test_the_masked_lm_step_decodes_the_masked_rows_only():
    # 2 layers, hidden 8, 2 heads of 4, blocks of 5, batch 3 (15 tokens), vocabulary 50, 2 masked rows.
    forward = [
        Product(2, 1, 15, 8, 24),  # per layer: Q, K and V in one product
        Product(2, 1, 15, 8, 8),  # the attention's output projection
        Product(2, 1, 15, 8, 32),  # feed-forward in (4 x hidden)
        Product(2, 1, 15, 32, 8),  # feed-forward out
        Product(2, 6, 5, 4, 5),  # scores: per block and head, queries (5 x 4) @ keys^T (4 x 5)
        Product(2, 6, 5, 5, 4),  # mixing: weights (5 x 5) @ values (5 x 4)
        Product(1, 1, 2, 8, 8),  # the head transform, on the 2 masked rows
        Product(1, 1, 2, 8, 50),  # the vocabulary projection, on the same rows
    ]
    assert masked_lm_products(2, 8, 2, 5, 3, 50, decoded_rows=2) == with_gradients(forward)
    causal = causal_lm_products(2, 8, 2, 5, 3, 50)
    assert causal == with_gradients([*forward[:6], Product(1, 1, 15, 8, 50)])  # every position, no transform


def training_flops(products: list[Product]) -> int:
    return sum(2 * times * batch * m * k * n for times, batch, m, k, n in products)


def test_the_products_are_the_flops_the_benchmarks_mfu_counts():
    layers, hidden, heads, seq_len, batch, vocab = 3, 16, 4, 10, 2, 40
    tokens = seq_len * batch
    causal = causal_lm_products(layers, hidden, heads, seq_len, batch, vocab)
    assert training_flops(causal) / tokens == pytest.approx(
        training_flops_per_token(layers, hidden, seq_len, vocab, 1.0, sparse_decoder=False, head_transform=False)
    )
    masked = masked_lm_products(layers, hidden, heads, seq_len, batch, vocab, expected_masked_rows(tokens))
    assert expected_masked_rows(tokens) == 3  # 15% of 20 tokens
    assert training_flops(masked) / tokens == pytest.approx(
        training_flops_per_token(layers, hidden, seq_len, vocab, 0.15, sparse_decoder=True)
    )


def test_expected_masked_rows_of_the_benchmark_step():
    assert expected_masked_rows(32 * 128) == 614


def test_products_seconds_times_every_product_once_per_occurrence():
    one = products_seconds([Product(1, 1, 64, 64, 64)], repeats=3)
    assert one > 0
    assert products_seconds([], repeats=3) == 0.0


def test_products_bound_and_its_line():
    bound = products_bound(
        0.5, 4096, our_tokens_per_s=5000, peer_tokens_per_s=2500, useful_flops_per_token=1e8, peak_gflops=4000
    )
    assert bound == {
        "products_ms_per_step": 500.0,
        "our_ms_per_step": 819.2,
        "products_only_tokens_per_s": 8192.0,
        "products_only_vs_peer": 3.277,
        "products_only_mfu": 0.2048,  # 1e8 FLOPs x 8,192 tokens/s over 4 TFLOP/s
    }
    assert bound_line(bound) == (
        "matrix products alone, each timed at its shape: 500 ms of our 819 ms step; a step of nothing else would run "
        "8,192 tokens/s = 3.28x the peer (MFU 20.5%)"
    )
