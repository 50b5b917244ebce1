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

    .venv/bin/python bench/mlm_equal_time.py --smoke   # BERT 1 x 32 on 400 lines, a 10 s budget, 16 blocks scored

One record per arm goes to the work folder (--work, default runs/bench-mlm-equal-time: runs.jsonl), and with
--update-results to bench/results/mlm_equal_time.jsonl; the table prints at the end.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoTokenizer, BertForMaskedLM

import _harness as harness
from _common import describe_machine, minilm_checkpoint, require, text_lines
from finetune.data.masking import MaskingRule
from finetune.recipes import MaskingConfig
from finetune.tasks.specs import IGNORE_INDEX
from mlm_pretrain import (
    BATCH,
    PEER,
    RECIPE,
    SEQ_LEN,
    SIZES,
    SMOKE_LINES,
    TRAIN,
    VALID,
    our_overrides,
    run_ours,
    run_peer,
    training_corpus,
)

MASK_SEED = 1234  # the validation masks: the same for both models and every run


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


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "mlm-equal-time", smoke="BERT 1 x 32, 400 lines, 10 s, 16 blocks")
    parser.add_argument("--budget-seconds", type=float, default=300, help="training wall-clock time of each side")
    parser.add_argument("--peer-tokens-per-s", type=float, help="the peer's throughput (default: measured here)")
    parser.add_argument("--our-tokens-per-s", type=float, help="our throughput (default: measured here)")
    parser.add_argument("--validation-blocks", type=int, help="score only the first N blocks of each layout")
    args = parser.parse_args()
    size, lines = ("tiny", SMOKE_LINES) if args.smoke else ("mini", 20000)
    if args.smoke:
        args.budget_seconds, args.validation_blocks = 10, 16
    work = harness.work_folder(args, "mlm-equal-time")
    machine = describe_machine()  # the figures below belong to this machine
    for path, what in ((TRAIN, "WikiText-2 train.txt"), (VALID, "WikiText-2 valid.txt"), (PEER, "the peer script")):
        require(path, what)
    tokenizer_dir = minilm_checkpoint("the reference vocabulary")
    budget, corpus = args.budget_seconds, training_corpus(work, lines)
    layers, hidden, heads = SIZES[size]
    rates = {
        "peer": args.peer_tokens_per_s or run_peer(corpus, tokenizer_dir, 12, size, lines)["tokens_per_s"],
        "ours": args.our_tokens_per_s
        or run_ours(corpus, tokenizer_dir, 25, work / "calibration", size)["tokens_per_s"],
    }
    sizes = ["--layers", layers, "--hidden", hidden, "--heads", heads, "--max-lines", lines]
    records = harness.equal_time_runs(
        budget,
        rates,
        SEQ_LEN * BATCH,
        lambda steps: [PEER, "--corpus", corpus, "--tokenizer", tokenizer_dir, "--steps", steps, *sizes],
        lambda steps, run_dir: ["pretrain", RECIPE, *our_overrides(corpus, tokenizer_dir, run_dir, steps, size)],
        work,
    )
    layouts = validation_blocks(AutoTokenizer.from_pretrained(tokenizer_dir), args.validation_blocks)
    for record in records:
        model = record.pop("model")
        losses = {name: round(dense_validation_loss(model, *pair), 4) for name, pair in layouts.items()}
        record.update(size=size, budget_seconds=budget, planned_tokens_per_s=rates[record["arm"]], losses=losses)
        harness.record_run(work, record, "mlm_equal_time" if args.update_results else None, machine)
    blocks = {name: len(pair[0]) for name, pair in layouts.items()}
    print(f"\nequal time: {budget:.0f} s of training per side, BERT {layers} x {hidden}; validation: {blocks} blocks\n")
    columns = {"arm": "arm", "planned from tokens/s": "planned_tokens_per_s", "steps": "steps"}
    columns |= {"trained s": "train_seconds"} | {f"valid loss, {n}": (lambda r, n=n: r["losses"][n]) for n in layouts}
    print(harness.markdown_table(records, columns, formats={f"valid loss, {n}": "{:.3f}" for n in layouts}))


if __name__ == "__main__":
    main()
