"""Masked-LM quality at equal wall-clock time: this toolkit and the Hugging Face Trainer, same budget.

    .venv/bin/python bench/mlm_equal_time.py --budget-seconds 300      # ~15 minutes (calibrates first)
    .venv/bin/python bench/mlm_equal_time.py --budget-seconds 300 \\
        --peer-tokens-per-s 1300 --our-tokens-per-s 3900                # ~12 minutes: figures of mlm_pretrain.py

Both sides train BERT-mini from scratch on the same data and configuration as bench/mlm_pretrain.py
for the same training time, each with its own recipe (the peer: lr 5e-4, linear decay, no warmup,
no weight decay; ours: the bert-mini-wikitext2 recipe). Each side's step count is its budget times
its own measured throughput, so each linear LR schedule runs to its end inside the budget (a run cut
off at the budget with a half-decayed LR would be judged unfairly). Should a side run slower than
measured (the machine is shared), its wrapper (peer_budget.py, ours_budget.py) stops it after the
step that crosses the budget; the table shows the steps and seconds each side really trained.
Then both saved models are scored the same way: the dense
`BertForMaskedLM` loss on WikiText-2 valid.txt, in two block layouts (ours and the peer's), with the
same fixed 15% / 80-10-10 masks for both models.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, BertForMaskedLM

from _common import ROOT, STDERR_TAIL, describe_machine, minilm_checkpoint, read_jsonl, require, text_lines
from _common import run as run_command  # `run` names the runs below
from finetune.data.masking import MaskingRule
from finetune.recipes import MaskingConfig
from finetune.tasks.specs import IGNORE_INDEX
from mlm_pretrain import PEER, RECIPE, TRAIN, VALID, run_ours, run_peer, training_corpus

SEQ_LEN, BATCH = 128, 32
MARGIN = 0.95  # plan 5% fewer steps than the budget allows: throughput on a shared machine drifts
MASK_SEED = 1234  # the validation masks: the same for both models and every run


def planned_steps(budget_seconds: float, tokens_per_s: float) -> int:
    """Optimizer steps that fit in the budget at the measured throughput."""
    return max(1, math.floor(MARGIN * budget_seconds * tokens_per_s / (SEQ_LEN * BATCH)))


def train_peer(corpus: Path, tokenizer_dir: str, steps: int, budget_seconds: float, folder: Path) -> dict:
    """The unchanged peer script through bench/peers/peer_budget.py, which stops it at the budget and saves its
    model."""
    command = [
        sys.executable,
        str(ROOT / "bench" / "peers" / "peer_budget.py"),
        "--budget-seconds",
        str(budget_seconds),
        "--save-to",
        str(folder),
        "--",
        str(PEER),
        "--corpus",
        str(corpus),
        "--tokenizer",
        tokenizer_dir,
        "--steps",
        str(steps),
        "--max-lines",
        "20000",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if not (folder / "budget.json").is_file():  # the model is saved before the peer prints its own figure
        sys.exit(f"bench: the peer failed:\n{finished.stderr[-STDERR_TAIL:]}")
    return {**json.loads((folder / "budget.json").read_text()), "model": folder}


def train_ours(corpus: Path, tokenizer_dir: str, steps: int, budget_seconds: float, workdir: Path) -> dict:
    """`finetune pretrain` with training.max_steps from the plan, through bench/ours_budget.py (the same stop)."""
    run_dir = workdir / "ours-equal-time"
    command = [
        sys.executable,
        str(ROOT / "bench" / "ours_budget.py"),
        "--budget-seconds",
        str(budget_seconds),
        "--",
        "pretrain",
        str(RECIPE),
        f"corpus.train_files=[{corpus}]",
        f"corpus.validation_files=[{VALID}]",
        f"tokenizer.path={tokenizer_dir}",
        f"run_dir={run_dir}",
        f"training.max_steps={steps}",
        "training.log_every=10",
        "eval_every=null",
        "training.device=cpu",
    ]
    run_command(command, cwd=ROOT)
    records = read_jsonl(run_dir / "metrics.jsonl")
    windows = [record for record in records if record["phase"] == "train"]
    seconds, done = 0.0, 0
    for record in windows:  # each window's seconds = its tokens / its tokens per second
        seconds += (record["step"] - done) * SEQ_LEN * BATCH / record["tokens_per_s"]
        done = record["step"]
    return {
        "steps": done,
        "max_steps": steps,
        "train_seconds": round(seconds, 1),
        "stopped_at_budget": done < steps,
        "model": run_dir / "checkpoint",
    }


def validation_blocks(tokenizer, limit: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """valid.txt in both training layouts, masked once with a fixed seed: {layout: (input_ids, labels)}."""
    lines = text_lines(VALID)
    plain = tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"]  # long lines are fine: cut below
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
        pairs = [
            rule.apply(block, np.random.default_rng((MASK_SEED, index))) for index, block in enumerate(blocks[:limit])
        ]
        layouts[name] = (
            torch.from_numpy(np.stack([inputs for inputs, _ in pairs])),
            torch.from_numpy(np.stack([labels for _, labels in pairs])),
        )
    return layouts


@torch.no_grad()
def dense_validation_loss(model_dir: Path, input_ids: torch.Tensor, labels: torch.Tensor, batch: int = 16) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-seconds", type=float, default=300, help="training wall-clock time of each side")
    parser.add_argument("--peer-tokens-per-s", type=float, help="the peer's throughput (default: measured here)")
    parser.add_argument("--our-tokens-per-s", type=float, help="our throughput (default: measured here)")
    parser.add_argument("--validation-blocks", type=int, help="score only the first N blocks of each layout")
    arguments = parser.parse_args()
    describe_machine()  # the figures below belong to this machine
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)
    tokenizer_dir = minilm_checkpoint("the reference vocabulary")
    budget = arguments.budget_seconds

    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        corpus = training_corpus(workdir)
        peer_rate = arguments.peer_tokens_per_s or run_peer(corpus, tokenizer_dir, 12)["tokens_per_s"]
        our_rate = arguments.our_tokens_per_s or run_ours(corpus, tokenizer_dir, 25, workdir)["tokens_per_s"]
        runs = {
            "Hugging Face Trainer (peer)": train_peer(
                corpus, tokenizer_dir, planned_steps(budget, peer_rate), budget, workdir / "peer-model"
            ),
            "finetune": train_ours(corpus, tokenizer_dir, planned_steps(budget, our_rate), budget, workdir),
        }
        layouts = validation_blocks(AutoTokenizer.from_pretrained(tokenizer_dir), arguments.validation_blocks)
        for run in runs.values():
            run["losses"] = {name: dense_validation_loss(run["model"], *tensors) for name, tensors in layouts.items()}
            del run["model"]

    names = list(layouts)
    print(
        f"budget {budget:.0f} s of training per side; planned from {peer_rate:,.0f} (peer) and "
        f"{our_rate:,.0f} (ours) tokens/s; validation: WikiText-2 valid.txt, "
        + ", ".join(f"{len(tensors[0]):,} blocks in the {name}" for name, tensors in layouts.items())
    )
    print(
        f"\n| equal time ({budget:.0f} s, BERT-mini) | steps | tokens | trained s | "
        + " | ".join(f"valid loss, {name}" for name in names)
        + " |\n|---|---:|---:|---:|"
        + "---:|" * len(names)
    )
    for label, run in runs.items():
        print(
            f"| {label} | {run['steps']:,} | {run['steps'] * SEQ_LEN * BATCH:,} | {run['train_seconds']:.0f} | "
            + " | ".join(f"{run['losses'][name]:.3f}" for name in names)
            + " |"
        )
    print(
        json.dumps(
            {"budget_seconds": budget, "peer_tokens_per_s": peer_rate, "our_tokens_per_s": our_rate, "runs": runs},
            default=str,
        )
    )


if __name__ == "__main__":
    main()
