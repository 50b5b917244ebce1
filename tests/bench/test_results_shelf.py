"""bench/results as a shelf: one <benchmark>.jsonl per benchmark, every record dated and with its machine, and
bench/_common.append_result, the one writer the benchmarks' "update the committed results" flags call."""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402  (bench/ scripts import it as a top-level module, as here)

MACHINE = {"cpu": "Test CPU", "cores": 2, "torch_threads": 2, "matmul_gflops_fp32": 123.4}


def test_append_result_adds_date_and_machine_and_appends(tmp_path):
    path = _common.append_result("demo", {"score": 0.5, "arm": "ours"}, machine=MACHINE, results=tmp_path)
    later = [{"arm": "peer", "score": 0.6}, {"score": 0.7, "date": "2026-01-02", "arm": "ours"}]
    _common.append_result("demo-series", later, MACHINE, results=tmp_path)
    assert path == tmp_path / "demo.jsonl"
    records = _common.read_results("demo", results=tmp_path) + _common.read_results("demo-series", results=tmp_path)
    today = datetime.date.today().isoformat()
    stamp = {"cpu": "Test CPU", "matmul_gflops": 123.4}
    assert records == [
        {"benchmark": "demo", "date": today, **stamp, "arm": "ours", "score": 0.5},
        {"benchmark": "demo", "date": today, **stamp, "arm": "peer", "score": 0.6},  # the series is not the name
        {"benchmark": "demo", "date": "2026-01-02", **stamp, "arm": "ours", "score": 0.7},  # its own date wins
    ]
    assert list(json.loads(path.read_text().splitlines()[0])) == [*_common.STAMP, "score"]


@pytest.mark.parametrize("record", [{"score": 0.5}, {"arm": "ours", "peer": {"score": 0.4}}, {"arm": 1}])
def test_a_record_is_one_run_of_one_named_arm(record, tmp_path):
    with pytest.raises(ValueError, match="arm"):
        _common.append_result("demo", record, machine=MACHINE, results=tmp_path)
    assert not any(tmp_path.iterdir())


def test_append_result_writes_paths_as_text(tmp_path):
    record = {"run_dir": tmp_path, "arm": "ours"}
    _common.append_result("demo", record, machine={"cpu": "x", "matmul_gflops": 1.0}, results=tmp_path)
    assert _common.read_results("demo", results=tmp_path)[0]["run_dir"] == str(tmp_path)


@pytest.mark.parametrize("name", ["conll_ner-2026-11-26", "Conll", "conll ner", "../conll", ""])
def test_a_benchmark_name_is_never_dated_or_a_path(name, tmp_path):
    with pytest.raises(ValueError):
        _common.append_result(name, {}, machine=MACHINE, results=tmp_path)
    assert not any(tmp_path.iterdir())


def test_no_results_yet_reads_as_none(tmp_path):
    assert _common.read_results("ulmfit_imdb-tapt", results=tmp_path) == []


def test_the_committed_shelf_has_one_file_per_benchmark_and_dated_records_with_their_machine():
    files = sorted(_common.RESULTS.iterdir())
    assert files, "bench/results is empty"
    for path in files:
        benchmark, suffix = path.name.rsplit(".", 1)
        assert suffix in ("jsonl", "png"), f"{path.name}: the shelf holds <benchmark>.jsonl and <benchmark>.png only"
        assert _common.result_path(benchmark, "." + suffix) == path
        if suffix == "png":
            assert (path.with_suffix(".jsonl")).exists(), f"{path.name}: a plot without its runs"
            continue
        for number, record in enumerate(_common.read_jsonl(path), start=1):
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record.get("date") or ""), f"{path.name}:{number}: no date"
            assert "cpu" in record and "matmul_gflops" in record, f"{path.name}:{number}: no machine fields"


@pytest.mark.parametrize("path", sorted(_common.RESULTS.glob("*.jsonl")), ids=lambda path: path.stem)
def test_every_committed_record_is_in_the_one_format(path):
    """Each line one run of one arm, flat, its STAMP first: so one reader (and one table) serves every benchmark."""
    for number, record in enumerate(_common.read_jsonl(path), start=1):
        assert list(record)[: len(_common.STAMP)] == list(_common.STAMP), f"{path.name}:{number}: not stamped first"
        assert record["benchmark"] == path.stem.split("-")[0], f"{path.name}:{number}: another benchmark's record"
        _common.check_record(record)


def test_only_common_writes_the_shelf():
    """Every script appends through append_result: none builds a bench/results path (a dated file) of its own."""
    for script in sorted(BENCH.rglob("*.py")):
        if script.name == "_common.py":
            continue
        source = script.read_text(encoding="utf-8")
        assert '/ "results"' not in source and '"bench/results' not in source, f"{script.name} writes bench/results"
