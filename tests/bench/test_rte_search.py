"""bench/rte_search.py over several sittings: the search's wall time is the sum of the sittings' own, and each trial
writes periodic checkpoints so that a sitting stopped mid-trial continues it."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import rte_search  # bench/ scripts are top-level modules, imported as they import each other


def test_the_wall_time_sums_the_sittings_and_not_the_hours_between_them(tmp_path):
    (tmp_path / "search").mkdir()
    assert rte_search.search_seconds(tmp_path) == 0.0  # nothing has run yet
    rte_search.log_session(tmp_path, time.time() - 600, rte_search.ended_trials(tmp_path / "search"))
    trials = {"trials": [{"trial": n} for n in range(3)]}
    (tmp_path / "search" / "search.json").write_text(json.dumps(trials), encoding="utf-8")
    # a day later, a second sitting of 300 s
    rte_search.log_session(tmp_path, time.time() - 300, rte_search.ended_trials(tmp_path / "search"))
    records = [json.loads(line) for line in (tmp_path / "sessions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [record["trials_ended"] for record in records] == [0, 3]
    assert 899 < rte_search.search_seconds(tmp_path) < 910


def test_every_trial_checkpoints_periodically_so_a_stopped_sitting_resumes_mid_trial(tmp_path):
    arguments = argparse.Namespace(work=tmp_path, max_length=128, trials=20, checkpoint_every=50)
    command = rte_search.search_command(arguments, "minilm", tmp_path / "RTE", resume=True)
    assert "checkpoint_every=50" in command
    assert command[-1] == "--resume"
