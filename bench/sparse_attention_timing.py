"""Dense against Sparse Transformer attention at block 512: the cost of a training step, on synthetic tokens.

    .venv/bin/python bench/sparse_attention_timing.py                  # 1 thread, batch 8 x 512, 5 timed steps
    .venv/bin/python bench/sparse_attention_timing.py --threads 2 --batch 4 --steps 3
    .venv/bin/python bench/sparse_attention_timing.py --smoke        # batch 1 x 128, 1 timed step

Each model has the sizes of recipes/pretrain/sparse-gpt2-wikitext2.yaml (4 layers, hidden 256, 4 heads, dropout
0.1, vocabulary 16,000, learned positions) and trains one step (forward, fused decoder + loss, backward) on the
same random token ids: GPT-2 (GPT2LMHeadModel on its written-out route, what plain gpt2 recipes train), then our
causal transformer (models/causal_transformer.py) with dense, strided and fixed attention (stride 32). The patterns
are boolean masks on written-out scores, so they are expected to cost what dense attention costs, or a little more
(the mask is built and applied): this measures that overhead, not a sparse kernel. No data is read.

Prints a table, a row per model (median seconds per step over --steps, after one untimed step), and records each
model's run (its arm) in the work folder (--work, default runs/bench-sparse-attention-timing: runs.jsonl; with
--update-results bench/results/sparse_attention_timing.jsonl).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

import _harness as harness

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
    gpt2 = NextTokenLM(build_causal_lm(CausalLMModelConfig(**sizes), VOCABULARY, block, SPECIAL))
    yield "GPT-2 (GPT2LMHeadModel, written-out route)", gpt2
    for attention in ("dense", "strided", "fixed"):
        stride_or_none = None if attention == "dense" else stride
        config = SimpleNamespace(
            **sizes, intermediate=None, memory_length=0, attention=attention, attention_stride=stride_or_none
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
    parser = harness.benchmark_parser(__doc__, "sparse-attention-timing", smoke="batch 1 x 128, 1 timed step")
    for flag, default in (("--threads", 1), ("--batch", 8), ("--block", 512), ("--stride", 32), ("--steps", 5)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.block, args.steps = 1, 128, 1
    work = harness.work_folder(args, "sparse-attention-timing")
    torch.set_num_threads(args.threads)
    machine = describe_machine()  # the figures below belong to this machine
    torch.manual_seed(0)
    stream = torch.randint(0, VOCABULARY, (args.batch, args.block + 1))
    settings = {key: getattr(args, key) for key in ("threads", "batch", "block", "stride", "steps")}
    records = []
    for name, network in models(args.block, args.stride):
        seconds = seconds_per_step(network, stream[:, :-1], stream[:, 1:], args.steps)
        records.append({"arm": name, **settings, "seconds_per_step": round(seconds, 4)})
        records[-1]["tokens_per_s"] = round(args.batch * args.block / seconds, 1)
        harness.record_run(work, records[-1], "sparse_attention_timing" if args.update_results else None, machine)
    columns = {"model": "arm", "s/step": "seconds_per_step", "tokens/s": "tokens_per_s"}
    print(harness.markdown_table(records, columns, formats={"s/step": "{:.2f}", "tokens/s": "{:,.0f}"}))


if __name__ == "__main__":
    main()
