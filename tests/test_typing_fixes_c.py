"""Behaviour pinned while typing data/, glue/, reporting/, console.py and cli.py (mypy)."""

from __future__ import annotations

import pytest

from finetune.console import phase_bar
from finetune.data.tasks import task_file
from finetune.errors import InputError
from finetune.glue.specs import GLUE_TASKS, SUBMISSION_FILES, SUBMISSION_TASKS


def test_task_file_without_a_folder_is_an_input_error():
    # task_file takes the recipe's optional data_dir: None is a one-line error, not a TypeError from Path(None)
    with pytest.raises(InputError, match="no data folder to read its dev file from"):
        task_file(GLUE_TASKS["rte"], None, "dev")


def test_submission_files_name_every_submission_task():
    assert list(SUBMISSION_FILES) == [spec.submission_file for spec in SUBMISSION_TASKS]
    assert len(SUBMISSION_FILES) == 11


def test_phase_bar_advance_takes_an_optional_count():
    with phase_bar("counting", 3, enabled=False) as advance:
        advance()
        advance(2)
