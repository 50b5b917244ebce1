"""bench/grouped_batches.py without training: the batchings' overrides, the padding table, the summary of runs
against shuffled ones (mean, spread, difference, speed, target), and the training mode's skipping of finished runs."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

from finetune.data.task_batches import batch_padding

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import grouped_batches as bench  # noqa: E402  (bench/ scripts are top-level modules, imported as they import each other)


def test_shuffled_comes_first_and_each_batching_sets_its_keys():
    shuffled, default, small, split, unpadded = bench.batchings([50, 8])
    assert [shuffled.name, default.name, small.name, split.name, unpadded.name] == [
        "shuffled",
        "grouped-50",
        "grouped-8",
        "shuffled-split",
        "shuffled-unpadded",
    ]
    # Every arm but the last runs the model's own forward on padded batches, as the earlier rows of the shelf did.
    assert shuffled.overrides() == ["training.group_by_length=false", "training.skip_padding=false"]
    assert small.overrides() == [
        "training.group_by_length=true",
        "training.group_chunk_batches=8",
        "training.skip_padding=false",
    ]
    assert split.overrides() == [
        "training.group_by_length=false",
        "training.split_by_length=true",
        "training.skip_padding=false",
    ]
    assert unpadded.overrides() == ["training.group_by_length=false", "training.skip_padding=true"]
    assert bench.batchings([8], split=False, unpadded=False) == [shuffled, small]
    assert bench.batchings([], split=False) == [shuffled, unpadded]


def test_padding_table_of_hand_made_lengths():
    lengths = {
        "equal": [7] * 64,  # nothing to pad, however batched
        "two kinds": [2, 30] * 32,  # shuffled batches of 4 nearly all hold a 30; sorted ones hold only 2s or only 30s
    }
    table = bench.padding_table(lengths, 4, (1, 16), range(3))
    assert list(table["equal"]) == ["shuffled", "grouped-1", "grouped-16"]
    assert all(row == (0.0, 1.0) for row in table["equal"].values())
    mixed = table["two kinds"]
    assert mixed["grouped-1"] == mixed["shuffled"]  # sorting within each shuffled batch changes no batch's longest
    # One chunk of all 16 batches: 8 batches of 30s and 8 of 2s, no padding, 1,024 positions.
    shuffled_cost = statistics.mean(batch_padding(lengths["two kinds"], 4, seed, None).cost for seed in range(3))
    assert mixed["grouped-16"] == (pytest.approx(0.0), pytest.approx(shuffled_cost / (8 * 4 * 30 + 8 * 4 * 2)))
    assert 0.4 < mixed["shuffled"][0] < 0.5  # at most (30 - 2) / 30 of a batch of both, 1 - 16/30 on average


def test_padding_table_prints_a_share_and_a_ratio_per_chunk():
    lengths = {"set": [5, 10, 15, 20] * 8}
    text = bench.format_padding_table(bench.padding_table(lengths, 4, (1, 2), [0]), lengths)
    share, ratio = text.split("cost ratio")
    assert "| data | rows | mean length | shuffled | grouped-1 | grouped-2 |" in share
    assert "| set | 32 | 12.5 |" in share and "1.00x" in ratio


def record(task: str, batching: str, seed: int, score: float, speed: float) -> dict:
    return {
        "task": task,
        "batching": batching,
        "seed": seed,
        "metric": "dev_f1",
        "score": score,
        "examples_per_s": speed,
        "train_rows": 100,
        "epochs": 3,
    }


RUNS = [
    record("ner", "shuffled", 0, 0.850, 40.0),
    record("ner", "shuffled", 1, 0.854, 44.0),
    record("ner", "grouped-50", 0, 0.840, 100.0),
    record("ner", "grouped-50", 1, 0.846, 104.0),
    record("ner", "grouped-8", 0, 0.849, 90.0),
    record("ner", "grouped-8", 1, 0.853, 86.0),
    record("ner", "grouped-8", 2, 0.700, 10.0),  # no shuffled run of seed 2: left out of the comparison
    record("mrpc", "grouped-8", 0, 0.84, 50.0),  # no shuffled run at all
]


def test_summary_compares_each_batching_with_shuffled_on_the_same_seeds():
    rows = {(row["task"], row["batching"]): row for row in bench.summarize(RUNS)}
    shuffled, default, small = rows["ner", "shuffled"], rows["ner", "grouped-50"], rows["ner", "grouped-8"]
    assert shuffled["mean"] == pytest.approx(85.2) and shuffled["sd"] == pytest.approx(statistics.stdev([85, 85.4]))
    assert shuffled["difference"] is shuffled["speed"] is shuffled["target"] is None
    assert default["difference"] == pytest.approx(-0.9) and default["speed"] == pytest.approx(102 / 42)
    assert default["target"] is False  # 2.4x as fast, 0.9 below
    assert small["seeds"] == 3 and small["min"] == pytest.approx(70.0)  # its own figures: every seed
    assert small["difference"] == pytest.approx(-0.1) and small["speed"] == pytest.approx(88 / 42)
    assert small["target"] is True  # seeds 0 and 1 only: 0.1 below, 2.1x
    assert rows["mrpc", "grouped-8"]["target"] is None and rows["mrpc", "grouped-8"]["sd"] == 0.0
    assert bench.summarize(RUNS, gap=0.05)[2]["target"] is False  # the same runs against a tighter target
    # Runs of another size are another setup, compared with their own shuffled runs.
    bigger = [{**run, "train_rows": 200, "score": run["score"] + 0.01} for run in RUNS[:2]]
    summary = bench.summarize(RUNS + bigger)
    assert [(row["task"], row["train_rows"], row["batching"]) for row in summary][-1] == ("ner", 200, "shuffled")
    assert summary[-1]["mean"] == pytest.approx(86.2) and summary[0]["mean"] == pytest.approx(85.2)


def test_summary_table_says_where_the_target_holds_and_what_a_miss_lacks():
    text = bench.format_summary(bench.summarize(RUNS))
    lines = text.splitlines()
    assert lines[0].startswith("| task (metric) | rows x epochs | batching | seeds | mean |")
    default = "| ner (dev_f1) | 100 x 3 | grouped-50 | 2 | 84.30 | 0.42 | 84.0-84.6 | -0.90 | 102.0 | 2.43x |"
    assert default + " misses (quality) |" in lines
    assert any(
        line.startswith("| ner (dev_f1) | 100 x 3 | grouped-8 | 3 |") and line.endswith("| 2.10x | holds |")
        for line in lines
    )
    assert "grouped-8: target (>= -0.3 and >= 2.0x) on 1 of 1 tasks (ner yes)" in lines
    assert "grouped-50: target (>= -0.3 and >= 2.0x) on 0 of 1 tasks (ner no)" in lines
    slow = bench.summarize([record("rte", "shuffled", 0, 0.6, 40.0), record("rte", "grouped-8", 0, 0.5, 60.0)])
    assert bench.shortfall(slow[1]) == "both"


def test_the_training_mode_skips_runs_already_recorded(tmp_path, monkeypatch):
    """Resumable: a run whose task, batching, seed, rows and epochs are in runs.jsonl is not run again; one of other
    rows is."""
    done = record("sst2", "shuffled", 0, 0.8, 50.0)
    other_rows = {**record("sst2", "grouped-8", 0, 0.7, 90.0), "train_rows": 64}
    (tmp_path / "runs.jsonl").write_text(json.dumps(done) + "\n" + json.dumps(other_rows) + "\n", encoding="utf-8")
    monkeypatch.setattr(bench, "prepare", lambda *_: bench.Prepared(tmp_path / "r.yaml", [], 100))
    ran = []

    def run_one(task, setup, prepared, batching, seed, args):
        ran.append((task, batching.name, seed))
        return record(task, batching.name, seed, 0.81, 100.0)

    monkeypatch.setattr(bench, "run_one", run_one)
    args = argparse.Namespace(work=tmp_path, seeds=[0], chunks=[8], split=False, unpadded=False)
    logged = []
    setups = {"sst2": bench.Setup("dev_accuracy", 100, bench.ALL, 3)}
    records = bench.run_all(args, setups, "checkpoint", {}, logged.append)
    assert ran == [("sst2", "grouped-8", 0)] and logged == [record("sst2", "grouped-8", 0, 0.81, 100.0)]
    assert records == [done, logged[0]]


def test_smoke_and_train_rows_resize_every_task():
    smoke = argparse.Namespace(tasks=["ner", "mrpc"], smoke=True, train_rows=None)
    assert {setup[1:] for setup in bench.task_setups(smoke).values()} == {(48, 32, 1)}
    rows = argparse.Namespace(tasks=["multilabel"], smoke=False, train_rows=500)
    assert bench.task_setups(rows)["multilabel"] == bench.Setup("dev_f1_micro", 500, 1000, 3)


def test_cut_rows_keeps_the_header_and_the_first_rows(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\na\t0\nb\t1\nc\t0\n", encoding="utf-8")
    bench.cut_rows(path, 2, header=True)
    assert path.read_text(encoding="utf-8") == "sentence\tlabel\na\t0\nb\t1\n"
