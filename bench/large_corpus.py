"""Pretraining on a large corpus: tokenising once (against `tokenizers` alone), peak memory, a restart from the cache.

    .venv/bin/python bench/large_corpus.py                                # 100M tokens on every core
    .venv/bin/python bench/large_corpus.py --tokens 2000000 --threads 1   # a small run, about a minute
    .venv/bin/python bench/large_corpus.py --smoke                        # 2M tokens, BPE 500, 2 steps
    .venv/bin/python bench/large_corpus.py --work-dir /tmp/large-corpus   # keep corpus, tokenizer and cache there
    .venv/bin/python bench/large_corpus.py --checkout ../other-clone      # measure another version's pretrain

The corpus is WikiText-2 train.txt (../shared/data, or --source) repeated until it holds --tokens tokens of the
benchmark's tokenizer: whole copies, then the first lines of one more. It is written to the work folder (default
runs/bench-large-corpus): 100M tokens are about 40 copies, ~430 MB. Repeated text is easy for a tokenizer that
caches words (the BPE model does): both sides profit alike, but the absolute rates are those of text whose words were
all seen before. The tokenizer is a byte-level BPE of --vocab
pieces trained once on train.txt with the toolkit's own code (as bench/clm_pretrain.py does).

Three child processes, each timed, its peak resident memory taken from the kernel when it ends (wait4, in a
small parent of its own, so that the benchmark's memory does not count):
1. `tokenizers` alone: `Tokenizer.encode_batch` and `encode_batch_fast` over the corpus's documents (its
   non-empty lines, stripped) in batches of 2,000, the text read into memory before the clock starts,
   TOKENIZERS_PARALLELISM=true;
2. `finetune pretrain` into an empty cache: GPT-2 (2 layers, hidden 64, 2 heads), block 128, batch 8, --steps
   steps, 0.05% of the documents held out for validation (a selection of the mapped ids). Its tokenising
   throughput is the one it prints (reading, tokenising and writing the ids, all in); the time from the process's
   start to its first training step (metrics.jsonl's first line, polled); its peak RSS;
3. the same command again: the restart, which maps the cache. Time to its first training step, peak RSS.
Every child gets RAYON_NUM_THREADS and OMP_NUM_THREADS = --threads (default: every core).

Prints the table; a record per arm (the two tokenizers calls, the first run, the restart) goes to WORK/runs.jsonl
(with --update-results bench/results/large_corpus.jsonl too).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _harness as harness
from _common import ROOT, STDERR_TAIL, WIKITEXT, describe_machine, require

SOURCE = WIKITEXT / "train.txt"
BATCH = 2000  # documents per batch encoding, on both sides (the toolkit's default)
PEER = r"""
import json, sys, time
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(sys.argv[1])
lines = [line.strip() for line in open(sys.argv[2], encoding="utf-8")]
documents = [line for line in lines if line]
del lines
result = {}
for method in ("encode_batch", "encode_batch_fast"):
    encode, tokens = getattr(tokenizer, method), 0
    started = time.perf_counter()
    for start in range(0, len(documents), BATCH):
        encodings = encode(documents[start:start + BATCH], add_special_tokens=False)
        tokens += sum(len(encoding.ids) for encoding in encodings)
    result[method] = {"tokens": tokens, "seconds": time.perf_counter() - started}
print(json.dumps(result))
""".replace("BATCH", str(BATCH))


def build_corpus(work_dir: Path, source: Path, tokenizer_folder: Path, tokens: int) -> tuple[Path, float]:
    """The source repeated to about `tokens` tokens (whole copies, then a prefix of lines); returns it and the
    number of copies it holds."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    per_line = [
        len(encoding.ids)
        for encoding in tokenizer.encode_batch_fast([line.strip() for line in lines], add_special_tokens=False)
    ]
    per_copy = sum(per_line)
    copies, rest = divmod(tokens, per_copy)
    path = work_dir / f"wikitext2-train-x{tokens}.txt"
    if not path.is_file():
        partial = path.with_suffix(".partial")
        with open(partial, "w", encoding="utf-8") as handle:
            for _ in range(copies):
                handle.writelines(lines)
            for line, count in zip(lines, per_line):
                if rest <= 0:
                    break
                handle.write(line)
                rest -= count
        partial.replace(path)
    return path, tokens / per_copy


# The child is started by this small script, not by the benchmark itself: on Linux a process's peak RSS starts at
# that of the process it was forked from (the benchmark, which holds a tokenizer and the corpus's line counts).
REAPER = r"""
import json, os, subprocess, sys
process = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(process.pid, 0)
with open(sys.argv[1], "w") as handle:
    json.dump({"peak_rss_kib": usage.ru_maxrss}, handle)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def child(command: list, env: dict, cwd: Path, watch: Path | None = None) -> dict:
    """Run a command to its end: wall time, peak RSS in MB (the kernel's count for that process alone, from
    wait4), its output, and with `watch` the time until that metrics.jsonl holds its first training record."""
    with tempfile.TemporaryDirectory() as folder:
        usage_file, stdout_file, stderr_file = (Path(folder) / name for name in ("usage.json", "stdout", "stderr"))
        with open(stdout_file, "w") as stdout, open(stderr_file, "w") as stderr:
            started = time.perf_counter()
            reaped = [sys.executable, "-c", REAPER, usage_file, *map(str, command)]
            process = subprocess.Popen(reaped, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
            first_step = None
            while process.poll() is None:
                trained = watch is not None and watch.is_file() and '"phase": "train"' in watch.read_text("utf-8")
                if first_step is None and trained:
                    first_step = time.perf_counter() - started
                time.sleep(0.02)
            wall = time.perf_counter() - started
        output, errors = stdout_file.read_text(), stderr_file.read_text()
        if process.returncode != 0:
            sys.exit(
                f"bench: {' '.join(map(str, command[1:4]))} failed ({process.returncode}):\n{errors[-STDERR_TAIL:]}"
            )
        peak = json.loads(usage_file.read_text())["peak_rss_kib"] / 1024
    first_step = first_step and round(first_step, 2)
    return {
        "wall_s": round(wall, 2),
        "first_step_s": first_step,
        "peak_rss_mb": round(peak),
        "stdout": output,
        "stderr": errors,
    }


def pretrain_recipe(work_dir: Path, corpus: Path, tokenizer_folder: Path, steps: int) -> Path:
    """The pretraining run: tiny GPT-2, blocks of 128 from the corpus, a few steps; a cache folder of its own."""
    files = {"train_files": [str(corpus)], "validation_fraction": 0.0005, "cache_dir": str(work_dir / "cache")}
    recipe = {"stage": "pretrain", "run_dir": str(work_dir / "run"), "overwrite": True, "seed": 0}
    recipe |= {
        "model": {"family": "gpt2", "layers": 2, "hidden": 64, "heads": 2},
        "tokenizer": {"path": str(tokenizer_folder)},
    }
    recipe |= {"corpus": {**files, "block_size": 128}}
    recipe["training"] = {"epochs": 1, "max_steps": steps, "batch_size": 8, "log_every": 1, "device": "cpu"}
    path = work_dir / "pretrain.yaml"
    path.write_text(json.dumps(recipe, indent=1) + "\n", encoding="utf-8")  # JSON is YAML
    return path


def tokenising_rate(stderr: str) -> dict:
    """What the stage printed about tokenising the training text (absent in versions that print nothing)."""
    joined = " ".join(stderr.split())  # rich wraps long lines at the console's width
    found = re.search(
        r"tokenizing the training text: ([\d,]+) documents, ([\d,]+) tokens in ([\d.]+) s "
        r"\(([\d,]+) tokens/s\)",
        joined,
    )
    if not found:
        return {}
    documents, tokens, seconds, rate = (float(group.replace(",", "")) for group in found.groups())
    return {"documents": int(documents), "tokens": int(tokens), "seconds": seconds, "tokens_per_s": rate}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "large-corpus", smoke="2M tokens, BPE 500, 2 steps, 1 thread")
    parser.add_argument("--tokens", type=int, default=100_000_000, help="corpus size in tokens of the tokenizer")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="cores for every child (Rayon, OpenMP)")
    parser.add_argument("--vocab", type=int, default=16_000, help="pieces of the byte-level BPE")
    parser.add_argument("--steps", type=int, default=5, help="training steps of each pretrain run")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the text repeated (WikiText-2 train.txt)")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the repository whose `finetune` pretrains")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.vocab, args.steps, args.threads = 2_000_000, 500, 2, 1
    work = harness.work_folder(args, "large-corpus").resolve()
    machine = describe_machine()  # the figures below belong to this machine
    require(args.source, "WikiText-2 train.txt")
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    records = measure(args, work)
    for record in records:
        harness.record_run(work, record, "large_corpus" if args.update_results else None, machine)
    print(f"\ncorpus: {records[0]['tokens']:,} tokens, {records[0]['corpus_mb']:,.0f} MB: WikiText-2 train.txt x "
          f"{records[0]['copies']:.2f} (byte-level BPE {args.vocab:,}), --threads {args.threads}\n")  # fmt: skip
    columns = {"arm": "arm", "tokenising, tokens/s": "tokens_per_s", "start to first training step, s": "first_step_s"}
    columns["peak RSS, MB"] = "peak_rss_mb"
    print(harness.markdown_table(records, columns, formats={"tokenising, tokens/s": "{:,.0f}"}))
    print("(tokenizers alone hold the text in memory; finetune's tokenising reads, encodes and writes the ids)")


def measure(args, work_dir: Path) -> list[dict]:
    """Corpus and tokenizer, then the three children: a record per arm."""
    tokenizer_folder = harness.byte_level_bpe(work_dir / f"bpe-{args.vocab}", args.vocab, args.source)
    corpus, copies = build_corpus(work_dir, args.source, tokenizer_folder, args.tokens)
    threads = str(args.threads)
    env = {key: value for key, value in os.environ.items() if key != "TOKENIZERS_PARALLELISM"}
    env.update(RAYON_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    peer = child(
        [sys.executable, "-c", PEER, tokenizer_folder / "tokenizer.json", corpus],
        {**env, "TOKENIZERS_PARALLELISM": "true"},
        work_dir,
    )
    rates = json.loads(peer["stdout"].strip().splitlines()[-1])
    recipe = pretrain_recipe(work_dir, corpus, tokenizer_folder, args.steps)
    shutil.rmtree(work_dir / "cache", ignore_errors=True)  # the first run tokenises, whatever a kept folder held
    runs = {}
    for name in ("first run", "restart"):
        metrics = work_dir / "run" / "metrics.jsonl"
        metrics.unlink(missing_ok=True)
        command = [sys.executable, "-m", "finetune", "pretrain", recipe]
        runs[name] = child(command, env, args.checkout.resolve(), watch=metrics)
    if "tokensfrom" + "".join(str(work_dir / "cache").split()) not in "".join(runs["restart"]["stderr"].split()):
        print("bench: warning: the restart did not report mapping the cache", file=sys.stderr)
    tokens = rates["encode_batch"]["tokens"]
    base = {"tokens": tokens, "corpus_mb": round(corpus.stat().st_size / 1e6, 1), "copies": round(copies, 3)}
    base |= {"threads": args.threads, "vocab": args.vocab, "steps": args.steps}
    records = [
        {
            "arm": f"tokenizers {method}",
            **base,
            "tokens_per_s": round(f["tokens"] / f["seconds"], 1),
            "peak_rss_mb": peer["peak_rss_mb"],
        }
        for method, f in rates.items()
    ]
    tokenizing = tokenising_rate(runs["first run"]["stderr"])
    for name, run in runs.items():
        figures = {key: run[key] for key in ("first_step_s", "wall_s", "peak_rss_mb")}
        rate = tokenizing.get("tokens_per_s") if name == "first run" else None
        records.append({"arm": f"finetune pretrain, {name}", **base, "tokens_per_s": rate, **figures})
        if name == "first run":
            records[-1]["tokenizing"] = tokenizing
    return records


if __name__ == "__main__":
    main()
