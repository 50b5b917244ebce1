"""Peak memory of reading a large CSV task and turning it into token ids, against the file's size.

    .venv/bin/python bench/large_csv_memory.py                      # a 2 GB train.csv (the issue's size)
    .venv/bin/python bench/large_csv_memory.py --size-mb 200        # about a minute on one core
    .venv/bin/python bench/large_csv_memory.py --smoke              # an 8 MiB file
    .venv/bin/python bench/large_csv_memory.py --size-mb 1024 --keep
    .venv/bin/python bench/large_csv_memory.py --checkout ../other-clone   # measure another version's code

The CSV (columns sentence,label; review-like sentences of 8 to 60 words drawn from a Zipf-distributed vocabulary of
20,000 made-up words, quoted where they hold a comma) is written to the work folder (--work, default
runs/bench-large-csv-memory; runs/ is ignored by git); it is deleted at the end unless --keep (a kept file of the
same size is reused). A WordPiece tokenizer of 8,000 pieces is trained with the toolkit's own code on the file's first
20,000 sentences.

One child process (its peak resident memory taken from the kernel when it ends, by wait4, so that the benchmark's own
memory does not count) imports finetune, loads the tokenizer, then does what a classification run does with its
training file: `read_labelled_split` (the rows checked, their texts and labels kept) and `EncodedTask` (token ids,
task.max_length --max-length), keeping both to the end as the run does. It reports its resident memory after the
imports (the baseline), its peak after reading and after encoding (VmHWM), and the counts. The figure is
(peak - baseline) / file size: how many times the file's size the task's data takes at its peak.

Prints a table of the phases; the run's record (every figure) goes to WORK/runs.jsonl.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import _harness as harness
from _common import ROOT

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])

def resident(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

from pathlib import Path
from transformers import PreTrainedTokenizerFast
from finetune.data.task_encoding import EncodedTask
from finetune.data.task_files import read_labelled_split
from finetune.tasks.specs import TaskSpec

tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[3])
spec = TaskSpec(name="large", text_columns=("sentence",), label_column="label", labels=("0", "1"),
                metrics=("accuracy",), files={"train": "train.csv"})
result = {"baseline": resident("VmRSS")}
started = time.perf_counter()
examples = read_labelled_split(spec, Path(sys.argv[2]), "train")
result.update(read_seconds=time.perf_counter() - started, read_peak=resident("VmHWM"), read_rss=resident("VmRSS"),
              examples=len(examples.labels))
started = time.perf_counter()
encoded = EncodedTask(examples, tokenizer, int(sys.argv[4]))
result.update(encode_seconds=time.perf_counter() - started, encode_peak=resident("VmHWM"),
              encode_rss=resident("VmRSS"), tokens=sum(encoded.lengths))
del examples  # what a classification run keeps of the texts once they are encoded (this version's stage)
import gc; gc.collect()
result.update(held_rss=resident("VmRSS"))
print(json.dumps(result))
"""


def write_csv(path: Path, size_bytes: int, seed: int = 0) -> None:
    """Review-like rows until the file holds `size_bytes` bytes (written in blocks: the writer holds little)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(20_000)]
    cumulative = list(itertools.accumulate(1 / rank for rank in range(1, len(words) + 1)))  # Zipf weights
    written = 0
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write("sentence,label\n")
        while written < size_bytes:
            block = []
            for _ in range(2_000):
                sentence = " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(8, 60)))
                if rng.random() < 0.2:
                    sentence = f'"{sentence}, {rng.choice(words)}"'  # a comma inside: CSV quoting
                block.append(f"{sentence},{rng.randint(0, 1)}\n")
            text = "".join(block)
            handle.write(text)
            written += len(text.encode("utf-8"))


def train_tokenizer(csv_path: Path, folder: Path) -> None:
    """A WordPiece tokenizer of 8,000 pieces from the file's first 20,000 sentences, saved in `folder`."""
    sys.path.insert(0, str(ROOT))
    from finetune.data.tokenizers import train_wordpiece

    with open(csv_path, encoding="utf-8") as handle:
        next(handle)
        lines = [next(handle).rsplit(",", 1)[0].strip('"') for _ in range(20_000)]
    train_wordpiece(lines, vocab_size=8_000, min_frequency=2).save_pretrained(str(folder))


def measure(checkout: Path, data_dir: Path, tokenizer: Path, max_length: int) -> dict:
    """Run the child; its report with its peak RSS in bytes (wait4's, for that child alone) added."""
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", CHILD, checkout, data_dir, tokenizer, max_length]
    output, peak_mb = harness.measured_run(command, env=environment)
    return json.loads(output.strip().splitlines()[-1]) | {"peak": int(peak_mb * 2**20)}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "large-csv-memory", smoke="an 8 MiB train.csv")
    parser.add_argument("--size-mb", type=float, default=2048, help="size of the generated train.csv (MiB)")
    parser.add_argument("--max-length", type=int, default=128, help="task.max_length of the encoding")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the finetune checkout whose code is measured")
    parser.add_argument("--keep", action="store_true", help="keep the CSV and tokenizer for the next run")
    options = parser.parse_args()
    options.size_mb = 8 if options.smoke else options.size_mb
    work = harness.work_folder(options, "large-csv-memory")
    data_dir, tokenizer = work / "task", work / "tokenizer"
    csv_path, size = data_dir / "train.csv", int(options.size_mb * 2**20)
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        if not csv_path.is_file() or abs(csv_path.stat().st_size - size) > 2**20:
            started = time.perf_counter()
            write_csv(csv_path, size)
            seconds = time.perf_counter() - started
            print(f"wrote {csv_path} ({csv_path.stat().st_size / 2**20:,.0f} MiB) in {seconds:.0f} s")
        file_size = csv_path.stat().st_size
        if not (tokenizer / "tokenizer.json").is_file():
            train_tokenizer(csv_path, tokenizer)
        report = measure(options.checkout.resolve(), data_dir, tokenizer, options.max_length)
    finally:
        if not options.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(tokenizer, ignore_errors=True)
    baseline = report["baseline"]
    print(f"file {file_size / 2**20:,.0f} MiB, {report['examples']:,} examples, {report['tokens']:,} tokens")
    rows = [{"phase": phase, "seconds": report[f"{phase}_seconds"], "peak": report[f"{phase}_peak"] - baseline,
             "held": report[f"{phase}_rss"] - baseline} for phase in ("read", "encode")]  # fmt: skip
    rows += [{"phase": "process (wait4)", "peak": report["peak"] - baseline},
             {"phase": "held, texts dropped", "held": report["held_rss"] - baseline}]  # fmt: skip
    columns = {
        "phase": "phase",
        "seconds": "seconds",
        "peak over the baseline (MiB)": lambda r: r.get("peak", 0) / 2**20,
    }
    columns |= {f"{key} / file": (lambda r, key=key: r.get(key, 0) / file_size) for key in ("peak", "held")}
    print(harness.markdown_table(rows, columns, formats={"peak / file": "{:.2f}x", "held / file": "{:.2f}x",
                                                         "peak over the baseline (MiB)": "{:,.0f}"}))  # fmt: skip
    record = {"arm": "ours", "file_bytes": file_size, "max_length": options.max_length, **report}
    harness.record_run(work, record)


if __name__ == "__main__":
    main()
