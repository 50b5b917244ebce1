"""kinds/dev_split.py: task.dev_split's held-out rows, stratified and seeded, recorded in the run folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from finetune.data.examples import TaskExamples
from finetune.errors import UserError
from finetune.kinds.dev_split import (
    DEV_SPLIT_FILE,
    drawn_split,
    held_out_rows,
    recorded_dev_rows,
    take_rows,
    write_split,
)

LABELS = np.array([0] * 90 + [1] * 10)


def test_the_split_is_stratified_seeded_and_covers_every_row_once():
    train, dev = drawn_split(100, 0.2, seed=3, strata=LABELS)
    assert sorted(train + dev) == list(range(100)) and len(dev) == 20
    assert int(LABELS[dev].sum()) == 2  # 10% positives in dev as in train
    assert drawn_split(100, 0.2, seed=3, strata=LABELS) == (train, dev)
    assert drawn_split(100, 0.2, seed=4, strata=LABELS)[1] != dev


def test_the_run_folder_keeps_the_split_a_resume_reads(tmp_path: Path):
    drawn = held_out_rows(tmp_path, 100, 0.1, 0, LABELS)
    assert (drawn["train"], drawn["dev"]) == drawn_split(100, 0.1, 0, LABELS)
    write_split(tmp_path, drawn)
    record = json.loads((tmp_path / DEV_SPLIT_FILE).read_text())
    assert record == drawn and (record["seed"], record["share"], record["train_rows"]) == (0, 0.1, 100)
    # A resumed run reads the rows written there, not a new draw.
    record["dev"], record["train"] = list(range(10)), list(range(10, 100))
    (tmp_path / DEV_SPLIT_FILE).write_text(json.dumps(record))
    assert held_out_rows(tmp_path, 100, 0.1, 0, LABELS)["dev"] == list(range(10))
    # Another seed (or share, or training file) draws anew.
    assert held_out_rows(tmp_path, 100, 0.1, 1, LABELS)["dev"] != list(range(10))


def test_take_rows_cuts_every_per_row_field():
    examples = TaskExamples([("a",), ("b",), ("c",)], np.array([0, 1, 0]), ["x", "y", "z"])
    taken = take_rows(examples, [0, 2])
    assert taken.texts == [("a",), ("c",)] and taken.ids == ["x", "z"] and taken.labels.tolist() == [0, 0]


def test_eval_reads_the_rows_beside_the_checkpoint(tmp_path: Path):
    write_split(tmp_path, held_out_rows(tmp_path, 100, 0.1, 0, LABELS))
    (tmp_path / "checkpoint").mkdir()
    rows = recorded_dev_rows([tmp_path / "checkpoint"], 100)
    assert rows == json.loads((tmp_path / DEV_SPLIT_FILE).read_text())["dev"]
    with pytest.raises(UserError, match="training file now has 99"):
        recorded_dev_rows([tmp_path / "checkpoint"], 99)
    with pytest.raises(UserError, match=r"no dev_split\.json beside"):
        recorded_dev_rows([tmp_path / "elsewhere" / "checkpoint"], 100)
