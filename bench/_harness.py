"""The runner's parts every benchmark script repeated, beside _common.py (paths, the machine, the results shelf):
the standard flags, the work folder, which jobs of a grid are still to do, the run log of the work folder (and the
shelf with --update-results), a subprocess whose peak memory is measured, and one Markdown table printer with the
mean and its 95% Student t interval over seeds or draws.

Not a benchmark. A script keeps what is particular to its experiment (its data, its arms, its record's fields) and
takes the rest from here:

    parser = benchmark_parser(__doc__, "arc-choices", seeds=[0])      # --work --update-results --seeds
    args = parser.parse_args()
    work = work_folder(args, "arc-choices")                            # runs/bench-arc-choices[-smoke]
    for job in jobs_to_do(jobs, read_log(work), key=...):              # resume: skip the recorded ones
        record_run(work, record, "arc_choices" if args.update_results else None, machine)
    print(markdown_table(records, columns, by=("arm",)))               # mean [95% interval] over seeds

It imports nothing of the toolkit (scipy only when an interval is drawn), so --table-only stays cheap.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from _common import ROOT, STDERR_TAIL, append_result, read_jsonl

BENCH = Path(__file__).resolve().parent
# Scripts of bench/ that are parts of benchmarks (data helpers, a budgeted run), not benchmarks: no --smoke.
NOT_BENCHMARKS = frozenset({"conll_entity_types.py", "squad_sample_split.py", "ours_budget.py"})
CONFIDENCE = 0.95  # every interval in the tables: the mean's two-sided 95% Student t interval
LOG = "runs.jsonl"  # a work folder's run log: one record per finished run, read back on resuming


def benchmark_parser(
    doc: str,
    name: str,
    *,
    seeds: list[int] | None = None,
    draws: int | None = None,
    smoke: str | None = None,
    table_only: bool = False,
    results: str = "also append the runs to bench/results/",
) -> argparse.ArgumentParser:
    """A parser with the flags every benchmark shares, spelt and explained once: --work (or --work-dir, as some
    scripts named it; default runs/bench-NAME, -smoke added under --smoke), --update-results (`results`: its help,
    where it does more), and where the script has them --seeds (their default), --draws (0 .. N-1), --smoke (its
    help says what the smoke run cuts) and --table-only. Its description is the docstring's first line; the script
    adds its own flags after."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    default = f"runs/bench-{name}" + ("[-smoke]" if smoke is not None else "")
    parser.add_argument("--work", "--work-dir", type=Path, default=None, help=f"the work folder (default {default})")
    parser.add_argument("--update-results", action="store_true", help=results)
    if seeds is not None:
        parser.add_argument("--seeds", type=int, nargs="+", default=seeds, help="one run of each arm per seed")
    if draws is not None:
        parser.add_argument("--draws", type=int, default=draws, help="draws 0 .. N-1 of the labelled rows")
    if smoke is not None:
        parser.add_argument("--smoke", action="store_true", help=smoke)
    if table_only:
        parser.add_argument(
            "--table-only", action="store_true", help="run nothing: the table of the work folder's runs"
        )
    return parser


def work_folder(args: argparse.Namespace, name: str) -> Path:
    """--work, or runs/bench-NAME (with -smoke for a smoke run, so that its tiny runs never mix with real ones);
    created. Stops when --smoke and --update-results come together: a smoke run is no result."""
    smoke = getattr(args, "smoke", False)
    if smoke and args.update_results:
        sys.exit("bench: --smoke runs are not results: leave out --update-results")
    work = args.work or ROOT / "runs" / (f"bench-{name}" + ("-smoke" if smoke else ""))
    work.mkdir(parents=True, exist_ok=True)
    return work


def read_log(work: Path) -> list[dict]:
    """Every run recorded in WORK/runs.jsonl, oldest first (none before the first)."""
    log = work / LOG
    return read_jsonl(log) if log.is_file() else []


def jobs_to_do(jobs: Iterable, records: list[dict], key: Callable[[dict], tuple], job_key=None) -> list:
    """The jobs no record has done, in their order: so an interrupted grid resumes where it stopped. `key` reads a
    record's identity (task, size, seed, arm...); `job_key` a job's (default: the job itself)."""
    done = {key(record) for record in records}
    job_key = job_key or (lambda job: job)
    return [job for job in jobs if job_key(job) not in done]


def record_run(work: Path, record: dict, benchmark: str | None = None, machine: dict | None = None) -> None:
    """Append a finished run to WORK/runs.jsonl at once (an interruption loses only the run in flight), and with a
    `benchmark` (the script's --update-results) to bench/results/<benchmark>.jsonl with the machine's fields."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / LOG, "a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=str) + "\n")
    if benchmark:
        append_result(benchmark, record, machine=machine)


def run_grid(
    work: Path,
    jobs: Iterable,
    key: Callable[[dict], tuple],
    run_one: Callable[..., dict],
    benchmark: str | None = None,
    machine: dict | None = None,
    job_key=None,
) -> list[dict]:
    """The seeds x arms (x sizes ...) loop every benchmark runs: each job no record of WORK/runs.jsonl has done
    (`key` / `job_key` as in jobs_to_do) is run by `run_one(job)`, which returns its record (one run of one arm:
    `arm` and its fields), recorded at once (record_run: the work folder, and the shelf under `benchmark`); returns
    every record, the earlier runs' first."""
    records = read_log(work)
    for job in jobs_to_do(jobs, records, key, job_key):
        record = run_one(job)
        record_run(work, record, benchmark, machine)
        records.append(record)
    return records


def measured_run(command: list, env: dict | None = None, cwd: Path = ROOT) -> tuple[str, float]:
    """Run a command; (its standard output, its peak resident memory in MB). The peak is the kernel's for that one
    child (wait4's rusage), not RUSAGE_CHILDREN's maximum over every child so far, which an earlier, larger side
    would set. The kernel counts the forked child's pages before its exec too, so the calling process should be
    smaller than what it measures. Stops the benchmark with the end of its error output when it fails."""
    command = [str(part) for part in command]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    with tempfile.TemporaryFile("w+") as output, tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(command, stdout=output, stderr=errors, cwd=cwd, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        errors.seek(0)
        if process.returncode != 0:
            name = Path(command[1]).name if len(command) > 1 else command[0]
            sys.exit(f"bench: {name} failed ({process.returncode}):\n{errors.read()[-STDERR_TAIL:]}")
        return output.read(), usage.ru_maxrss / 1024  # kilobytes on Linux


def interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float | None, float | None]:
    """(mean, low, high): the mean and its Student t interval (n - 1 degrees of freedom), the spread of a few seeds
    being the whole claim; no interval (None, None) for one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    from scipy.stats import t

    half = t.ppf((1 + confidence) / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def shown(values: list[float], scale: float = 100, digits: int = 1, signed: bool = False) -> str:
    """A table cell: the mean x scale [its 95% interval], the interval left out for one value: one format, so that
    every table reads alike."""
    mean, low, high = interval(values)
    text = f"{scale * mean:+.{digits}f}" if signed else f"{scale * mean:.{digits}f}"
    return text if low is None else f"{text} [{scale * low:.{digits}f}, {scale * high:.{digits}f}]"


def markdown_table(
    records: list[dict], columns: dict[str, Callable | str], by: tuple[str, ...] = (), formats: dict | None = None
) -> str:
    """The Markdown table of `records`, one column per `columns` entry: header -> a record's field name (a dotted
    one reads inside) or a function of a record giving the number as shown (x100 for a score). Without `by`, one row
    per record. With `by`, one row per group of equal `by` fields (first-seen order): the group's fields, its size
    (n), and each column's mean [95% interval] over the group (the seeds or draws; missing values left out).
    `formats`: header -> a format ("{:.2f}x"); one decimal otherwise, '-' for a missing value."""
    read = {header: (value if callable(value) else _field(value)) for header, value in columns.items()}
    show = {header: (formats or {}).get(header, "{:.1f}").format for header in read}
    headers = [*by, *(["n"] if by else []), *read]
    text = set(by) | {h for h in read if not by and records and isinstance(read[h](records[0]), str)}  # left-aligned
    lines = ["| " + " | ".join(headers) + " |", "|" + "".join("---|" if h in text else "---:|" for h in headers)]
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault(tuple(record.get(field) for field in by) if by else (id(record),), []).append(record)
    for group, members in groups.items():
        if by:
            cells = [*map(str, group), str(len(members))]
            values = {header: [v for v in map(read[header], members) if v is not None] for header in read}
            cells += [_summary(values[header], show[header]) for header in read]
        else:
            cells = [_cell(read[header](members[0]), show[header]) for header in read]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _field(name: str) -> Callable[[dict], object]:
    """A column that reads one field of a record: the name itself, else a dotted path ("ours.examples_per_s")."""

    def read(record: dict) -> object:
        if name in record:
            return record[name]
        value = record
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return read


def _cell(value: object, show: Callable[[float], str]) -> str:
    """A plain cell: numbers in the column's format (not a bool or an int seed), None as '-', else as itself."""
    if value is None:
        return "-"
    return show(value) if isinstance(value, float) else str(value)


def _summary(values: list[float], show: Callable[[float], str]) -> str:
    """A group's cell: the mean [its 95% interval] in the column's format; the mean alone for one value."""
    if not values:
        return "-"
    mean, low, high = interval(values)
    return show(mean) if low is None else f"{show(mean)} [{show(low)}, {show(high)}]"


def benchmark_scripts() -> list[Path]:
    """Every benchmark of bench/: each takes the shared flags and --smoke (tests/bench/test_harness.py checks)."""
    return sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_") and p.name not in NOT_BENCHMARKS)


def smoke_all(names: list[str]) -> int:
    """`make bench-smoke`: every benchmark (or those `names`) with --smoke, one after another, each into a fresh
    work folder under runs/bench-smoke-all; a line per script (passed or failed, seconds) and the failures' error
    output; the number of failures."""
    import time

    failures = 0
    for script in benchmark_scripts():
        if names and script.stem not in names:
            continue
        work = ROOT / "runs" / "bench-smoke-all" / script.stem
        start = time.perf_counter()
        command = [sys.executable, str(script), "--smoke", "--work", str(work)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        seconds = time.perf_counter() - start
        print(f"{'passed' if done.returncode == 0 else 'FAILED'}  {script.name}  {seconds:.0f} s", flush=True)
        if done.returncode != 0:
            failures += 1
            print(done.stderr[-STDERR_TAIL:], flush=True)
    return failures


# --- group 1 additions ---
MARGIN = 0.95  # equal time: plan 5% fewer steps than the budget allows (throughput on a shared machine drifts)


def pretrain_speed(run_dir: Path, tokens_per_step: int) -> dict:
    """Our pretraining run's tokens/s over its windows after the first (steady_rate), the steps that covers, and
    what starting cost: the first window's seconds less the same steps at that rate (with training.compile, the
    compilation too)."""
    from _common import phase_records, steady_rate

    windows, rate = phase_records(run_dir, "train"), steady_rate(run_dir, "tokens")
    first = windows[0]["step"] * tokens_per_step
    start_cost = first / windows[0]["tokens_per_s"] - first / rate
    steps = windows[-1]["step"] - windows[0]["step"]
    return {"tokens_per_s": round(rate, 1), "steps_timed": steps, "start_cost_s": round(start_cost, 1)}


def equal_time_runs(
    budget: float,
    rates: dict,
    tokens_per_step: int,
    peer_command: Callable,
    our_arguments: Callable,
    work: Path,
    score: Callable[[Path], dict],
) -> list[dict]:
    """Both arms trained for the same wall-clock budget, each for MARGIN x budget x its own rate (`rates`: peer and
    ours tokens/s) steps, so that its linear schedule ends inside the budget: the peer (`peer_command(steps)`: the
    script and its arguments) through bench/peers/peer_budget.py, which saves its model; ours (`our_arguments(steps,
    run_dir)`: `finetune`'s) through bench/ours_budget.py; each stopped after the step that crosses the budget should
    it run slower than planned. Then `score(model folder)` gives each arm's validation losses ({layout: loss}).
    Prints the table; a record per arm: steps, max_steps, train_seconds, stopped_at_budget, losses."""
    from _common import phase_records, run

    plan = {arm: max(1, math.floor(MARGIN * budget * rate / tokens_per_step)) for arm, rate in rates.items()}
    folder = work / "peer-equal-time"
    command = [BENCH / "peers" / "peer_budget.py", "--budget-seconds", budget, "--save-to", folder, "--"]
    finished = subprocess.run([str(part) for part in [sys.executable, *command, *peer_command(plan["peer"])]],
                              capture_output=True, text=True, check=False)  # fmt: skip
    if not (folder / "budget.json").is_file():  # written right after training, before the peer prints its figure
        sys.exit(f"bench: the peer failed:\n{finished.stderr[-STDERR_TAIL:]}")
    peer = {"arm": "peer", **json.loads((folder / "budget.json").read_text()), "model": folder}
    run_dir = work / "ours-equal-time"
    command = [BENCH / "ours_budget.py", "--budget-seconds", budget, "--", *our_arguments(plan["ours"], run_dir)]
    run([sys.executable, *command], cwd=ROOT)
    done = [record["step"] for record in phase_records(run_dir, "train")]
    seconds = sum(  # each window's seconds: its tokens over its tokens per second
        (step - before) * tokens_per_step / record["tokens_per_s"]
        for before, step, record in zip([0, *done], done, phase_records(run_dir, "train"))
    )
    ours = {"arm": "ours", "steps": done[-1], "max_steps": plan["ours"], "train_seconds": round(seconds, 1)}
    records = [peer, {**ours, "stopped_at_budget": done[-1] < plan["ours"], "model": run_dir / "checkpoint"}]
    for record in records:
        losses = score(record.pop("model"))
        record.update(budget_seconds=budget, planned_tokens_per_s=rates[record["arm"]], losses=losses)
    columns = {"arm": "arm", "planned from tokens/s": "planned_tokens_per_s", "steps": "steps"}
    columns |= {"trained s": "train_seconds"} | {f"valid loss, {n}": (lambda r, n=n: r["losses"][n]) for n in losses}
    print(f"\nequal time: {budget:.0f} s of training per arm\n")
    print(markdown_table(records, columns, formats={f"valid loss, {n}": "{:.3f}" for n in losses}))
    return records


def byte_level_bpe(folder: Path, vocab: int, source: Path) -> Path:
    """`folder`, holding a byte-level BPE of `vocab` pieces trained with the toolkit's code on the documents (the
    non-empty lines) of `source`: trained the first time, reused after."""
    if not (folder / "tokenizer.json").is_file():
        sys.path.insert(0, str(ROOT))  # this checkout's finetune
        from finetune.data.corpus import read_documents
        from finetune.data.tokenizers import train_byte_level_bpe

        train_byte_level_bpe(read_documents([source]), vocab).save_pretrained(folder)
    return folder


def text_head(source: Path, lines: int, target: Path) -> Path:
    """`target`, holding the first `lines` non-empty lines of `source` (a smoke run's corpus, a short validation)."""
    from _common import text_lines

    target.write_text("\n".join(text_lines(source)[:lines]) + "\n", encoding="utf-8")
    return target


def pretrain_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags bench/clm_pretrain.py and bench/mlm_pretrain.py share: speed's --repeats and --set, equal time's."""
    parser.add_argument("--repeats", type=int, default=1, help="speed: peer-then-ours pairs, interleaved")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for ours")
    parser.add_argument("--equal-time", type=float, metavar="SECONDS", help="quality at equal training time instead "
                        "of speed: each side trains this long, then both are scored on valid.txt")  # fmt: skip
    parser.add_argument("--peer-tokens-per-s", type=float, help="equal time: the peer's rate (default: measured)")
    parser.add_argument("--our-tokens-per-s", type=float, help="equal time: our rate (default: measured)")
    parser.add_argument("--validation-blocks", type=int, help="equal time: score only the first N blocks per layout")
    return parser


# --- group 2 additions ---


def medians(records: list[dict], by: tuple[str, ...], read: Callable[[dict], float]) -> list[dict]:
    """One row per group of equal `by` fields (first-seen order): those fields, `n`, the `median` of `read` over the
    group and its `values`: for the tables (markdown_table, one row a record) of benchmarks that report medians."""
    groups: dict[tuple, list[float]] = {}
    for record in records:
        groups.setdefault(tuple(record.get(field) for field in by), []).append(read(record))
    return [
        {**dict(zip(by, key)), "n": len(values), "median": statistics.median(values), "values": values}
        for key, values in groups.items()
    ]


def json_recipe(path: Path, recipe: dict) -> Path:
    """Write a recipe the benchmark built as JSON (JSON is YAML) at `path`, its folder created; the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")
    return path


# --- group 3 additions ---


def trainer_peer(script: str, checkpoint, train, dev, epochs, batch, lr, seq_len, seed, *more) -> dict:
    """bench/peers/SCRIPT (a Trainer peer: the budget flags of _hf_peer.peer_parser, then `more`) run to its JSON
    line."""
    from _common import run_json

    command = [sys.executable, BENCH / "peers" / script, "--model", checkpoint, "--train", train, "--dev", dev]
    command += ["--epochs", epochs, "--batch", batch, "--lr", lr, "--seq-len", seq_len, "--seed", seed, *more]
    return run_json(command, echo=True)


def trainer_budget(rows: int, batch: int, epochs: int, lr: float, max_length: int) -> list[str]:
    """Recipe overrides for the Trainer's defaults at a budget: linear decay without warmup, the last weights kept,
    one metrics.jsonl training window per epoch (what _common.rate_over_epochs reads)."""
    return [
        f"training.epochs={epochs}", f"training.batch_size={batch}", f"training.lr={lr}",
        f"task.max_length={max_length}", "schedule.kind=linear", "schedule.warmup_fraction=0.0", "keep_best=false",
        f"training.log_every={-(-rows // batch)}",
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(1 if smoke_all(sys.argv[1:]) else 0)
