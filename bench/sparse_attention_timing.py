"""Dense against Sparse Transformer attention at block 512: the cost of a training step, on synthetic tokens.

    .venv/bin/python bench/sparse_attention_timing.py                  # 1 thread, batch 8 x 512, 5 timed steps
    .venv/bin/python bench/sparse_attention_timing.py --threads 2 --batch 4 --steps 3

Each model has the sizes of recipes/pretrain/sparse-gpt2-wikitext2.yaml (4 layers, hidden 256, 4 heads, dropout
0.1, vocabulary 16,000, learned positions) and trains one step (forward, fused decoder + loss, backward) on the
same random token ids: GPT-2 (GPT2LMHeadModel on its written-out route, what plain gpt2 recipes train), then our
causal transformer (models/causal_transformer.py) with dense, strided and fixed attention (stride 32). The patterns
are boolean masks on written-out scores, so they are expected to cost what dense attention costs, or a little more
(the mask is built and applied): this measures that overhead, not a sparse kernel. No data is read.

Prints one line per model (median seconds per step over --steps, after one untimed step) and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import describe_machine
from finetune.models.causal_lm import MemoryNextTokenLM, NextTokenLM, build_causal_lm
from finetune.models.causal_transformer import build_causal_transformer
from finetune.recipes import CausalLMModelConfig

VOCABULARY = 16000
SPECIAL = SimpleNamespace(bos_token_id=0, eos_token_id=0, pad_token_id=0)


def models(block: int, stride: int):
    """(name, training module) for GPT-2 and our model with each attention pattern, all of one size."""
    sizes = {"family": "gpt2", "layers": 4, "hidden": 256, "heads": 4, "dropout": 0.1}
    yield (
        "GPT-2 (GPT2LMHeadModel, written-out route)",
        NextTokenLM(build_causal_lm(CausalLMModelConfig(**sizes), VOCABULARY, block, SPECIAL)),
    )
    for attention in ("dense", "strided", "fixed"):
        config = SimpleNamespace(
            **sizes,
            intermediate=None,
            memory_length=0,
            attention=attention,
            attention_stride=None if attention == "dense" else stride,
        )
        yield (
            f"ours, {attention} attention",
            MemoryNextTokenLM(build_causal_transformer(config, VOCABULARY, block, SPECIAL)),
        )


def seconds_per_step(network: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, steps: int) -> float:
    """Median wall time of a training step (forward and backward; no optimizer: the same for every model)."""
    network.train()
    times = []
    for step in range(steps + 1):
        started = time.perf_counter()
        loss, _, _ = network(input_ids, labels)
        loss.backward()
        network.zero_grad(set_to_none=True)
        if step:  # the first step warms the allocator and caches up
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--stride", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    describe_machine()  # the figures below belong to this machine
    torch.manual_seed(0)
    stream = torch.randint(0, VOCABULARY, (arguments.batch, arguments.block + 1))
    input_ids, labels = stream[:, :-1], stream[:, 1:]
    results = {}
    for name, network in models(arguments.block, arguments.stride):
        results[name] = seconds_per_step(network, input_ids, labels, arguments.steps)
        print(
            f"{name:45s} {results[name]:6.2f} s/step  "
            f"{arguments.batch * arguments.block / results[name]:8,.0f} tokens/s",
            flush=True,
        )
    print(
        json.dumps(
            {
                "threads": arguments.threads,
                "batch": arguments.batch,
                "block": arguments.block,
                "stride": arguments.stride,
                "seconds_per_step": results,
            }
        )
    )


if __name__ == "__main__":
    main()
