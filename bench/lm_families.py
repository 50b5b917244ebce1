"""The language-model families side by side on WikiText-2: validation loss at equal training tokens, speed, size.

    .venv/bin/python bench/lm_families.py                              # every variant, 1M training tokens each
    .venv/bin/python bench/lm_families.py --variants ngram-3 qrnn gpt2 --tokens 2000000
    .venv/bin/python bench/lm_families.py --table-only                 # the table of the runs so far
    .venv/bin/python bench/lm_families.py --variants gpt2 transformer-xl --long-context   # + longer contexts

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
checkpoint's tensors; for the n-gram the stored n-grams) and the run's wall time. Runs are kept under
--work-dir (one folder per variant and token count); a variant with a finished run is not run again.
Speed figures need a quiet machine: run nothing else beside it.

--long-context adds a second table for the gpt2-family variants: validation loss when valid.txt is read in longer
segments and, for Transformer-XL, with a longer memory than training had (`finetune.stages.pretrain.
segment_validation`, streams read in order from an empty memory): LONG_CONTEXTS. GPT-2 reads each segment alone
with its learned positions (positions past the training block were never trained); Transformer-XL's relative
positions and memory let it use contexts longer than it trained on.

Prints the table(s), then one JSON line with every figure.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import _harness as harness
from _common import ROOT, WIKITEXT, append_result, describe_machine, finetune_cli, require

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


# variant: (segment length, memory length or None for the model's own) pairs read by --long-context.
LONG_CONTEXTS = {
    "gpt2": [(128, None), (256, None), (512, None)],
    "transformer-xl": [(128, None), (128, 256), (128, 512), (512, 512)],
    "gpt2-strided": [(512, None)],
    "gpt2-512": [(512, None)],
}


def read_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def tokens_per_step(recipe: dict) -> int:
    """Training tokens of one optimizer step of a recipe: batch x block (one process)."""
    return recipe["training"]["batch_size"] * recipe["corpus"]["block_size"]


def shared_tokenizer(workdir: Path) -> Path:
    """The byte-level BPE every variant reads, trained once on train.txt (kept in workdir)."""
    folder = workdir / f"tokenizer-{VOCABULARY}"
    if not (folder / "tokenizer.json").exists():
        sys.path.insert(0, str(ROOT))
        from finetune.data.corpus import read_documents
        from finetune.data.tokenizers import train_byte_level_bpe

        train_byte_level_bpe(read_documents([TRAIN]), VOCABULARY).save_pretrained(folder)
    return folder


def parameter_count(checkpoint: Path, counted: bool) -> int:
    """Elements of every tensor in the checkpoint's model.safetensors (a tied matrix is stored, and counted, once);
    for the n-gram model (`counted`), the n-grams stored: one key each in its keys_{order} tables."""
    import math

    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as weights:
        names = [name for name in weights.keys() if not counted or name.startswith("keys_")]  # noqa: SIM118 (safe_open is not iterable)
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in names)


def training_rate(records: list[dict]) -> float | None:
    """Tokens/s over the training windows after the first (warm-up): all tokens over all time (every step holds
    the same tokens, so the step-weighted harmonic mean of the windows' rates)."""
    windows = [record for record in records if record["phase"] == "train"]
    steps = [record["step"] - previous["step"] for previous, record in itertools.pairwise(windows)]
    if not steps:
        return None
    return sum(steps) / sum(count / record["tokens_per_s"] for count, record in zip(steps, windows[1:]))


def run_variant(name: str, tokens: int, workdir: Path, tokenizer: Path) -> dict:
    """One variant's run (or the kept one) and its figures."""
    recipe_file, overrides = VARIANTS[name]
    recipe = read_yaml(RECIPES / recipe_file)
    counted = recipe["model"]["family"] == "ngram"
    run_dir = workdir / (name if counted else f"{name}-{tokens}")
    result_file = run_dir / "bench-result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    steps = None if counted else max(1, tokens // tokens_per_step(recipe))
    arguments = [
        f"tokenizer.path={tokenizer}",
        f"corpus.train_files=[{TRAIN}]",
        f"corpus.validation_files=[{VALID}]",
        f"run_dir={run_dir}",
        "overwrite=true",
        *overrides,
    ]
    if not counted:
        arguments += [f"training.max_steps={steps}", "eval_every=null", "checkpoint_every=null"]
    start = time.perf_counter()
    finetune_cli("pretrain", RECIPES / recipe_file, *arguments)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = [record for record in records if record["phase"] == "eval"][-1]
    result = {
        "variant": name,
        "recipe": recipe_file,
        "overrides": overrides,
        "family": recipe["model"]["family"],
        "training_tokens": None if counted else steps * tokens_per_step(recipe),
        "steps": steps,
        "validation_loss": final["validation_loss"],
        "validation_perplexity": final["validation_perplexity"],
        "next_token_accuracy": final.get("next_token_accuracy"),
        "tokens_per_s": None if counted else round(training_rate(records) or 0.0, 1),
        "parameters": parameter_count(run_dir / "checkpoint", counted),
        "seconds": round(seconds, 1),
    }
    result_file.write_text(json.dumps(result))
    return result


def long_context(results: list[dict], workdir: Path, tokens: int) -> list[dict]:
    """Validation at the LONG_CONTEXTS of every finished gpt2-family variant, kept beside its run."""
    sys.path.insert(0, str(ROOT))
    from finetune.inference.language_model_validation import segment_validation

    rows = []
    for result in results:
        for segment, memory in LONG_CONTEXTS.get(result["variant"], []):
            run_dir = workdir / f"{result['variant']}-{tokens}"
            kept = run_dir / f"bench-context-{segment}-{memory}.json"
            if not kept.exists():
                metrics = segment_validation(run_dir / "checkpoint", [VALID], segment, memory)
                kept.write_text(
                    json.dumps(
                        {
                            "variant": result["variant"],
                            "segment": segment,
                            "memory": memory,
                            "validation_loss": metrics["validation_loss"],
                        }
                    )
                )
            rows.append(json.loads(kept.read_text()))
    if rows:
        print("\n| variant | segment length | memory | validation loss (nats/token) |\n|---|---:|---:|---:|")
        for row in rows:
            memory = "trained" if row["memory"] is None else row["memory"]
            print(f"| {row['variant']} | {row['segment']} | {memory} | {row['validation_loss']:.3f} |")
    return rows


def print_table(results: list[dict], tokens: int) -> None:
    print(
        f"\nWikiText-2, byte-level BPE {VOCABULARY:,}; neural variants trained on {tokens:,} tokens each "
        "(the n-gram counted on all of train.txt)\n"
    )
    print(
        "| variant | recipe | validation loss (nats/token) | perplexity | next-token accuracy | tokens/s | "
        "parameters (n-gram: stored n-grams) | wall time |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for result in results:
        rate = f"{result['tokens_per_s']:,.0f}" if result["tokens_per_s"] else "counted"
        accuracy = f"{result['next_token_accuracy']:.3f}" if result["next_token_accuracy"] is not None else "-"
        print(
            f"| {result['variant']} | {result['recipe']} {' '.join(result['overrides'])} | "
            f"{result['validation_loss']:.3f} | {result['validation_perplexity']:.1f} | {accuracy} | {rate} | "
            f"{result['parameters']:,} | {result['seconds']:.0f} s |"
        )


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "lm-families", table_only=True)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--tokens", type=int, default=1_000_000, help="training tokens of every neural variant")
    parser.add_argument(
        "--long-context",
        action="store_true",
        help="also validate the gpt2-family variants at LONG_CONTEXTS (segments, memory)",
    )
    arguments = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    arguments.work_dir = harness.work_folder(arguments, "lm-families")
    if arguments.table_only:
        results = [json.loads(path.read_text()) for path in sorted(arguments.work_dir.glob("*/bench-result.json"))]
        results = [result for result in results if result["variant"] in arguments.variants]
    else:
        require(TRAIN, "WikiText-2 train.txt")
        require(VALID, "WikiText-2 valid.txt")
        tokenizer = shared_tokenizer(arguments.work_dir)
        results = [run_variant(name, arguments.tokens, arguments.work_dir, tokenizer) for name in arguments.variants]
    if not results:
        sys.exit(f"bench: no finished runs in {arguments.work_dir}")
    print_table(results, arguments.tokens)
    contexts = long_context(results, arguments.work_dir, arguments.tokens) if arguments.long_context else []
    result = {"tokens": arguments.tokens, "vocabulary": VOCABULARY, "results": results, "long_context": contexts}
    print(json.dumps(result))
    if arguments.update_results:
        append_result("lm_families", result, machine=machine)


if __name__ == "__main__":
    main()
