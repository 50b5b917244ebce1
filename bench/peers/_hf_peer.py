"""What every Trainer peer (bench/peers/hf_*_peer.py) does the same way: its budget flags, the TrainingArguments (the
Trainer's defaults with that budget, nothing saved, logged or reported, the GPU when there is one), the timed
`trainer.train()` and the one JSON line it prints. Only transformers, as the peers themselves."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainingArguments


def peer_parser(
    batch: int, lr: float, epochs: float = 1.0, seq_len: int = 128, files: bool = True
) -> argparse.ArgumentParser:
    """--model, --train and --dev (`files`), --epochs, --batch, --lr, --seq-len (tokens a text or window is cut at)
    and --seed, with these defaults; the peer adds its own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    if files:
        parser.add_argument("--train", required=True)
        parser.add_argument("--dev", required=True)
    parser.add_argument("--epochs", type=float, default=epochs)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seq-len", type=int, default=seq_len)
    parser.add_argument("--seed", type=int, default=0)
    return parser


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


def timed_train(trainer) -> float:
    """`trainer.train()`'s wall seconds: the training time every peer reports."""
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def report(peer: str, train_examples: int, epochs: float, train_s: float, **figures) -> None:
    """The peer's one JSON line: its name, training examples, epochs, seconds and examples/s, then `figures`."""
    rate = round(train_examples * epochs / train_s, 2)
    line = {"peer": peer, "train_examples": train_examples, "epochs": epochs, "train_s": round(train_s, 1)}
    print(json.dumps(line | {"examples_per_s": rate} | figures))


def wrapper_parser(doc: str, save_to: str) -> argparse.ArgumentParser:
    """The flags of a wrapper that runs a shipped peer unchanged (peer_budget.py, peer_predictions.py): --save-to
    (`save_to`: its help), then `--` and the peer script with its own arguments."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--save-to", type=Path, required=True, help=save_to)
    parser.add_argument("peer", nargs=argparse.REMAINDER, help="-- then the peer script and its own arguments")
    return parser


def run_unchanged(peer: list[str]) -> None:
    """Run the peer script (`peer`: [--] SCRIPT ARGUMENTS) as `python SCRIPT ARGUMENTS` would, in this process (so
    that the wrapper's patches of transformers hold): its folder first on sys.path."""
    command = peer[1:] if peer[:1] == ["--"] else peer
    sys.argv = command
    sys.path.insert(0, str(Path(command[0]).resolve().parent))
    runpy.run_path(command[0], run_name="__main__")
