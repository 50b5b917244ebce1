"""The matrix products of one transformer LM training step, each timed alone at its own shape: the floor under any
implementation's step, so the ceiling of its throughput on this machine.

Shared by bench/clm_pretrain.py and bench/mlm_pretrain.py (the "matrix products alone" line and the JSON's
`products_bound`) and bench/step_profile.py (the floor beside what a profiled step spends in its products). A step
of nothing but these products would run at `products_only_tokens_per_s`; what a measured step takes above them is
softmax, normalisation, activations, dropout, the optimizer and the loop. Not a benchmark.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch


class Product(NamedTuple):
    """`times` per step a batched (batch x m x k) @ (batch x k x n) product."""

    times: int
    batch: int  # blocks x heads for attention's products; 1 for a weight's
    m: int
    k: int
    n: int


def with_gradients(forward: list[Product]) -> list[Product]:
    """Each forward product with its two backward ones: the input's gradient (m x n) @ (n x k) and the other
    operand's (k x m) @ (m x n). Every product of a step needs both (attention's two operands are activations; the
    first layer's input gradient flows on to the embedding)."""
    return [
        product
        for times, batch, m, k, n in forward
        for product in (Product(times, batch, m, k, n), Product(times, batch, m, n, k), Product(times, batch, k, m, n))
    ]


def encoder_products(layers: int, hidden: int, heads: int, seq_len: int, batch: int) -> list[Product]:
    """The forward products of the transformer blocks: per layer QKV (one hidden x 3 hidden product), the output
    projection, the two feed-forward products (4 x hidden), and per head the attention scores and the mixing of the
    values over the whole block (as the FLOP count has them, for causal models too)."""
    tokens, head_size = batch * seq_len, hidden // heads
    forward = [Product(layers, 1, tokens, hidden, width) for width in (3 * hidden, hidden, 4 * hidden)]
    forward.append(Product(layers, 1, tokens, 4 * hidden, hidden))
    forward += [
        Product(layers, batch * heads, seq_len, head_size, seq_len),
        Product(layers, batch * heads, seq_len, seq_len, head_size),
    ]
    return forward


def causal_lm_products(layers: int, hidden: int, heads: int, seq_len: int, batch: int, vocab: int) -> list[Product]:
    """A GPT-2 step's products with their gradients: the blocks, then the vocabulary projection at every position
    (GPT-2 has no head transform)."""
    forward = encoder_products(layers, hidden, heads, seq_len, batch)
    forward.append(Product(1, 1, batch * seq_len, hidden, vocab))
    return with_gradients(forward)


def masked_lm_products(
    layers: int, hidden: int, heads: int, seq_len: int, batch: int, vocab: int, decoded_rows: int
) -> list[Product]:
    """A BERT masked-LM step's products with their gradients, as OUR step executes them: the blocks at every
    position, then the head transform (hidden x hidden) and the vocabulary projection on the `decoded_rows` masked
    positions only (models/masked_lm.py `masked_lm_loss` picks the labelled rows before the head; the vocabulary
    projection and its two gradients run chunked in `linear_cross_entropy`, the same products in row chunks and
    1,024-column slices).

    The peer (`BertForMaskedLM.forward` under the Trainer) executes both head products at every position:
    batch x seq_len rows instead of ~15% of them, its logits then reduced by the loss to the masked rows.
    """
    forward = encoder_products(layers, hidden, heads, seq_len, batch)
    forward += [Product(1, 1, decoded_rows, hidden, hidden), Product(1, 1, decoded_rows, hidden, vocab)]
    return with_gradients(forward)


def expected_masked_rows(tokens: int, probability: float = 0.15) -> int:
    """The masked positions of a step of `tokens` under BERT's rule: `probability` of them. Special tokens are never
    chosen, so a step decodes slightly fewer (a separator per document; ~1% of WikiText-2's tokens)."""
    return round(probability * tokens)


def products_seconds(products: list[Product], repeats: int = 5) -> float:
    """Seconds one training step spends in `products` alone, each timed at its shape with torch's threads."""
    total = 0.0
    for times, batch, m, k, n in products:
        a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
        torch.matmul(a, b)  # warm-up
        start = time.perf_counter()
        for _ in range(repeats):
            torch.matmul(a, b)
        total += times * (time.perf_counter() - start) / repeats
    return total


def products_bound(
    products_s: float,
    step_tokens: int,
    our_tokens_per_s: float,
    peer_tokens_per_s: float,
    useful_flops_per_token: float,
    peak_gflops: float,
) -> dict:
    """The step's products (`products_s`, from `products_seconds`) against our measured step and the peer: what a
    step of nothing but them would run at, as tokens/s, a ratio to the peer and an MFU (the benchmark's numerator)."""
    return {
        "products_ms_per_step": round(1000 * products_s, 1),
        "our_ms_per_step": round(1000 * step_tokens / our_tokens_per_s, 1),
        "products_only_tokens_per_s": round(step_tokens / products_s, 1),
        "products_only_vs_peer": round(step_tokens / products_s / peer_tokens_per_s, 3),
        "products_only_mfu": round(useful_flops_per_token * step_tokens / products_s / (peak_gflops * 1e9), 4),
    }


def bound_line(bound: dict) -> str:
    """The benchmarks' line for `products_bound`'s record."""
    return (
        f"matrix products alone, each timed at its shape: {bound['products_ms_per_step']:.0f} ms of our "
        f"{bound['our_ms_per_step']:.0f} ms step; a step of nothing else would run "
        f"{bound['products_only_tokens_per_s']:,.0f} tokens/s = {bound['products_only_vs_peer']:.2f}x the peer "
        f"(MFU {100 * bound['products_only_mfu']:.1f}%)"
    )
