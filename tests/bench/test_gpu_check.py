"""bench/gpu_check.py, the one command for a CUDA machine, on a machine without CUDA: one line, exit status 0."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the command runs the whole check (make gpu-check)")
@pytest.mark.slow
def test_without_cuda_it_says_so_in_one_line_and_succeeds():
    finished = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip().splitlines() == [
        "bench: no CUDA device here: gpu_check runs on a CUDA machine (--dry-run shows its plan)"
    ]
