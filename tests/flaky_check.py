"""`make test-flaky`: does the suite pass every time, whatever the order of its tests and the number of workers?

    .venv/bin/python -m tests.flaky_check                 # 5 runs (about an hour on 2 cores): what make test-flaky runs
    .venv/bin/python -m tests.flaky_check --runs 2        # fewer
    .venv/bin/python -m tests.flaky_check --reuse-venv    # this checkout's .venv instead of a new one per clone
    .venv/bin/python -m tests.flaky_check --all           # the slow tests too (make test-all's set; CI runs them)
    .venv/bin/python -m tests.flaky_check --bucket global # any test beside any other (slower)

Each run is a fresh clone of the committed HEAD (what CI checks out: untracked files and leftovers of earlier runs
play no part) in a temporary folder, set up as `make test` sets it up (its own .venv, the dev dependencies), then the
suite with the tests in a random order (pytest-random-order, seeded by the run: `--random-order-seed N`, so a failing
order can be replayed; the modules and each module's tests shuffled, pytest-randomly's order) on 1 worker for odd
runs and 2 for even ones (pytest-xdist; tests/conftest.py gives each worker one thread).
It stops at the first failing run and prints how to replay it; the clone is kept then.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def workers(run: int) -> int:
    """1 worker on odd runs, 2 on even ones: a test that needs another to have run first, or to run alone, fails."""
    return 1 if run % 2 else 2


def pytest_command(python: Path, run: int, everything: bool = False, bucket: str = "module") -> list[str]:
    """The suite (make test's tests, or every one) in the random order of seed `run`, on workers(run) workers.
    bucket module (pytest-randomly's order too): the modules shuffled and each module's tests, a module's tests kept
    together, so its fixtures are made once; global: any test beside any other, module fixtures made again each time
    a module's tests are apart (a 1-worker run took 75 minutes)."""
    order = ["-p", "random_order", f"--random-order-bucket={bucket}", f"--random-order-seed={run}"]
    selection = [] if everything else ["-m", "not slow"]
    return [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *order, *selection, "-n", str(workers(run))]


def fresh_clone(folder: Path) -> Path:
    """A clone of HEAD, as CI makes it."""
    clone = folder / "finetune"
    subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True)
    return clone


def set_up(clone: Path, reuse_venv: bool) -> Path:
    """The interpreter the suite runs with: the clone's own .venv as `make dev` makes it, or this checkout's."""
    if reuse_venv:
        return REPO_ROOT / ".venv" / "bin" / "python"
    subprocess.run(["make", "dev"], cwd=clone, check=True)
    return clone / ".venv" / "bin" / "python"


def one_run(run: int, reuse_venv: bool, everything: bool, bucket: str) -> bool:
    """Run `run` in its own clone; True when the suite passed (its clone removed), False when it failed (kept)."""
    folder = Path(tempfile.mkdtemp(prefix=f"finetune-flaky-{run}-"))
    clone = fresh_clone(folder)
    python = set_up(clone, reuse_venv)
    command = pytest_command(python, run, everything, bucket)
    print(f"run {run}: {' '.join(command[1:])} in {clone}", flush=True)
    started = time.monotonic()
    # Reusing this checkout's .venv, its editable install would import this checkout: the clone's code goes first.
    environment = os.environ | ({"PYTHONPATH": str(clone)} if reuse_venv else {})
    passed = subprocess.run(command, check=False, cwd=clone, env=environment).returncode == 0  # a failure is told
    print(f"run {run}: {'passed' if passed else 'FAILED'} in {time.monotonic() - started:.0f} s", flush=True)
    if passed:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        print(f"replay it: cd {clone} && {' '.join(command)}", flush=True)
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of the suite, each in a fresh clone (default 5)")
    parser.add_argument("--reuse-venv", action="store_true", help="this checkout's .venv, not one per clone")
    parser.add_argument("--all", action="store_true", help="the slow tests too (make test leaves them out)")
    parser.add_argument("--bucket", choices=("module", "global"), default="module", help="what is shuffled (module)")
    arguments = parser.parse_args()
    for run in range(1, arguments.runs + 1):
        if not one_run(run, arguments.reuse_venv, arguments.all, arguments.bucket):
            sys.exit(f"flaky check: run {run} of {arguments.runs} failed (seed {run}, {workers(run)} worker(s))")
    print(f"flaky check: {arguments.runs} runs passed, each in a fresh clone, in random order, on 1 and 2 workers")


if __name__ == "__main__":
    main()
