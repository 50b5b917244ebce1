"""bench/few_labels_vs_setfit.py's pure parts: the stratified draw and ours' dev rows, the scorer (and the SetFit peer's
agreeing with it), the Student t interval, the table of a few crafted runs, and which runs a resumed grid skips. No
data of ../shared is read: the rows are made here."""

from __future__ import annotations

import json
import math
import sys

import pytest
from scipy import stats

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
sys.path.insert(0, str(REPO_ROOT / "bench" / "peers"))

import few_labels_vs_setfit as bench  # bench/ scripts are top-level modules, imported as they import each other
import setfit_peer  # its imports of setfit are inside main(): only its scorer is used here

# 3 classes of 40, 10 and 3 rows, interleaved as a file has them.
LABELS = ["a"] * 40 + ["b"] * 10 + ["c"] * 3
LABELS = [LABELS[(7 * index) % len(LABELS)] for index in range(len(LABELS))]  # 7 is coprime with 53: a permutation


def test_the_draw_takes_n_rows_of_each_class_or_all_of_a_smaller_one():
    drawn = bench.draw_rows(LABELS, 8, draw=0)
    assert {label: len(rows) for label, rows in drawn.items()} == {"a": 8, "b": 8, "c": 3}
    assert all(LABELS[index] == label for label, rows in drawn.items() for index in rows)
    assert len({index for rows in drawn.values() for index in rows}) == 19  # no row twice
    assert sorted(drawn["c"]) == [index for index, label in enumerate(LABELS) if label == "c"]


def test_the_draw_is_reproducible_nested_and_differs_between_draws():
    assert bench.draw_rows(LABELS, 8, draw=3) == bench.draw_rows(list(LABELS), 8, draw=3)  # every arm's rows
    small, large = bench.draw_rows(LABELS, 8, draw=3), bench.draw_rows(LABELS, 16, draw=3)
    assert all(large[label][: len(rows)] == rows for label, rows in small.items())  # the 8 are among the 16
    assert bench.draw_rows(LABELS, 8, draw=0)["a"] != bench.draw_rows(LABELS, 8, draw=1)["a"]


def test_the_draw_of_a_class_does_not_depend_on_the_other_classes():
    fewer = [label for label in LABELS if label != "b"]
    kept = [index for index, label in enumerate(LABELS) if label != "b"]  # fewer's row i is LABELS' row kept[i]
    assert [kept[index] for index in bench.draw_rows(fewer, 8, draw=2)["a"]] == bench.draw_rows(LABELS, 8, draw=2)["a"]


def test_ours_trains_on_every_drawn_row_and_its_dev_file_is_those_rows_again():
    drawn = bench.draw_rows(LABELS, 16, draw=0)  # a: 16, b: 10, c: 3
    train, dev = bench.ours_rows(drawn)
    assert sorted(train) == sorted(index for rows in drawn.values() for index in rows) == sorted(dev)


def test_an_unseen_test_class_is_an_error_and_only_training_classes_are_averaged():
    references = ["x", "x", "y", "y", "z"]  # z: no training row has it
    predictions = ["x", "y", "y", "y", "x"]
    scores = bench.score(references, predictions, classes=["w", "x", "y"])  # w: no test row has it
    assert scores["accuracy"] == pytest.approx(3 / 5)
    # x: precision 1/2 (z's row predicted x), recall 1/2; y: precision 2/3, recall 1: F1 1/2 and 4/5
    assert scores["f1_macro"] == pytest.approx((1 / 2 + 4 / 5) / 2)
    assert setfit_peer.scores(references, predictions, ["w", "x", "y"]) == pytest.approx(scores, abs=1e-6)


def test_chance_is_the_share_of_the_most_frequent_class():
    assert bench.chance(["0"] * 444 + ["1"] * 428) == pytest.approx(444 / 872)


def test_the_interval_is_students_t_over_the_draws():
    values = [0.80, 0.82, 0.84, 0.86, 0.88]
    mean, low, high = bench.interval(values)
    # by hand: standard deviation sqrt(0.001), t(0.975, 4 degrees of freedom) = 2.776445
    half = 2.776445 * math.sqrt(0.001) / math.sqrt(5)
    assert (mean, low, high) == pytest.approx((0.84, 0.84 - half, 0.84 + half), abs=1e-6)
    expected = stats.t.interval(0.95, 4, loc=0.84, scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected)
    assert bench.interval([0.7]) == (0.7, None, None)  # one draw: no interval


def record(task, size, draw, arm, accuracy, f1=None, seconds=10.0, **more):
    return {
        "task": task,
        "labels_per_class": size,
        "draw": draw,
        "arm": arm,
        "accuracy": accuracy,
        "f1_macro": accuracy if f1 is None else f1,
        "run_s": seconds,
        "test_rows": 56,
        **more,
    }


RUNS = [
    *(record("cb", 8, draw, "ours", 0.70 + 0.02 * draw, 0.60, seconds=30 + draw) for draw in range(3)),
    *(record("cb", 8, draw, "setfit", 0.65 + 0.01 * draw, 0.50, seconds=100) for draw in range(3)),
    record("cb", 8, 0, "plain", 0.50),  # one draw only: ours - plain pairs draw 0 alone
]


def test_differences_are_paired_over_the_draws_both_arms_have():
    assert bench.paired_differences(RUNS, "cb", 8, ("ours", "setfit"), "accuracy") == pytest.approx([0.05, 0.06, 0.07])
    assert bench.paired_differences(RUNS, "cb", 8, ("ours", "plain"), "accuracy") == pytest.approx([0.20])


def test_the_table_shows_means_intervals_times_and_paired_differences():
    lines = bench.table(RUNS).splitlines()
    assert lines[0] == "### CB (cb): scored on dev.jsonl, 56 rows"
    half = stats.t.ppf(0.975, 2) * 0.02 / math.sqrt(3)  # ours' accuracy 0.70, 0.72, 0.74
    ours = f"| 8 | ours | 3 | 72.0 [{100 * (0.72 - half):.1f}, {100 * (0.72 + half):.1f}] | 60.0 [60.0, 60.0] | 31 |"
    assert ours in lines
    assert "| 8 | plain | 1 | 50.0 | 50.0 | 10 |" in lines
    comparisons = ["ours - setfit accuracy", "ours - setfit macro-F1", "ours - plain accuracy", "ours - plain macro-F1"]
    header = "| labels/class | " + " | ".join(comparisons) + " |"
    row = lines[lines.index(header) + 2]
    differences = row.split(" | ")
    assert differences[1].startswith("+6.0 [") and differences[1].endswith("] (3)")
    assert differences[2] == "+10.0 [10.0, 10.0] (3)"
    assert differences[3:] == ["+20.0 (1)", "+10.0 (1) |"]
    assert bench.table(RUNS, tasks=["sst2"]).splitlines()[0].startswith("mean over draws")  # no sst2 runs: no table


def test_sst2_shows_accuracy_alone_and_smoke_runs_are_flagged():
    lines = bench.table([record("sst2", 16, 0, "ours", 0.9, smoke=True)]).splitlines()
    assert lines[0].startswith("**smoke runs")
    assert "| 16 | ours | 1 | 90.0 | 10 |" in lines


def test_a_resumed_grid_skips_the_runs_recorded_and_smoke_runs_are_not_real_ones():
    jobs = [bench.Job("cb", 8, draw, arm) for draw in range(2) for arm in ("ours", "setfit")]
    done = [record("cb", 8, 0, "ours", 0.7), record("cb", 8, 1, "setfit", 0.6, smoke=True)]
    assert [job.key for job in bench.jobs_to_do(jobs, done)] == [
        ("cb", 8, 0, "setfit", False),
        ("cb", 8, 1, "ours", False),
        ("cb", 8, 1, "setfit", False),
    ]


def test_the_newcomer_is_judged_against_chance_with_the_intervals_lower_end():
    references = ["0"] * 50 + ["1"] * 50
    good = [record("sst2", 16, draw, "ours", 0.80 + 0.01 * draw) for draw in range(5)]
    assert "; not near chance" in bench.newcomer_report(good, references)
    near = [record("sst2", 16, draw, "ours", accuracy) for draw, accuracy in enumerate([0.5, 0.52, 0.7, 0.5, 0.51])]
    assert "NEAR CHANCE" in bench.newcomer_report(near, references)


def test_the_rows_are_read_with_their_label_column_as_label_and_quotes_kept(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text('text\tintent\n"what flights\tflight\ncheapest fare\tairfare\n', encoding="utf-8")
    task = bench.FewLabelTask("t", path, path, ("text",), "intent", ("accuracy",))
    assert bench.read_rows(task, path) == [
        {"text": '"what flights', "label": "flight"},
        {"text": "cheapest fare", "label": "airfare"},
    ]
    lines = tmp_path / "dev.jsonl"
    lines.write_text(json.dumps({"premise": "p", "hypothesis": "h", "label": "neutral"}) + "\n", encoding="utf-8")
    pair = bench.FewLabelTask("cb", lines, lines, ("premise", "hypothesis"), "label", ("accuracy",))
    assert bench.read_rows(pair, lines) == [{"premise": "p", "hypothesis": "h", "label": "neutral"}]


def test_the_newcomers_recipe_names_no_technique_and_every_arm_here_is_a_valid_recipe(tmp_path):
    recipe = bench.toolkit_recipe("ours", "CHECKPOINT", "cb", tmp_path, tmp_path / "run", 3, ["a", "b"])
    assert set(recipe) == {"stage", "run_dir", "seed", "model", "task"}
    assert recipe["task"]["text_columns"] == ["premise", "hypothesis"] and recipe["seed"] == 3
    bench.check_arms(["ours", "setfit"], "CHECKPOINT", bench.SMOKE_OVERRIDES)  # stops the benchmark if not valid


def test_the_unlabelled_arms_text_is_no_drawn_row_and_carries_no_label(monkeypatch):
    rows = [{"sentence": f"row {index}", "label": label} for index, label in enumerate(LABELS)]
    drawn = bench.draw_rows(LABELS, 8, draw=1)
    monkeypatch.setattr(bench, "UNLABELLED_ROWS", 20)
    text = bench.unlabelled_rows(rows, drawn, draw=1)
    assert len(text) == 20 and all(set(row) == {"sentence"} for row in text)  # the label column is gone
    taken = {f"row {index}" for class_rows in drawn.values() for index in class_rows}
    assert not taken & {row["sentence"] for row in text}  # no labelled row comes back as unlabelled text
    assert text == bench.unlabelled_rows(rows, drawn, draw=1) != bench.unlabelled_rows(rows, drawn, draw=2)


def test_the_unlabelled_arms_recipe_names_the_file_beside_the_runs_rows(tmp_path):
    recipe = bench.toolkit_recipe("unlabelled", "m", "sst2", tmp_path, tmp_path / "run", 0, ["0", "1"])
    assert recipe["unlabelled_text"] == str(tmp_path / bench.UNLABELLED_FILE)
    assert "unlabelled_text" not in bench.toolkit_recipe("ours", "m", "sst2", tmp_path, tmp_path / "run", 0, ["0"])
