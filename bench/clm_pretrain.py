"""Causal-LM pretraining: this toolkit against the Hugging Face Trainer (as run_clm.py uses it), side by side.

    .venv/bin/python bench/clm_pretrain.py                        # speed, ~4 minutes on 2 CPU cores (estimate)
    .venv/bin/python bench/clm_pretrain.py --repeats 3            # peer/ours pairs interleaved, median ratio
    .venv/bin/python bench/clm_pretrain.py --equal-time 300       # quality at equal time, ~15 minutes (calibrates)
    .venv/bin/python bench/clm_pretrain.py --equal-time 300 --peer-tokens-per-s 900 --our-tokens-per-s 2500
    .venv/bin/python bench/clm_pretrain.py --work-dir runs/bench-clm ...   # keep the tokenizer for the next run

Both sides train a GPT-2 (4 layers, hidden 256, 4 heads, dropout 0.1, 128 positions) from scratch on the same
first 20,000 non-empty lines of WikiText-2 train.txt from ../shared/data, with sequence length 128 and batch 32,
in this one process tree, on this machine. The tokens: a byte-level BPE of 16,000 pieces trained once on all of
train.txt with the toolkit's own tokenizer code (as bench/awd_lstm_vs_fastai.py does), saved to a folder both
sides read (the peer's --tokenizer, our tokenizer.path). The peer is ../shared/bench/peers/hf_clm_pretrain.py
(Trainer, run_clm.py's group_texts into 128-token blocks, DataCollatorForLanguageModeling(mlm=False); lr 5e-4
with linear decay, no warmup, no weight decay). Ours is `finetune pretrain recipes/pretrain/gpt2-mini-wikitext2.yaml`
with overrides for the same sizes, steps, lr, batch and block size (its own schedule: 6% warmup, then linear decay).
Layouts differ as each tool packs text: the peer concatenates the lines with nothing between them and predicts 127
next tokens per 128-token block; ours puts <|endoftext|> after each line and predicts 128 per 128-token input.

Speed (default mode): tokens/s of training, warm-up excluded on both sides: the peer times each optimizer step
and leaves out its first --peer-warmup; ours sums its metrics.jsonl windows of --log-every steps after the first
(all tokens over all time, not a mean of window rates); our windows include fetching the batch, the peer's step
timer starts after its collator has run. MFU: useful training FLOPs per second (6 x multiply-adds per token:
QKV, output and feed-forward products, attention scores and mixing over the whole block, the vocabulary
projection at every position; `finetune.models.flops.training_flops_per_token`) over the fp32 matmul rate measured here.
Then the ceiling of the ratio on this machine: the step's matrix products alone, each timed at its own shape
(bench/_products.py), as tokens/s, a ratio to the peer and an MFU: no implementation of this model runs faster.

Equal time (--equal-time SECONDS): as bench/mlm_equal_time.py. Each side's step count is 95% of the budget x its
own measured tokens/s / tokens per step (passed as the peer's --steps and our training.max_steps, so both linear
schedules decay to their end inside the budget); wrappers stop a side after the step that crosses the budget
should it run slower than planned (bench/peers/peer_budget.py runs the unchanged peer and saves its model,
bench/ours_budget.py runs `finetune`; its clock also runs through our end-of-epoch validations, on 200 lines, which
the table's trained seconds leave out). Then both saved models are scored by one function here: the mean
next-token cross-entropy of `GPT2LMHeadModel` on WikiText-2 valid.txt, in both block layouts (ours: <|endoftext|>
after each line, 128 inputs predicting 128 tokens; the peer's: lines concatenated, 128-token blocks predicting
127). The peer never sees <|endoftext|> in training, so in our layout it pays for the ~0.9% of targets that are one.

Prints the table (and the command), then one JSON line with every figure of both sides.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from _common import (
    PEERS,
    ROOT,
    STDERR_TAIL,
    WIKITEXT,
    append_result,
    describe_machine,
    finetune_cli,
    read_jsonl,
    require,
    run,
    run_json,
    text_lines,
)
from _products import bound_line, causal_lm_products, products_bound, products_seconds
from awd_lstm_vs_fastai import shared_tokenizer
from mlm_pretrain import training_corpus

sys.path.insert(0, str(ROOT))  # this checkout's finetune, not an installed one
from finetune.models.flops import matmul_gflops, training_flops_per_token

TRAIN, VALID = WIKITEXT / "train.txt", WIKITEXT / "valid.txt"
PEER = PEERS / "hf_clm_pretrain.py"
RECIPE = ROOT / "recipes" / "pretrain" / "gpt2-mini-wikitext2.yaml"
MARGIN = 0.95  # equal time: plan 5% fewer steps than the budget allows (throughput on a shared machine drifts)
STAGE_VALIDATION_LINES = 200  # our stage validates at its end (untimed, unreported): a short file keeps that short


def tokenizer_folder(workdir: Path, vocab: int) -> Path:
    """The shared byte-level BPE: trained on all of train.txt once, then reused from the work folder."""
    folder = workdir / f"bpe-{vocab}"
    if not (folder / "tokenizer" / "tokenizer.json").is_file():
        shared_tokenizer(folder, vocab)  # bench/awd_lstm_vs_fastai.py's: the toolkit's train_byte_level_bpe
    return folder / "tokenizer"


def stage_validation_file(workdir: Path) -> Path:
    """The first lines of valid.txt, for the validation our stage runs after training (not part of any figure)."""
    lines = text_lines(VALID)[:STAGE_VALIDATION_LINES]
    path = workdir / "valid-head.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def peer_command(args, corpus: Path, tokenizer_dir: Path, steps: int) -> list:
    """hf_clm_pretrain.py's arguments for this configuration."""
    return [
        PEER,
        "--corpus",
        corpus,
        "--tokenizer",
        tokenizer_dir,
        "--layers",
        args.layers,
        "--hidden",
        args.hidden,
        "--heads",
        args.heads,
        "--seq-len",
        args.seq_len,
        "--batch",
        args.batch,
        "--steps",
        steps,
        "--warmup",
        args.peer_warmup,
        "--lr",
        args.lr,
        "--max-lines",
        args.max_lines,
    ]


def our_arguments(
    args, corpus: Path, tokenizer_dir: Path, validation: Path, run_dir: Path, steps: int, log_every: int
) -> list:
    """`finetune pretrain`'s recipe and overrides for this configuration."""
    return [
        "pretrain",
        RECIPE,
        f"run_dir={run_dir}",
        f"corpus.train_files=[{corpus}]",
        f"corpus.validation_files=[{validation}]",
        f"tokenizer.path={tokenizer_dir}",
        f"model.layers={args.layers}",
        f"model.hidden={args.hidden}",
        f"model.heads={args.heads}",
        f"model.max_positions={args.seq_len}",
        f"corpus.block_size={args.seq_len}",
        f"training.batch_size={args.batch}",
        f"training.lr={args.lr}",
        f"training.max_steps={steps}",
        "training.epochs=1000",  # max_steps decides the length (and the schedule), however long the corpus
        f"training.log_every={log_every}",
        "eval_every=null",
        "checkpoint_every=null",
        "training.device=cpu",
        *args.set,  # --set
    ]


def train_windows(run_dir: Path) -> list[dict]:
    """Our run's training records (one per --log-every steps)."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    return [record for record in records if record["phase"] == "train"]


def run_peer(args, corpus: Path, tokenizer_dir: Path, steps: int) -> dict:
    """The peer script as shipped; its tokens/s."""
    return run_json([sys.executable, *peer_command(args, corpus, tokenizer_dir, steps)])


def run_ours(args, corpus: Path, tokenizer_dir: Path, validation: Path, steps: int, workdir: Path) -> dict:
    """`finetune pretrain` on the same data; steady-state tokens/s from metrics.jsonl (first window left out)."""
    run_dir = Path(tempfile.mkdtemp(prefix="ours-", dir=workdir)) / "run"  # a fresh one for every repeat
    finetune_cli(*our_arguments(args, corpus, tokenizer_dir, validation, run_dir, steps, args.log_every))
    windows = train_windows(run_dir)
    if len(windows) < 2:
        sys.exit(
            f"bench: our run logged {len(windows)} window(s) of {args.log_every} steps; --our-steps must give "
            "at least two (the first is warm-up)"
        )
    steps_per_window = [record["step"] - previous["step"] for previous, record in itertools.pairwise(windows)]
    tokens = [count * args.batch * args.seq_len for count in steps_per_window]
    seconds = sum(count / record["tokens_per_s"] for count, record in zip(tokens, windows[1:]))
    rate = sum(tokens) / seconds
    # The first window (warm-up; with training.compile, the compilation too) against the same steps at the steady
    # rate: their difference is what starting costs.
    first_tokens = windows[0]["step"] * args.batch * args.seq_len
    start_cost = first_tokens / windows[0]["tokens_per_s"] - first_tokens / rate
    return {"tokens_per_s": round(rate, 1), "steps_timed": sum(steps_per_window), "start_cost_s": round(start_cost, 1)}


def speed(args, corpus: Path, tokenizer_dir: Path, validation: Path, workdir: Path) -> None:
    """Tokens/s and MFU of both sides, --repeats pairs interleaved."""
    peak = matmul_gflops()
    pairs = []
    for _ in range(args.repeats):
        peer = run_peer(args, corpus, tokenizer_dir, args.peer_steps)
        pairs.append((peer, run_ours(args, corpus, tokenizer_dir, validation, args.our_steps, workdir)))
    useful = training_flops_per_token(
        args.layers,
        args.hidden,
        args.seq_len,
        args.vocab,
        masked_fraction=1.0,
        sparse_decoder=False,
        head_transform=False,
    )
    for peer, ours in pairs:
        for side in (peer, ours):
            side["mfu"] = round(side["tokens_per_s"] * useful / (peak * 1e9), 4)
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}; fp32 matmul {peak:.1f} GFLOP/s; useful training FLOPs per token {useful / 1e6:.1f}M"
    )
    print(f"$ python {shlex.join(sys.argv)}")
    print(
        f"\n| pretraining (GPT-2, {args.layers} layers, hidden {args.hidden}, seq {args.seq_len}, batch "
        f"{args.batch}) | tokens/s | vs peer | MFU |\n|---|---:|---:|---:|"
    )
    for number, (peer, ours) in enumerate(pairs, start=1):
        label = f", run {number}" if len(pairs) > 1 else ""
        for name, side in (("Hugging Face Trainer (peer)", peer), ("finetune", ours)):
            print(
                f"| {name}{label} | {side['tokens_per_s']:,.0f} | {side['tokens_per_s'] / peer['tokens_per_s']:.2f}x"
                f" | {100 * side['mfu']:.1f}% |"
            )
    ratios = [ours["tokens_per_s"] / peer["tokens_per_s"] for peer, ours in pairs]
    if len(pairs) > 1:
        print(f"\nmedian ratio: {statistics.median(ratios):.2f}x")
    # The ceiling of the ratio on this machine: a step that did nothing but its matrix products.
    products = causal_lm_products(args.layers, args.hidden, args.heads, args.seq_len, args.batch, args.vocab)
    bound = products_bound(
        products_seconds(products),
        args.batch * args.seq_len,
        statistics.median(ours["tokens_per_s"] for _, ours in pairs),
        statistics.median(peer["tokens_per_s"] for peer, _ in pairs),
        useful,
        peak,
    )
    print("\n" + bound_line(bound))
    result = {
        "benchmark": "clm_pretrain",
        "mode": "speed",
        "configuration": configuration(args),
        "runs": [{"peer": peer, "ours": ours} for peer, ours in pairs],
        "median_ratio": round(statistics.median(ratios), 3),
        "matmul_gflops": round(peak, 1),
        "useful_flops_per_token": useful,
        "products_bound": bound,
    }
    print(json.dumps(result))
    if args.update_results:
        append_result("clm_pretrain", result, machine={**args.machine, "matmul_gflops": result["matmul_gflops"]})


def planned_steps(args, budget_seconds: float, tokens_per_s: float) -> int:
    """Optimizer steps that fit in the budget at the measured throughput (less the margin)."""
    return max(1, math.floor(MARGIN * budget_seconds * tokens_per_s / (args.seq_len * args.batch)))


def train_peer_for(args, corpus: Path, tokenizer_dir: Path, steps: int, budget: float, folder: Path) -> dict:
    """The unchanged peer through bench/peers/peer_budget.py, which stops it at the budget and saves its model."""
    command = [
        sys.executable,
        ROOT / "bench" / "peers" / "peer_budget.py",
        "--budget-seconds",
        budget,
        "--save-to",
        folder,
        "--",
        *peer_command(args, corpus, tokenizer_dir, steps),
    ]
    finished = subprocess.run(list(map(str, command)), capture_output=True, text=True, check=False)
    if not (folder / "budget.json").is_file():  # written right after training, before the peer prints its figure
        sys.exit(f"bench: the peer failed:\n{finished.stderr[-STDERR_TAIL:]}")
    return {**json.loads((folder / "budget.json").read_text()), "model": folder}


def train_ours_for(
    args, corpus: Path, tokenizer_dir: Path, validation: Path, steps: int, budget: float, workdir: Path
) -> dict:
    """`finetune pretrain` with training.max_steps from the plan, through bench/ours_budget.py (the same stop)."""
    run_dir = workdir / "ours-equal-time"
    run(
        [
            sys.executable,
            ROOT / "bench" / "ours_budget.py",
            "--budget-seconds",
            budget,
            "--",
            *our_arguments(args, corpus, tokenizer_dir, validation, run_dir, steps, 10),
        ],
        cwd=ROOT,
    )
    seconds, done = 0.0, 0
    for record in train_windows(run_dir):  # each window's seconds = its tokens / its tokens per second
        seconds += (record["step"] - done) * args.seq_len * args.batch / record["tokens_per_s"]
        done = record["step"]
    return {
        "steps": done,
        "max_steps": steps,
        "train_seconds": round(seconds, 1),
        "stopped_at_budget": done < steps,
        "model": run_dir / "checkpoint",
    }


def validation_layouts(tokenizer, seq_len: int, limit: int | None) -> dict[str, torch.Tensor]:
    """valid.txt as blocks in each side's training layout: {layout: (blocks, length) int64 tensor}."""
    from finetune.data.corpus import pack_blocks, read_documents

    documents = read_documents([VALID])  # stripped non-empty lines, as both sides read their training text
    ids = tokenizer(documents, add_special_tokens=False, verbose=False)["input_ids"]
    # ours (data/causal.py NextTokenBlocks): <|endoftext|> after each line, blocks of seq_len + 1
    ours = pack_blocks(ids, seq_len + 1, tokenizer.eos_token_id)
    # the peer's (run_clm.py group_texts): the lines concatenated as they are, blocks of seq_len
    stream = np.concatenate([np.asarray(line, dtype=np.int64) for line in ids])
    peers = stream[: len(stream) // seq_len * seq_len].reshape(-1, seq_len)
    return {"finetune layout": torch.from_numpy(ours[:limit]), "HF run_clm layout": torch.from_numpy(peers[:limit])}


@torch.inference_mode()
def validation_loss(model_dir: Path, blocks: torch.Tensor, batch: int = 16) -> float:
    """Mean cross-entropy per predicted token of `GPT2LMHeadModel`: each block's token t+1 from tokens 0..t."""
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = GPT2LMHeadModel.from_pretrained(str(model_dir)).eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch):
        part = blocks[start : start + batch]
        logits = model(input_ids=part[:, :-1]).logits.float()
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), part[:, 1:].flatten(), reduction="sum").item()
        count += part[:, 1:].numel()
    return total / count


def equal_time(args, corpus: Path, tokenizer_dir: Path, validation: Path, workdir: Path) -> None:
    """Both sides train for the same wall-clock budget; both checkpoints scored by `validation_loss`."""
    from transformers import AutoTokenizer

    budget = args.equal_time
    peer_rate = args.peer_tokens_per_s or run_peer(args, corpus, tokenizer_dir, 12)["tokens_per_s"]
    our_rate = args.our_tokens_per_s or run_ours(args, corpus, tokenizer_dir, validation, 25, workdir)["tokens_per_s"]
    runs = {
        "Hugging Face Trainer (peer)": train_peer_for(
            args, corpus, tokenizer_dir, planned_steps(args, budget, peer_rate), budget, workdir / "peer-equal-time"
        ),
        "finetune": train_ours_for(
            args, corpus, tokenizer_dir, validation, planned_steps(args, budget, our_rate), budget, workdir
        ),
    }
    layouts = validation_layouts(AutoTokenizer.from_pretrained(tokenizer_dir), args.seq_len, args.validation_blocks)
    for side in runs.values():
        model_dir = side.pop("model")
        side["losses"] = {name: round(validation_loss(model_dir, blocks), 4) for name, blocks in layouts.items()}
    names = list(layouts)
    print(
        f"budget {budget:.0f} s of training per side; planned from {peer_rate:,.0f} (peer) and {our_rate:,.0f} "
        f"(ours) tokens/s; validation: WikiText-2 valid.txt, "
        + ", ".join(f"{len(blocks):,} blocks in the {name}" for name, blocks in layouts.items())
    )
    print(f"$ python {shlex.join(sys.argv)}")
    print(
        f"\n| equal time ({budget:.0f} s, GPT-2 {args.layers} x {args.hidden}) | steps | tokens | trained s | "
        + " | ".join(f"valid loss, {name}" for name in names)
        + " |\n|---|---:|---:|---:|"
        + "---:|" * len(names)
    )
    for label, side in runs.items():
        print(
            f"| {label} | {side['steps']:,} | {side['steps'] * args.seq_len * args.batch:,} | "
            f"{side['train_seconds']:.0f} | " + " | ".join(f"{side['losses'][name]:.3f}" for name in names) + " |"
        )
    result = {
        "benchmark": "clm_pretrain",
        "mode": "equal_time",
        "configuration": configuration(args),
        "budget_seconds": budget,
        "peer_tokens_per_s": peer_rate,
        "our_tokens_per_s": our_rate,
        "validation_blocks": {name: len(blocks) for name, blocks in layouts.items()},
        "runs": runs,
    }
    print(json.dumps(result))
    if args.update_results:
        append_result("clm_pretrain", result, machine=args.machine)


def configuration(args) -> dict:
    """The shared configuration, for the JSON line."""
    return {
        key: getattr(args, key) for key in ("layers", "hidden", "heads", "seq_len", "batch", "lr", "vocab", "max_lines")
    }


def arguments_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring); its defaults are the benchmark's configuration (which
    bench/step_profile.py profiles too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per block (our corpus.block_size)")
    parser.add_argument("--batch", type=int, default=32, help="blocks per optimizer step")
    parser.add_argument("--lr", type=float, default=5e-4, help="peak LR of both sides (the peer's default)")
    parser.add_argument("--vocab", type=int, default=16000, help="byte-level BPE size, special tokens included")
    parser.add_argument("--max-lines", type=int, default=20000, help="first non-empty lines of train.txt trained on")
    parser.add_argument("--peer-steps", type=int, default=20, help="speed: optimizer steps the peer runs")
    parser.add_argument("--peer-warmup", type=int, default=3, help="the peer's first steps left out of its figure")
    parser.add_argument("--our-steps", type=int, default=40, help="speed: optimizer steps we run")
    parser.add_argument(
        "--log-every",
        type=int,
        default=5,
        help="speed: steps per metrics window of ours (the first window is left out)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="speed: peer-then-ours pairs, interleaved")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more overrides for our side, e.g. training.compile=true",
    )
    parser.add_argument(
        "--equal-time",
        type=float,
        metavar="SECONDS",
        help="quality at equal training time instead "
        "of speed: each side trains this long, then both are scored on valid.txt",
    )
    parser.add_argument("--peer-tokens-per-s", type=float, help="equal time: the peer's rate (default: measured)")
    parser.add_argument("--our-tokens-per-s", type=float, help="equal time: our rate (default: measured)")
    parser.add_argument("--validation-blocks", type=int, help="equal time: score only the first N blocks per layout")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the tokenizer (and runs) here and reuse the tokenizer (default: a temporary folder)",
    )
    parser.add_argument(
        "--update-results", action="store_true", help="also append the result to bench/results/clm_pretrain.jsonl"
    )
    return parser


def main() -> None:
    args = arguments_parser().parse_args()
    args.machine = describe_machine()  # the figures below belong to this machine (and to --update-results)
    sys.path.insert(0, str(ROOT))  # this repository's finetune, as `finetune_cli` runs it (not another checkout's)
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)

    with tempfile.TemporaryDirectory(prefix="clm-pretrain-") as folder:
        workdir = args.work_dir or Path(folder)
        workdir.mkdir(parents=True, exist_ok=True)
        tokenizer_dir = tokenizer_folder(workdir, args.vocab)
        corpus, validation = training_corpus(workdir, args.max_lines), stage_validation_file(workdir)
        runs_dir = Path(tempfile.mkdtemp(prefix="runs-", dir=workdir))
        if args.equal_time:
            equal_time(args, corpus, tokenizer_dir, validation, runs_dir)
        else:
            speed(args, corpus, tokenizer_dir, validation, runs_dir)


if __name__ == "__main__":
    main()
