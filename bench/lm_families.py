"""The language-model families side by side on WikiText-2: validation loss at equal training tokens, speed, size.

    .venv/bin/python bench/lm_families.py                              # every variant, 1M training tokens each
    .venv/bin/python bench/lm_families.py --variants ngram-3 qrnn gpt2 --tokens 2000000
    .venv/bin/python bench/lm_families.py --table-only                 # the table of the runs so far
    .venv/bin/python bench/lm_families.py --variants gpt2 transformer-xl --long-context   # + longer contexts
    .venv/bin/python bench/lm_families.py --smoke      # ngram-3, gpt2, awd_lstm on 20,000 tokens, BPE 500, 400 lines

Every variant is `finetune pretrain` with a shipped recipe (recipes/pretrain/, VARIANTS) and the same byte-level BPE
of 16,000 pieces, trained once on WikiText-2 train.txt (../shared/data) with the toolkit's tokenizer code and
passed to every run as tokenizer.path, so losses are in nats per token of the same tokens. Each neural run trains
for --tokens training tokens (training.max_steps = tokens / (batch x block), the recipe's own batch, block,
learning rate and schedule), then validates on valid.txt. The n-gram baseline is counted on the whole of
train.txt (it has no steps; counting takes seconds).

What the loss means per family: each family validates in its own layout. gpt2 and the n-gram score 128-token
blocks (gpt2-strided and its dense twin gpt2-512: 512-token blocks), each token with the context before it in its
block; the AWD-LSTM family (lstm, qrnn, rnn cells) and Transformer-XL read valid.txt as BPTT streams with the state
(memory) carried through, so their tokens see longer contexts. All are nats per token of valid.txt's next tokens.

Columns: validation loss (nats/token) and perplexity at the end, next-token accuracy, training tokens/s (all
tokens over all time of the metrics windows after the first, as bench/mlm_pretrain.py counts), parameters (the
checkpoint's tensors; for the n-gram the stored n-grams) and the run's wall time. Runs are kept in the work folder
(--work, default runs/bench-lm-families: a folder per variant and token count, a record each in runs.jsonl); a variant
with a finished run is not run again. --update-results appends every record to bench/results/lm_families.jsonl.
Speed figures need a quiet machine: run nothing else beside it.

--long-context adds a second table for the gpt2-family variants: validation loss when valid.txt is read in longer
segments and, for Transformer-XL, with a longer memory than training had (`finetune.stages.pretrain.
segment_validation`, streams read in order from an empty memory): LONG_CONTEXTS. GPT-2 reads each segment alone
with its learned positions (positions past the training block were never trained); Transformer-XL's relative
positions and memory let it use contexts longer than it trained on.

Prints the table(s).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import _harness as harness
from _common import ROOT, WIKITEXT, append_result, describe_machine, finetune_cli, last_record, require, steady_rate

TRAIN = WIKITEXT / "train.txt"
VALID = WIKITEXT / "valid.txt"
RECIPES = ROOT / "recipes" / "pretrain"
VOCABULARY = 16000

# name: (recipe, overrides). Add a variant here; rename it when its overrides change (runs are kept by name).
VARIANTS = {
    "ngram-3": ("ngram-wikitext2.yaml", ["model.order=3"]),
    "ngram-5": ("ngram-wikitext2.yaml", ["model.order=5"]),
    "awd_lstm": ("awd-lstm-wikitext2.yaml", []),
    "qrnn": ("qrnn-wikitext2.yaml", []),
    "rnn": ("awd-lstm-wikitext2.yaml", ["model.cell=rnn"]),  # the LSTM's LR: diverges (docs/benchmarks.md)
    "rnn-lr1e-3": ("rnn-wikitext2.yaml", []),
    "gpt2": ("gpt2-mini-wikitext2.yaml", []),
    "transformer-xl": ("transformer-xl-wikitext2.yaml", []),
    "gpt2-strided": ("sparse-gpt2-wikitext2.yaml", []),
    # The strided variant's dense twin: the same 512-token blocks, batch and steps, every earlier position seen.
    "gpt2-512": ("sparse-gpt2-wikitext2.yaml", ["model.attention=dense", "model.attention_stride=null"]),
}
# --smoke: three families, tiny, on the first lines of train.txt and valid.txt
SMOKE = {"variants": ["ngram-3", "gpt2", "awd_lstm"], "tokens": 20_000, "vocabulary": 500, "lines": 400}
TINY = {
    "gpt2": ["model.layers=1", "model.hidden=32", "model.heads=2", "training.batch_size=4"],
    "awd_lstm": ["model.embedding_size=16", "model.hidden=32", "model.layers=1", "training.batch_size=4"],
}

# variant: (segment length, memory length or None for the model's own) pairs read by --long-context.
LONG_CONTEXTS = {
    "gpt2": [(128, None), (256, None), (512, None)],
    "transformer-xl": [(128, None), (128, 256), (128, 512), (512, 512)],
    "gpt2-strided": [(512, None)],
    "gpt2-512": [(512, None)],
}


def parameter_count(checkpoint: Path, counted: bool) -> int:
    """Elements of every tensor in the checkpoint's model.safetensors (a tied matrix is stored, and counted, once);
    for the n-gram model (`counted`), the n-grams stored: one key each in its keys_{order} tables."""
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as weights:
        names = [name for name in weights.keys() if not counted or name.startswith("keys_")]  # noqa: SIM118 (safe_open is not iterable)
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in names)


def run_variant(name: str, args, tokenizer: Path) -> dict:
    """One variant's run and its record."""
    import yaml

    recipe_file, overrides = VARIANTS[name]
    recipe = yaml.safe_load((RECIPES / recipe_file).read_text(encoding="utf-8"))
    counted = recipe["model"]["family"] == "ngram"
    overrides = [*overrides, *(TINY.get(name, []) if args.smoke else [])]
    tokens_per_step = (4 if args.smoke and not counted else recipe["training"]["batch_size"]) * recipe["corpus"][
        "block_size"
    ]
    run_dir = args.work / (name if counted else f"{name}-{args.tokens}")
    steps = None if counted else max(1, args.tokens // tokens_per_step)
    files = [
        f"tokenizer.path={tokenizer}",
        f"corpus.train_files=[{args.train}]",
        f"corpus.validation_files=[{args.valid}]",
    ]
    more = [] if counted else [f"training.max_steps={steps}", "eval_every=null", "checkpoint_every=null"]
    more += ["training.log_every=2"] * (args.smoke and not counted)
    seconds = finetune_cli(
        "pretrain", RECIPES / recipe_file, *files, f"run_dir={run_dir}", "overwrite=true", *overrides, *more
    )
    final = last_record(run_dir, "eval")
    figures = {key: final.get(key) for key in ("validation_loss", "validation_perplexity", "next_token_accuracy")}
    rate = None if counted else round(steady_rate(run_dir, "tokens"), 1)
    record = {"arm": name, "tokens": args.tokens, "vocabulary": args.vocabulary, "recipe": recipe_file}
    record |= {"overrides": overrides, "family": recipe["model"]["family"], "steps": steps}
    record["training_tokens"] = None if counted else steps * tokens_per_step
    parameters = parameter_count(run_dir / "checkpoint", counted)
    return {**record, **figures, "tokens_per_s": rate, "parameters": parameters, "seconds": round(seconds, 1)}


def long_context(records: list[dict], args) -> None:
    """Validation at the LONG_CONTEXTS of every finished gpt2-family variant (kept beside its run), into its record's
    `long_context`; the table."""
    sys.path.insert(0, str(ROOT))
    from finetune.inference.language_model_validation import segment_validation

    rows = []
    for record in records:
        record["long_context"] = []
        for segment, memory in LONG_CONTEXTS.get(record["arm"], []):
            run_dir = args.work / f"{record['arm']}-{record['tokens']}"
            kept = run_dir / f"bench-context-{segment}-{memory}.json"
            if not kept.exists():
                loss = segment_validation(run_dir / "checkpoint", [args.valid], segment, memory)["validation_loss"]
                kept.write_text(json.dumps({"segment": segment, "memory": memory, "validation_loss": loss}))
            record["long_context"].append(json.loads(kept.read_text()))
            rows.append({"variant": record["arm"], **record["long_context"][-1]})
    for row in rows:
        row["memory"] = "trained" if row["memory"] is None else row["memory"]
    columns = {"variant": "variant", "segment length": "segment", "memory": "memory"}
    print(
        "\n"
        + harness.markdown_table(
            rows,
            {**columns, "validation loss (nats/token)": "validation_loss"},
            formats={"validation loss (nats/token)": "{:.3f}"},
        )
    )


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__,
        "lm-families",
        table_only=True,
        smoke="ngram-3, gpt2, awd_lstm: tiny, 20,000 tokens",
        results="also append every record (with its long contexts) to bench/results/lm_families.jsonl",
    )
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--tokens", type=int, default=1_000_000, help="training tokens of every neural variant")
    parser.add_argument(
        "--long-context",
        action="store_true",
        help="also validate the gpt2-family variants at LONG_CONTEXTS (segments, memory)",
    )
    args = parser.parse_args()
    args.vocabulary, args.train, args.valid = VOCABULARY, TRAIN, VALID
    if args.smoke:
        args.variants, args.tokens, args.vocabulary, lines = SMOKE.values()
    args.work = harness.work_folder(args, "lm-families")
    machine = describe_machine()  # the figures below belong to this machine
    if args.table_only:
        records = [record for record in harness.read_log(args.work) if record["arm"] in args.variants]
    else:
        require(TRAIN, "WikiText-2 train.txt")
        require(VALID, "WikiText-2 valid.txt")
        if args.smoke:
            args.train = harness.text_head(TRAIN, lines, args.work / "train-head.txt")
            args.valid = harness.text_head(VALID, lines // 4, args.work / "valid-head.txt")
        tokenizer = harness.byte_level_bpe(args.work / f"tokenizer-{args.vocabulary}", args.vocabulary, args.train)
        key = lambda record: (record["arm"], record["tokens"])
        records = harness.run_grid(
            args.work,
            args.variants,
            key,
            lambda name: run_variant(name, args, tokenizer),
            job_key=lambda name: (name, args.tokens),
        )
        records = [record for record in records if key(record) in {(name, args.tokens) for name in args.variants}]
    if not records:
        sys.exit(f"bench: no finished runs in {args.work}")
    print(
        f"\nWikiText-2, byte-level BPE {args.vocabulary:,}; neural variants trained on {args.tokens:,} tokens each "
        "(the n-gram counted on all of train.txt)\n"
    )
    columns = {
        "variant": "arm",
        "recipe": lambda r: " ".join([r["recipe"], *r["overrides"]]),
        "validation loss (nats/token)": "validation_loss",
    }
    columns |= {
        "perplexity": "validation_perplexity",
        "next-token accuracy": "next_token_accuracy",
        "tokens/s (n-gram: counted)": "tokens_per_s",
    }
    columns |= {"parameters (n-gram: stored n-grams)": "parameters", "wall time, s": "seconds"}
    formats = {
        "validation loss (nats/token)": "{:.3f}",
        "next-token accuracy": "{:.3f}",
        "tokens/s (n-gram: counted)": "{:,.0f}",
    }
    print(harness.markdown_table(records, columns, formats=formats))
    if args.long_context:
        long_context(records, args)
    if args.update_results:
        append_result("lm_families", records, machine=machine)


if __name__ == "__main__":
    main()
