"""The project's AWD-LSTM language model against fastai's own, side by side on the same tokens.

    python3 -m venv .venv-fastai && .venv-fastai/bin/pip install torch==2.13.0 \
        && .venv-fastai/bin/pip install --no-deps "fastai==2.8.*" fastdownload \
        && .venv-fastai/bin/pip install fastcore fastprogress fasttransform "plum-dispatch<2.10" pandas matplotlib \
           scikit-learn transformers requests pyyaml scipy
    .venv/bin/python bench/awd_lstm_vs_fastai.py                  # ~25 minutes on 2 quiet CPU cores
    .venv/bin/python bench/awd_lstm_vs_fastai.py --recipes        # + our recipes that leave the unigram plateau
    .venv/bin/python bench/awd_lstm_vs_fastai.py --smoke          # 1 x 32 LSTM, BPE 500, 400 lines, 6 steps

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
its log windows of 5 steps after the first window, evaluation excluded). One record per run of one arm goes to the
work folder (--work, default runs/bench-awd-lstm-vs-fastai: runs.jsonl; with --update-results
bench/results/awd_lstm_vs_fastai.jsonl too); the table prints at the end. Without the fastai virtualenv, --smoke runs
our arm alone and says so; a real run stops.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

import _harness as harness
from _common import (
    PEERS,
    ROOT,
    WIKITEXT,
    describe_machine,
    finetune_cli,
    read_jsonl,
    require,
    run_json,
    steady_rate,
    text_lines,
)

TRAIN, VALID = WIKITEXT / "train.txt", WIKITEXT / "valid.txt"
PEER = PEERS / "fastai_awd_lstm_lm.py"
RECIPE = ROOT / "recipes" / "pretrain" / "awd-lstm-wikitext2.yaml"
FASTAI_PYTHON = ROOT / ".venv-fastai" / "bin" / "python"
CONFIGURATION = ("emb", "hidden", "layers", "vocab", "batch", "bptt", "steps", "lr", "seed")
SMOKE = dict(emb=16, hidden=32, layers=1, vocab=500, batch=4, bptt=16, steps=6, eval_every=3)

# Our recipes tried for leaving the unigram plateau fast (rows below the side-by-side pair; ours only, as the
# peer script has no init, schedule or size options beyond the shared ones). Each: overrides on top of `ours`.
INIT = "model.embedding_init_range=0.5"
ONE_CYCLE = ["schedule.kind=one_cycle", "schedule.momentum=[0.8, 0.7]"]
RECIPES = {
    "init 0.5": [INIT],
    "init 0.5, STLR 1e-2": [INIT, "schedule.kind=stlr", "training.lr=1e-2"],
    "init 0.5, STLR 5e-3": [INIT, "schedule.kind=stlr", "training.lr=5e-3"],
    "init 0.1, STLR 1e-2": ["schedule.kind=stlr", "training.lr=1e-2"],
    # fastai's ULMFiT language-model recipe: fit_one_cycle at 1e-2..2e-2 with moms (0.8, 0.7, 0.8); `finetune
    # lr-find` on this model and stream puts the loss minimum near 1e-2 and the run stable up to ~0.2.
    "init 0.5, one-cycle 1e-2": [INIT, *ONE_CYCLE, "training.lr=1e-2"],
    "init 0.5, one-cycle 3e-2": [INIT, *ONE_CYCLE, "training.lr=3e-2"],
}


def peer_training_file(workdir: Path, documents: list[str], seed: int) -> Path:
    """train.txt in the paragraph order our pretrain stage reads in its first epoch (data/causal.py BPTTBatches)."""
    order = np.random.default_rng((seed, 0)).permutation(len(documents))
    path = workdir / "train-epoch0-order.txt"
    path.write_text("".join(documents[index] + "\n" for index in order), encoding="utf-8")
    return path


def check_same_batches(tokenizer_dir: Path, documents: list[str], peer_file: Path, args) -> None:
    """The first training batches of both layouts are the same tokens (else the comparison means nothing)."""
    import torch
    from transformers import AutoTokenizer

    from finetune.data.causal import BPTTBatches
    from finetune.data.token_cache import tokenize_corpus

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tokenizer.eos_token_id
    ours = BPTTBatches(
        tokenize_corpus(tokenizer, documents, show_progress=False), eos, args.batch, args.bptt, args.seed
    )
    chunks = tokenizer(text_lines(peer_file), add_special_tokens=False)["input_ids"]
    ids = [token for chunk in chunks for token in chunk + [eos]]
    columns = (len(ids) - 1) // args.batch
    peer_rows = torch.tensor(ids[: columns * args.batch]).view(args.batch, columns)
    for index in (0, 1, len(ours) - 1):
        if not torch.equal(ours[index]["input_ids"], peer_rows[:, index * args.bptt : (index + 1) * args.bptt]):
            sys.exit(
                f"bench: batch {index} differs between the two layouts; the comparison would not be on the same tokens"
            )


def run_peer(args, tokenizer_dir: Path, train_file: Path) -> dict:
    """fastai's AWD-LSTM through the peer script, as shipped."""
    sizes = ["--emb", args.emb, "--hidden", args.hidden, "--layers", args.layers, "--batch", args.batch]
    command = [args.fastai_python, PEER, "--corpus", train_file, "--valid", args.valid, "--tokenizer", tokenizer_dir]
    command += [*sizes, "--bptt", args.bptt, "--steps", args.steps, "--lr", args.lr, "--eval-every", args.eval_every]
    result = run_json(
        [*command, "--valid-tokens", 0, "--seed", args.seed], echo=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    return {
        "tokens_per_s": result["tokens_per_s"],
        "validation_loss": {r["step"]: r["validation_loss"] for r in result["evals"]},
    }


def run_ours(args, tokenizer_dir: Path, work: Path, name: str, overrides: list[str]) -> dict:
    """`finetune pretrain` with the peer's configuration (plus a recipe's `overrides`)."""
    run_dir = work / ("ours-" + "".join(c if c.isalnum() else "-" for c in name))
    files = [
        f"run_dir={run_dir}",
        "overwrite=true",
        f"corpus.train_files=[{args.train}]",
        f"corpus.validation_files=[{args.valid}]",
    ]
    model = [f"model.embedding_size={args.emb}", f"model.hidden={args.hidden}", f"model.layers={args.layers}"]
    model += [
        "model.embedding_init_range=0.1",
        "model.activation_regularization=2.0",
        "model.temporal_activation_regularization=1.0",
    ]
    training = [f"training.batch_size={args.batch}", f"training.lr={args.lr}", "training.adam_betas=[0.8, 0.99]"]
    training += ["training.weight_decay=0.01", "training.max_grad_norm=0.4", f"training.max_steps={args.steps}"]
    training += ["training.log_every=5" if args.steps > 10 else "training.log_every=2", "training.device=cpu"]
    schedule = [f"eval_every={args.eval_every}", "checkpoint_every=null", "schedule.kind=constant"]
    common = [f"tokenizer.path={tokenizer_dir}", f"seed={args.seed}", f"corpus.block_size={args.bptt}"]
    finetune_cli("pretrain", RECIPE, *files, *common, *model, *training, *schedule, *overrides, echo=True)
    losses = {
        r["step"]: round(r["validation_loss"], 4) for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "eval"
    }
    return {"tokens_per_s": round(steady_rate(run_dir, "tokens"), 1), "validation_loss": losses}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "awd-lstm-vs-fastai", smoke="1 x 32 LSTM, BPE 500, 400 lines, 6 steps")
    for flag, default in (("--steps", 300), ("--eval-every", 50), ("--emb", 200), ("--hidden", 400), ("--layers", 3)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--vocab", type=int, default=8000, help="byte-level BPE size, special tokens included")
    for flag, default in (("--batch", 64), ("--bptt", 70), ("--seed", 0)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--recipes",
        nargs="*",
        metavar="NAME",
        help=f"also run our plateau recipes (all when no name given): {', '.join(RECIPES)}",
    )
    parser.add_argument(
        "--fastai-python",
        type=Path,
        default=FASTAI_PYTHON,
        help="the python of a virtualenv with fastai installed (see the module docstring)",
    )
    args = parser.parse_args()
    work = harness.work_folder(args, "awd-lstm-vs-fastai")
    machine = describe_machine()  # the figures below belong to this machine
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)
    args.train, args.valid = TRAIN, VALID
    if args.smoke:
        vars(args).update(SMOKE)
        args.train = harness.text_head(TRAIN, 400, work / "train-head.txt")
        args.valid = harness.text_head(VALID, 40, work / "valid-head.txt")
    peer = args.fastai_python.is_file()
    if not peer and args.smoke:
        print(
            f"bench: the peer arm skipped: no python with fastai at {args.fastai_python} (see the docstring)",
            file=sys.stderr,
        )
    elif not peer:
        require(
            args.fastai_python,
            "a python with fastai (the .venv-fastai virtualenv)",
            f"see the install lines at the top of {Path(__file__).name}",
        )
    chosen = list(RECIPES) if args.recipes == [] else (args.recipes or [])
    if unknown := [name for name in chosen if name not in RECIPES]:
        sys.exit(f"bench: unknown recipe {unknown[0]!r}; choose from {', '.join(RECIPES)}")
    tokenizer_dir = harness.byte_level_bpe(work / f"bpe-{args.vocab}-{args.train.stem}", args.vocab, args.train)
    from finetune.data.corpus import read_documents  # this checkout's (byte_level_bpe put it first on the path)

    documents = read_documents([args.train])  # our reading of train.txt: one document per non-empty line
    base = {key: getattr(args, key) for key in CONFIGURATION}
    records = []
    if peer:
        peer_file = peer_training_file(work, documents, args.seed)
        check_same_batches(tokenizer_dir, documents, peer_file, args)
        records.append({"arm": "peer", **base, **run_peer(args, tokenizer_dir, peer_file)})
    for name, overrides in (("same", []), *((name, RECIPES[name]) for name in chosen)):
        arm = "ours" if name == "same" else f"ours, {name}"
        records.append({"arm": arm, **base, **run_ours(args, tokenizer_dir, work, name, overrides)})
    for record in records:
        harness.record_run(work, record, "awd_lstm_vs_fastai" if args.update_results else None, machine)
    print(f"\nAWD-LSTM emb {args.emb}, {args.layers} x {args.hidden}, BPE {args.vocab:,}, batch {args.batch} x BPTT "
          f"{args.bptt}, {args.steps} steps; validation loss in nats per token on {args.valid.name}\n")  # fmt: skip
    steps = sorted({step for record in records for step in record["validation_loss"]})
    columns = {"arm": "arm", **{f"step {s}": (lambda r, s=s: r["validation_loss"].get(s)) for s in steps}}
    columns["tokens/s"] = "tokens_per_s"
    if peer:
        columns["vs fastai"] = lambda r: r["tokens_per_s"] / records[0]["tokens_per_s"]
    formats = {f"step {s}": "{:.3f}" for s in steps} | {"tokens/s": "{:,.0f}", "vs fastai": "{:.2f}x"}
    print(harness.markdown_table(records, columns, formats=formats))


if __name__ == "__main__":
    main()
