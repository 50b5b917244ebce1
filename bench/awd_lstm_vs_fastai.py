"""The project's AWD-LSTM language model against fastai's own, side by side on the same tokens.

    python3 -m venv .venv-fastai && .venv-fastai/bin/pip install torch==2.13.0 \
        && .venv-fastai/bin/pip install --no-deps "fastai==2.8.*" fastdownload \
        && .venv-fastai/bin/pip install fastcore fastprogress fasttransform "plum-dispatch<2.10" pandas matplotlib \
           scikit-learn transformers requests pyyaml scipy
    .venv/bin/python bench/awd_lstm_vs_fastai.py                  # ~25 minutes on 2 quiet CPU cores
    .venv/bin/python bench/awd_lstm_vs_fastai.py --recipes        # + our recipes that leave the unigram plateau

The peer is ../shared/bench/peers/fastai_awd_lstm_lm.py, run as shipped in its own virtualenv (fastai pins
its own dependencies; the install line above is the peer docstring's plus the three modules fastai 2.8
imports at start-up that the docstring's line leaves out: requests, pyyaml, scipy, and fastdownload).

Same everything, both sides:
- tokens: a byte-level BPE (--vocab, default 8,000) trained once on WikiText-2 train.txt with the toolkit's
  tokenizer code, saved to a folder both sides read. Our pretrain stage shuffles the paragraphs each epoch;
  the peer reads its file in order, so the peer gets train.txt rewritten in our first epoch's paragraph order.
  The two token streams are then identical, batch for batch (checked here before training: the first batches
  of both layouts are compared);
- model: embedding --emb, --layers LSTM layers of --hidden, tied decoder, fastai's five dropouts, embedding
  drawn in [-0.1, 0.1] (fastai's init), AR 2.0 and TAR 1.0 (fastai's RNNRegularizer defaults);
- training: batch 64 x BPTT 70, AdamW lr 2e-3 (constant, as the peer runs it), betas (0.8, 0.99), weight
  decay 0.01, gradient clipping 0.4, --steps optimizer steps;
- validation: the whole of valid.txt as 64 streams read 70 tokens at a time from a fresh state, every
  --eval-every steps, in nats per token (the peer also scores the last partial BPTT window of each row,
  ours leaves out the < 70 remainder tokens: 0.4% of the tokens).
Differences that remain: weight decay (ours decays weight matrices only, the peer's AdamW every parameter,
biases included) and the padding row of the embedding (zero in ours, drawn in fastai's).

tokens/s is training time only on both sides (the peer times each step and skips --warmup 3 steps; ours sums
its log windows of 5 steps after the first window, evaluation excluded). Prints the table, then one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

from _common import (
    PEERS,
    ROOT,
    WIKITEXT,
    append_result,
    describe_machine,
    finetune_cli,
    read_jsonl,
    require,
    run_json,
    text_lines,
)

TRAIN, VALID = WIKITEXT / "train.txt", WIKITEXT / "valid.txt"
PEER = PEERS / "fastai_awd_lstm_lm.py"
RECIPE = ROOT / "recipes" / "pretrain" / "awd-lstm-wikitext2.yaml"
FASTAI_PYTHON = ROOT / ".venv-fastai" / "bin" / "python"

# Our recipes tried for leaving the unigram plateau fast (rows below the side-by-side pair; ours only, as the
# peer script has no init, schedule or size options beyond the shared ones). Each: overrides on top of `ours`.
RECIPES = {
    "init 0.5": ["model.embedding_init_range=0.5"],
    "init 0.5, STLR 1e-2": ["model.embedding_init_range=0.5", "schedule.kind=stlr", "training.lr=1e-2"],
    "init 0.5, STLR 5e-3": ["model.embedding_init_range=0.5", "schedule.kind=stlr", "training.lr=5e-3"],
    "init 0.1, STLR 1e-2": ["schedule.kind=stlr", "training.lr=1e-2"],
    # fastai's ULMFiT language-model recipe: fit_one_cycle at 1e-2..2e-2 with moms (0.8, 0.7, 0.8); `finetune
    # lr-find` on this model and stream puts the loss minimum near 1e-2 and the run stable up to ~0.2.
    "init 0.5, one-cycle 1e-2": [
        "model.embedding_init_range=0.5",
        "schedule.kind=one_cycle",
        "training.lr=1e-2",
        "schedule.momentum=[0.8, 0.7]",
    ],
    "init 0.5, one-cycle 3e-2": [
        "model.embedding_init_range=0.5",
        "schedule.kind=one_cycle",
        "training.lr=3e-2",
        "schedule.momentum=[0.8, 0.7]",
    ],
}


def shared_tokenizer(workdir: Path, vocab: int) -> tuple[Path, list[str]]:
    """The byte-level BPE both sides read, and our reading of train.txt (one document per non-empty line)."""
    sys.path.insert(0, str(ROOT))
    from finetune.data.corpus import read_documents
    from finetune.data.tokenizers import train_byte_level_bpe

    documents = read_documents([TRAIN])
    folder = workdir / "tokenizer"
    train_byte_level_bpe(documents, vocab).save_pretrained(folder)
    return folder, documents


def peer_training_file(workdir: Path, documents: list[str], seed: int) -> Path:
    """train.txt in the paragraph order our pretrain stage reads in its first epoch (data/causal.py BPTTBatches)."""
    order = np.random.default_rng((seed, 0)).permutation(len(documents))
    path = workdir / "train-epoch0-order.txt"
    path.write_text("".join(documents[index] + "\n" for index in order), encoding="utf-8")
    return path


def check_same_batches(
    tokenizer_dir: Path, documents: list[str], peer_file: Path, seed: int, batch: int, bptt: int
) -> None:
    """The first training batches of both layouts are the same tokens (else the comparison means nothing)."""
    import torch
    from transformers import AutoTokenizer

    from finetune.data.causal import BPTTBatches
    from finetune.data.token_cache import tokenize_corpus

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ours = BPTTBatches(
        tokenize_corpus(tokenizer, documents, show_progress=False), tokenizer.eos_token_id, batch, bptt, seed
    )
    lines = text_lines(peer_file)
    ids = [
        token
        for chunk in tokenizer(lines, add_special_tokens=False)["input_ids"]
        for token in chunk + [tokenizer.eos_token_id]
    ]
    columns = (len(ids) - 1) // batch
    peer_rows = torch.tensor(ids[: columns * batch]).view(batch, columns)
    for index in (0, 1, len(ours) - 1):
        start = index * bptt
        if not torch.equal(ours[index]["input_ids"], peer_rows[:, start : start + bptt]):
            sys.exit(
                f"bench: batch {index} differs between the two layouts; the comparison would not be on the same tokens"
            )


def run_peer(args, tokenizer_dir: Path, train_file: Path) -> dict:
    """fastai's AWD-LSTM through the peer script, as shipped."""
    command = [
        args.fastai_python,
        PEER,
        "--corpus",
        train_file,
        "--valid",
        VALID,
        "--tokenizer",
        tokenizer_dir,
        "--emb",
        args.emb,
        "--hidden",
        args.hidden,
        "--layers",
        args.layers,
        "--batch",
        args.batch,
        "--bptt",
        args.bptt,
        "--steps",
        args.steps,
        "--lr",
        args.lr,
        "--eval-every",
        args.eval_every,
        "--valid-tokens",
        0,
        "--seed",
        args.seed,
    ]
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = run_json(command, echo=True, env=environment)
    return {
        "tokens_per_s": result["tokens_per_s"],
        "validation_loss": {record["step"]: record["validation_loss"] for record in result["evals"]},
    }


def run_ours(args, tokenizer_dir: Path, workdir: Path, name: str, overrides: list[str]) -> dict:
    """`finetune pretrain` with the peer's configuration (plus a recipe's `overrides`)."""
    run_dir = workdir / ("ours-" + "".join(c if c.isalnum() else "-" for c in name))
    finetune_cli(
        "pretrain",
        RECIPE,
        f"run_dir={run_dir}",
        f"corpus.train_files=[{TRAIN}]",
        f"corpus.validation_files=[{VALID}]",
        f"tokenizer.path={tokenizer_dir}",
        f"seed={args.seed}",
        f"corpus.block_size={args.bptt}",
        f"model.embedding_size={args.emb}",
        f"model.hidden={args.hidden}",
        f"model.layers={args.layers}",
        "model.embedding_init_range=0.1",
        "model.activation_regularization=2.0",
        "model.temporal_activation_regularization=1.0",
        f"training.batch_size={args.batch}",
        f"training.lr={args.lr}",
        "training.adam_betas=[0.8, 0.99]",
        "training.weight_decay=0.01",
        "training.max_grad_norm=0.4",
        f"training.max_steps={args.steps}",
        "training.log_every=5",
        f"eval_every={args.eval_every}",
        "checkpoint_every=null",
        "schedule.kind=constant",
        "training.device=cpu",
        *overrides,
        echo=True,
    )
    records = read_jsonl(run_dir / "metrics.jsonl")
    windows = [record for record in records if record["phase"] == "train"]
    steps = [record["step"] - previous["step"] for previous, record in itertools.pairwise(windows)]
    tokens = [count * args.batch * args.bptt for count in steps]
    seconds = sum(count / record["tokens_per_s"] for count, record in zip(tokens, windows[1:]))
    return {
        "tokens_per_s": round(sum(tokens) / seconds, 1),
        "validation_loss": {
            record["step"]: round(record["validation_loss"], 4) for record in records if record["phase"] == "eval"
        },
    }


def print_table(rows: dict[str, dict], peer_name: str) -> None:
    """Validation loss at each evaluated step, tokens/s and the ratio to the peer, one row per run."""
    steps = sorted({step for row in rows.values() for step in row["validation_loss"]})
    peer = rows[peer_name]
    print("\n| run | " + " | ".join(f"step {step}" for step in steps) + " | tokens/s | vs fastai |")
    print("|---|" + "---:|" * (len(steps) + 2))
    for name, row in rows.items():
        losses = " | ".join(
            f"{row['validation_loss'][step]:.3f}" if step in row["validation_loss"] else "-" for step in steps
        )
        print(f"| {name} | {losses} | {row['tokens_per_s']:,.0f} | {row['tokens_per_s'] / peer['tokens_per_s']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--emb", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=400)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8000, help="byte-level BPE size, special tokens included")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--recipes",
        nargs="*",
        metavar="NAME",
        default=None,
        help=f"also run our plateau recipes (all when no name given): {', '.join(RECIPES)}",
    )
    parser.add_argument(
        "--fastai-python",
        type=Path,
        default=FASTAI_PYTHON,
        help="the python of a virtualenv with fastai installed (see the module docstring)",
    )
    parser.add_argument(
        "--update-results", action="store_true", help="also append the result to bench/results/awd_lstm_vs_fastai.jsonl"
    )
    args = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)
    require(
        args.fastai_python,
        "a python with fastai (the .venv-fastai virtualenv)",
        f"see the install lines at the top of {Path(__file__).name}",
    )
    chosen = list(RECIPES) if args.recipes == [] else (args.recipes or [])
    unknown = [name for name in chosen if name not in RECIPES]
    if unknown:
        sys.exit(f"bench: unknown recipe {unknown[0]!r}; choose from {', '.join(RECIPES)}")

    with tempfile.TemporaryDirectory(prefix="awd-lstm-vs-fastai-") as folder:
        workdir = Path(folder)
        tokenizer_dir, documents = shared_tokenizer(workdir, args.vocab)
        peer_file = peer_training_file(workdir, documents, args.seed)
        check_same_batches(tokenizer_dir, documents, peer_file, args.seed, args.batch, args.bptt)
        rows = {
            "fastai AWD-LSTM (peer)": run_peer(args, tokenizer_dir, peer_file),
            "finetune, same recipe": run_ours(args, tokenizer_dir, workdir, "same", []),
        }
        for name in chosen:
            rows[f"finetune, {name}"] = run_ours(args, tokenizer_dir, workdir, name, RECIPES[name])

    print(
        f"\nmachine: {platform.processor() or platform.machine()}; AWD-LSTM emb {args.emb}, {args.layers} x "
        f"{args.hidden}, BPE {args.vocab:,}, batch {args.batch} x BPTT {args.bptt}, {args.steps} steps; "
        f"validation loss in nats per token on all of WikiText-2 valid.txt"
    )
    print_table(rows, "fastai AWD-LSTM (peer)")
    result = {
        "benchmark": "awd_lstm_vs_fastai",
        "emb": args.emb,
        "hidden": args.hidden,
        "layers": args.layers,
        "vocab": args.vocab,
        "batch": args.batch,
        "bptt": args.bptt,
        "steps": args.steps,
        "lr": args.lr,
        "seed": args.seed,
        "runs": rows,
    }
    print(json.dumps(result))
    if args.update_results:
        append_result("awd_lstm_vs_fastai", result, machine=machine)


if __name__ == "__main__":
    main()
