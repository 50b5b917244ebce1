"""bench/_harness.py, the runner's shared parts: the standard flags and work folder, the resume logic, the run log
(and the shelf it appends to on request), the memory-measuring subprocess and the Markdown table with its Student t
intervals. No training: the records are made here, the subprocess is a one-line Python."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from scipy import stats

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import _harness as harness  # bench/ scripts are top-level modules, imported as they import each other


def test_the_parser_has_the_shared_flags_and_only_the_asked_ones():
    parser = harness.benchmark_parser("A benchmark.\n\nMore.", "x", seeds=[0, 1], smoke="tiny", table_only=True)
    args = parser.parse_args([])
    assert (args.work, args.update_results, args.seeds, args.smoke, args.table_only) == (
        None,
        False,
        [0, 1],
        False,
        False,
    )
    assert parser.description == "A benchmark."
    args = parser.parse_args(["--work", "/tmp/w", "--seeds", "3", "4", "--smoke", "--table-only"])
    assert (str(args.work), args.seeds, args.smoke, args.table_only) == ("/tmp/w", [3, 4], True, True)
    bare = harness.benchmark_parser("Doc.", "x").parse_args([])
    assert not any(hasattr(bare, name) for name in ("seeds", "draws", "smoke", "table_only"))
    assert harness.benchmark_parser("Doc.", "x", draws=5).parse_args(["--draws", "2"]).draws == 2
    assert str(harness.benchmark_parser("Doc.", "x").parse_args(["--work-dir", "/tmp/v"]).work) == "/tmp/v"
    with pytest.raises(SystemExit):
        harness.benchmark_parser("Doc.", "x").parse_args(["--smoke"])  # a script without a smoke mode has no flag


def test_the_work_folder_defaults_by_name_and_apart_for_smoke_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "ROOT", tmp_path)
    parser = harness.benchmark_parser("Doc.", "x-y", smoke="tiny")
    assert harness.work_folder(parser.parse_args([]), "x-y") == tmp_path / "runs" / "bench-x-y"
    assert harness.work_folder(parser.parse_args(["--smoke"]), "x-y") == tmp_path / "runs" / "bench-x-y-smoke"
    assert harness.work_folder(parser.parse_args(["--work", str(tmp_path / "w")]), "x-y").is_dir()
    with pytest.raises(SystemExit, match="not results"):
        harness.work_folder(parser.parse_args(["--smoke", "--update-results"]), "x-y")


def test_jobs_already_recorded_are_skipped_and_the_rest_keep_their_order():
    records = [{"task": "sst2", "seed": 0, "arm": "ours"}, {"task": "sst2", "seed": 1, "arm": "peer"}]
    jobs = [("sst2", seed, arm) for seed in (0, 1, 2) for arm in ("ours", "peer")]
    pending = harness.jobs_to_do(jobs, records, key=lambda r: (r["task"], r["seed"], r["arm"]))
    assert pending == [("sst2", 0, "peer"), ("sst2", 1, "ours"), ("sst2", 2, "ours"), ("sst2", 2, "peer")]
    named = harness.jobs_to_do([{"s": 0}, {"s": 5}], [{"seed": 0}], key=lambda r: r["seed"], job_key=lambda j: j["s"])
    assert named == [{"s": 5}]


def test_a_run_goes_to_the_work_log_and_to_the_shelf_only_when_asked(tmp_path, monkeypatch):
    shelf = []
    monkeypatch.setattr(harness, "append_result", lambda name, record, machine: shelf.append((name, record, machine)))
    assert harness.read_log(tmp_path) == []
    harness.record_run(tmp_path, {"seed": 0, "score": 0.5})
    harness.record_run(tmp_path, {"seed": 1, "score": 0.75}, "x_bench", {"cpu": "c"})
    assert harness.read_log(tmp_path) == [{"seed": 0, "score": 0.5}, {"seed": 1, "score": 0.75}]
    assert shelf == [("x_bench", {"seed": 1, "score": 0.75}, {"cpu": "c"})]


def test_the_measured_run_returns_the_output_and_a_peak_of_that_child():
    # From a small parent: a forked child's peak starts at its parent's size (the kernel counts the fork's pages
    # before exec), and the test process holds torch.
    allocate = "x = bytearray(200 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('done')"
    script = (
        "import json, sys; import _harness as h; "
        f"big = h.measured_run([sys.executable, '-c', {allocate!r}]); "
        "small = h.measured_run([sys.executable, '-c', 'print(1)']); "
        "print(json.dumps([big, small]))"
    )
    bench = REPO_ROOT / "bench"
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=bench, check=True)
    (output, peak), (_, small) = json.loads(finished.stdout.strip().splitlines()[-1])
    assert output.strip() == "done"
    assert 200 < peak < 2000  # MB: the 200 MB touched, plus the interpreter
    assert small < 100 < peak  # its own peak, not the largest child's so far
    with pytest.raises(SystemExit, match="failed"):
        harness.measured_run([sys.executable, "-c", "raise SystemExit(3)"])


def test_the_interval_is_students_t_and_absent_for_one_value():
    values = [0.80, 0.84, 0.86, 0.83, 0.87]
    mean, low, high = harness.interval(values)
    expected = stats.t.interval(0.95, 4, loc=sum(values) / 5, scale=stats.sem(values))
    assert mean == pytest.approx(0.84)
    assert (low, high) == pytest.approx(expected)
    assert harness.interval([0.7]) == (0.7, None, None)
    assert harness.shown([0.7]) == "70.0"
    assert harness.shown([0.01, -0.03], signed=True).startswith("-1.0 [")


def test_the_table_shows_one_row_per_record_or_a_mean_and_interval_per_group():
    records = [
        {"arm": "ours", "seed": 0, "dev": {"accuracy": 0.80}, "rate": 10.0},
        {"arm": "ours", "seed": 1, "dev": {"accuracy": 0.84}, "rate": 12.0},
        {"arm": "peer", "seed": 0, "dev": {"accuracy": 0.70}, "rate": None},
    ]
    plain = harness.markdown_table(records, {"arm": "arm", "seed": "seed", "accuracy": "dev.accuracy", "rate": "rate"})
    assert plain.splitlines() == [
        "| arm | seed | accuracy | rate |",
        "|---|---:|---:|---:|",  # text columns (the first record's) left-aligned, numbers right
        "| ours | 0 | 0.8 | 10.0 |",
        "| ours | 1 | 0.8 | 12.0 |",
        "| peer | 0 | 0.7 | - |",
    ]
    grouped = harness.markdown_table(records, {"accuracy": lambda r: 100 * r["dev"]["accuracy"]}, by=("arm",))
    lines = grouped.splitlines()
    assert lines[:2] == ["| arm | n | accuracy |", "|---|---:|---:|"]
    half = stats.t.ppf(0.975, 1) * stats.sem([80.0, 84.0])
    assert lines[2] == f"| ours | 2 | 82.0 [{82 - half:.1f}, {82 + half:.1f}] |"
    assert lines[3] == "| peer | 1 | 70.0 |"
    formatted = harness.markdown_table(records, {"rate": "rate", "at 0.5": "at 0.5"}, formats={"rate": "{:.2f}x"})
    assert formatted.splitlines()[2] == "| 10.00x | - |"  # a field name with a dot is read whole, else dotted
    assert harness.markdown_table([{"a.b": 1.0}], {"a.b": "a.b"}).splitlines()[2] == "| 1.0 |"
    skipped = harness.markdown_table(records, {"rate": "rate"}, by=("arm",)).splitlines()
    assert skipped[2].startswith("| ours | 2 | 11.0 [") and skipped[3] == "| peer | 1 | - |"  # None left out
    assert json.dumps(records)  # the records are left as they were


def test_run_grid_runs_only_the_jobs_not_recorded_and_returns_every_record(tmp_path):
    harness.record_run(tmp_path, {"arm": "ours", "seed": 0, "score": 1.0})
    ran = []

    def run_one(job):
        ran.append(job)
        arm, seed = job
        return {"arm": arm, "seed": seed, "score": float(seed)}

    jobs = [(arm, seed) for seed in (0, 1) for arm in ("ours", "peer")]
    records = harness.run_grid(tmp_path, jobs, key=lambda r: (r["arm"], r["seed"]), run_one=run_one)
    assert ran == [("peer", 0), ("ours", 1), ("peer", 1)]
    assert [(r["arm"], r["seed"]) for r in records] == [("ours", 0), *ran]
    assert harness.read_log(tmp_path) == records  # each run recorded as it finished


@pytest.mark.parametrize("script", harness.benchmark_scripts(), ids=lambda path: path.stem)
def test_every_benchmark_takes_the_shared_flags_and_a_smoke_run(script):
    """Each benchmark's parser is the harness's, with --smoke (what `make bench-smoke` runs): parsed, not run."""
    calls = [
        node
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and "benchmark_parser" in (getattr(node.func, "attr", None), getattr(node.func, "id", None))
    ]
    assert calls, f"{script.name}: its flags are not harness.benchmark_parser's"
    assert any(keyword.arg == "smoke" for call in calls for keyword in call.keywords), f"{script.name}: no --smoke"
