"""The TrainingArguments every Trainer peer (bench/peers/hf_*_peer.py) builds the same way: the Trainer's defaults
with the benchmark's budget (--batch, --epochs, --lr, --seed), nothing saved, logged or reported, the GPU when there is
one. Only transformers, as the peers themselves."""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import TrainingArguments


def peer_training_arguments(args: argparse.Namespace, eval_batch_size: int, **more) -> TrainingArguments:
    """`more`: what one peer sets beyond the shared budget (the QA peer's max_steps)."""
    return TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=eval_batch_size,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        seed=args.seed,
        **more,
    )
