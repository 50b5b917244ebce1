"""A checkpoint's files checked whole before anything reads them: each kind's fault named, cheaply."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from finetune.errors import CheckpointError
from finetune.models.checkpoint_files import check_checkpoint_files, file_fault


def cut_in_half(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def test_whole_files_pass_and_cut_ones_are_named_by_kind(tmp_path):
    save_file({"weight": torch.zeros(64, 64)}, str(tmp_path / "model.safetensors"))
    torch.save({"state": torch.zeros(64, 64)}, tmp_path / "optimizer.bin")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    for name in ("model.safetensors", "optimizer.bin", "config.json"):
        assert file_fault(tmp_path / name) is None
    assert file_fault(cut_in_half(tmp_path / "model.safetensors")).startswith("not a complete safetensors file (")
    assert file_fault(cut_in_half(tmp_path / "optimizer.bin")) == (
        "not a complete torch file (its zip directory is missing: the file was cut short)"
    )
    assert file_fault(cut_in_half(tmp_path / "config.json")) == "not valid JSON (Unterminated string starting at)"
    (tmp_path / "empty.pkl").write_bytes(b"")
    assert file_fault(tmp_path / "empty.pkl") == "an empty file"


def test_torch_files_of_the_old_pickle_format_and_other_kinds_are_left_alone(tmp_path):
    # Some hub checkpoints' pytorch_model.bin predate torch's zip format: nothing cheap can check them.
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": [0.0] * 10}, protocol=2))
    (tmp_path / "README.md").write_text("{ not json", encoding="utf-8")
    assert file_fault(tmp_path / "pytorch_model.bin") is None and file_fault(tmp_path / "README.md") is None


def test_the_folder_check_names_the_first_broken_file_and_looks_in_subfolders_when_asked(tmp_path):
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "training_state").mkdir()
    (tmp_path / "training_state" / "progress.json").write_text("{", encoding="utf-8")
    check_checkpoint_files(tmp_path)  # the top level is whole
    with pytest.raises(CheckpointError) as raised:
        check_checkpoint_files(tmp_path, recursive=True)
    broken = tmp_path / "training_state" / "progress.json"
    assert str(raised.value) == f"{broken}: not valid JSON (Expecting property name enclosed in double quotes)"
