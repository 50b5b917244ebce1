"""Causal-LM pretraining: this toolkit against the Hugging Face Trainer (as run_clm.py uses it), side by side.

    .venv/bin/python bench/clm_pretrain.py                        # speed, ~4 minutes on 2 CPU cores (estimate)
    .venv/bin/python bench/clm_pretrain.py --repeats 3            # peer/ours pairs interleaved, median ratio
    .venv/bin/python bench/clm_pretrain.py --equal-time 300       # quality at equal time, ~15 minutes (calibrates)
    .venv/bin/python bench/clm_pretrain.py --equal-time 300 --peer-tokens-per-s 900 --our-tokens-per-s 2500
    .venv/bin/python bench/clm_pretrain.py --work-dir runs/bench-clm ...  # default: runs/bench-clm-pretrain
    .venv/bin/python bench/clm_pretrain.py --smoke                # GPT-2 1 x 32, BPE 500, a few steps: the same path

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

Equal time (--equal-time SECONDS): as bench/mlm_pretrain.py's. Each side's step count is 95% of the budget x its
own measured tokens/s / tokens per step (passed as the peer's --steps and our training.max_steps, so both linear
schedules decay to their end inside the budget); wrappers stop a side after the step that crosses the budget
should it run slower than planned (bench/peers/peer_budget.py runs the unchanged peer and saves its model,
bench/ours_budget.py runs `finetune`; its clock also runs through our end-of-epoch validations, on 200 lines, which
the table's trained seconds leave out). Then both saved models are scored by one function here: the mean
next-token cross-entropy of `GPT2LMHeadModel` on WikiText-2 valid.txt, in both block layouts (ours: <|endoftext|>
after each line, 128 inputs predicting 128 tokens; the peer's: lines concatenated, 128-token blocks predicting
127). The peer never sees <|endoftext|> in training, so in our layout it pays for the ~0.9% of targets that are one.

The work folder keeps the tokenizer for the next run and logs one record per run of one arm (runs.jsonl; with
--update-results bench/results/clm_pretrain.jsonl too); the table prints at the end.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import torch

import _harness as harness
from _common import PEERS, ROOT, WIKITEXT, describe_machine, finetune_cli, require, run_json
from _products import bound_line, causal_lm_products, products_bound, products_seconds

sys.path.insert(0, str(ROOT))  # this checkout's finetune, not an installed one
from finetune.models.flops import training_flops_per_token

TRAIN, VALID = WIKITEXT / "train.txt", WIKITEXT / "valid.txt"
PEER = PEERS / "hf_clm_pretrain.py"
RECIPE = ROOT / "recipes" / "pretrain" / "gpt2-mini-wikitext2.yaml"
STAGE_VALIDATION_LINES = 200  # our stage validates at its end (untimed, unreported): a short file keeps that short
CONFIGURATION = ("layers", "hidden", "heads", "seq_len", "batch", "lr", "vocab", "max_lines")
SMOKE = dict(layers=1, hidden=32, heads=2, seq_len=32, batch=4, vocab=500, max_lines=400, peer_steps=5, our_steps=6)
SMOKE.update(peer_warmup=1, log_every=2, validation_blocks=8)


def peer_command(args, corpus: Path, tokenizer_dir: Path, steps: int) -> list:
    """hf_clm_pretrain.py and its arguments for this configuration."""
    sizes = ["--layers", args.layers, "--hidden", args.hidden, "--heads", args.heads, "--seq-len", args.seq_len]
    rest = ["--batch", args.batch, "--steps", steps, "--warmup", args.peer_warmup, "--lr", args.lr]
    return [PEER, "--corpus", corpus, "--tokenizer", tokenizer_dir, *sizes, *rest, "--max-lines", args.max_lines]


def our_arguments(args, corpus, tokenizer_dir, validation, run_dir: Path, steps: int, log_every: int) -> list:
    """`finetune pretrain`'s recipe and overrides for this configuration."""
    files = [f"run_dir={run_dir}", f"corpus.train_files=[{corpus}]", f"corpus.validation_files=[{validation}]"]
    sizes = [f"model.layers={args.layers}", f"model.hidden={args.hidden}", f"model.heads={args.heads}"]
    sizes += [f"model.max_positions={args.seq_len}", f"corpus.block_size={args.seq_len}"]
    training = [f"training.batch_size={args.batch}", f"training.lr={args.lr}", f"training.max_steps={steps}"]
    # max_steps decides the length (and the schedule), however long the corpus
    training += ["training.epochs=1000", f"training.log_every={log_every}", "training.device=cpu"]
    rest = ["eval_every=null", "checkpoint_every=null", "overwrite=true", *args.set]  # --set last
    return ["pretrain", RECIPE, *files, f"tokenizer.path={tokenizer_dir}", *sizes, *training, *rest]


def run_peer(args, corpus: Path, tokenizer_dir: Path, steps: int) -> dict:
    """The peer script as shipped; its tokens/s."""
    return run_json([sys.executable, *peer_command(args, corpus, tokenizer_dir, steps)])


def run_ours(args, corpus, tokenizer_dir, validation, steps: int, run_dir: Path) -> dict:
    """`finetune pretrain` on the same data; steady-state tokens/s from metrics.jsonl (first window left out)."""
    finetune_cli(*our_arguments(args, corpus, tokenizer_dir, validation, run_dir, steps, args.log_every))
    return harness.pretrain_speed(run_dir, args.batch * args.seq_len)


def speed(args, corpus, tokenizer_dir, validation, work: Path) -> list[dict]:
    """Tokens/s and MFU of both arms, --repeats pairs interleaved: a record per run of one arm."""
    peak = args.machine["matmul_gflops_fp32"]
    sizes = (args.layers, args.hidden, args.seq_len, args.vocab)
    useful = training_flops_per_token(*sizes, masked_fraction=1.0, sparse_decoder=False, head_transform=False)
    base = {"mode": "speed", **{key: getattr(args, key) for key in CONFIGURATION}, "overrides": args.set}
    base["useful_flops_per_token"] = useful
    records = []
    for repeat in range(args.repeats):
        peer = run_peer(args, corpus, tokenizer_dir, args.peer_steps)
        ours = run_ours(args, corpus, tokenizer_dir, validation, args.our_steps, work / f"ours-{repeat}")
        records += [{"arm": arm, **base, "repeat": repeat, **side} for arm, side in (("peer", peer), ("ours", ours))]
    for record in records:
        record["mfu"] = round(record["tokens_per_s"] * useful / (peak * 1e9), 4)
    peers, ours = records[0::2], records[1::2]
    records[-1]["median_ratio"] = round(
        statistics.median(o["tokens_per_s"] / p["tokens_per_s"] for p, o in zip(peers, ours)), 3
    )
    # The ceiling of the ratio on this machine: a step that did nothing but its matrix products.
    products = causal_lm_products(args.layers, args.hidden, args.heads, args.seq_len, args.batch, args.vocab)
    median = {
        arm: statistics.median(r["tokens_per_s"] for r in side) for arm, side in (("peer", peers), ("ours", ours))
    }
    bound = products_bound(
        products_seconds(products), args.batch * args.seq_len, median["ours"], median["peer"], useful, peak
    )
    records[-1]["products_bound"] = bound
    print(f"\nGPT-2 {args.layers} layers x {args.hidden}, seq {args.seq_len}, batch {args.batch}; useful training "
          f"FLOPs per token {useful / 1e6:.1f}M; mean [95% interval] over {args.repeats} repeat(s)\n")  # fmt: skip
    columns = {"tokens/s": "tokens_per_s", "vs peer": lambda r: r["tokens_per_s"] / peers[r["repeat"]]["tokens_per_s"]}
    columns["MFU %"] = lambda r: 100 * r["mfu"]
    print(harness.markdown_table(records, columns, by=("arm",), formats={"tokens/s": "{:,.0f}", "vs peer": "{:.2f}x"}))
    print("\n" + bound_line(bound))
    return records


def validation_layouts(tokenizer, seq_len: int, limit: int | None) -> dict[str, torch.Tensor]:
    """valid.txt as blocks in each arm's training layout: {layout: (blocks, length) int64 tensor}."""
    from finetune.data.corpus import pack_blocks, read_documents

    documents = read_documents([VALID])  # stripped non-empty lines, as both arms read their training text
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


def equal_time(args, corpus, tokenizer_dir, validation, work: Path) -> list[dict]:
    """Both arms train for the same wall-clock budget; both checkpoints scored by `validation_loss`."""
    from transformers import AutoTokenizer

    peer_steps, our_steps = (5, 8) if args.smoke else (12, 25)  # calibration: the rates measured first
    rates = {
        "peer": args.peer_tokens_per_s or run_peer(args, corpus, tokenizer_dir, peer_steps)["tokens_per_s"],
        "ours": args.our_tokens_per_s
        or run_ours(args, corpus, tokenizer_dir, validation, our_steps, work / "ours-calibration")["tokens_per_s"],
    }
    layouts = validation_layouts(AutoTokenizer.from_pretrained(tokenizer_dir), args.seq_len, args.validation_blocks)
    records = harness.equal_time_runs(
        args.equal_time,
        rates,
        args.batch * args.seq_len,
        lambda steps: peer_command(args, corpus, tokenizer_dir, steps),
        lambda steps, run_dir: our_arguments(args, corpus, tokenizer_dir, validation, run_dir, steps, 10),
        work,
        lambda model: {name: round(validation_loss(model, blocks), 4) for name, blocks in layouts.items()},
    )
    blocks = {name: len(blocks) for name, blocks in layouts.items()}
    print(f"GPT-2 {args.layers} x {args.hidden}; validation: WikiText-2 valid.txt, {blocks} blocks")
    base = {"mode": "equal_time", **{key: getattr(args, key) for key in CONFIGURATION}, "validation_blocks": blocks}
    return [{"arm": record["arm"], **base, **record} for record in records]


def parser():
    """The command line (see the module docstring); its defaults are the benchmark's configuration (which
    bench/step_profile.py profiles too)."""
    parser = harness.benchmark_parser(__doc__, "clm-pretrain", smoke="GPT-2 1 x 32, BPE 500, 400 lines, 5-6 steps")
    for flag, default in (("--layers", 4), ("--hidden", 256), ("--heads", 4)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per block (our corpus.block_size)")
    parser.add_argument("--batch", type=int, default=32, help="blocks per optimizer step")
    parser.add_argument("--lr", type=float, default=5e-4, help="peak LR of both arms (the peer's default)")
    parser.add_argument("--vocab", type=int, default=16000, help="byte-level BPE size, special tokens included")
    parser.add_argument("--max-lines", type=int, default=20000, help="first non-empty lines of train.txt trained on")
    parser.add_argument("--peer-steps", type=int, default=20, help="speed: optimizer steps the peer runs")
    parser.add_argument("--peer-warmup", type=int, default=3, help="the peer's first steps left out of its figure")
    parser.add_argument("--our-steps", type=int, default=40, help="speed: optimizer steps we run")
    parser.add_argument("--log-every", type=int, default=5, help="speed: steps a window of ours (the first left out)")
    return harness.pretrain_flags(parser)


def main() -> None:
    args = parser().parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    work = harness.work_folder(args, "clm-pretrain")
    args.machine = describe_machine()  # the figures below belong to this machine (and to --update-results)
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)
    tokenizer_dir = harness.byte_level_bpe(work / f"bpe-{args.vocab}", args.vocab, TRAIN)  # trained once
    corpus = harness.text_head(TRAIN, args.max_lines, work / f"wikitext2-{args.max_lines}-lines.txt")
    # for the validation our stage runs after training (in no figure)
    validation = harness.text_head(VALID, STAGE_VALIDATION_LINES, work / "valid-head.txt")
    records = (equal_time if args.equal_time else speed)(args, corpus, tokenizer_dir, validation, work)
    for record in records:
        harness.record_run(work, record, "clm_pretrain" if args.update_results else None, args.machine)


if __name__ == "__main__":
    main()
