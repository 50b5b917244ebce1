"""leave_process_group: at exit, the gloo group is really destroyed and its worker threads are gone.

A gloo worker thread still alive when Python shuts down aborts the process if it frees a tensor then (see the
function's docstring); the 2-process launches of tests/cli/test_distributed.py exercise the whole path.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed

pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="needs gloo"
    ),
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc"),
    pytest.mark.slow,  # a gloo process group in a process of its own (make test-slow; CI runs it too)
]

# One process: a gloo group, then what a stage does with it (DDP and a gather), then the teardown; prints the names
# of the process's threads before and after it.
SCRIPT = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist

    def threads():
        return sorted(open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))

    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    gathered = [torch.empty(3)]
    dist.all_gather(gathered, torch.ones(3))
    del model, gathered
    # Imported after DDP, as a launcher that makes the group before finetune's stages are imported does: DDP then
    # was first to import torch.distributed.nn, with the group in its defaults.
    from finetune.training.driver import leave_process_group

    print("BEFORE", threads())
    leave_process_group()
    print("AFTER", threads(), dist.is_initialized())
    import torch.distributed.nn.functional as functional
    print("DEFAULTS", functional.all_gather.__defaults__)
""")


def test_leave_process_group_joins_the_gloo_threads(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert "pt_gloo_runloop" in lines["BEFORE"]  # else the check below proves nothing
    # Without the defaults torch.distributed.nn.functional holds, destroy_process_group alone leaves them running.
    assert "gloo" not in lines["AFTER"] and lines["AFTER"].endswith("False"), lines["AFTER"]
    assert lines["DEFAULTS"] == "(None,)"
