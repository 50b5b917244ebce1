"""make test-flaky's runs (tests/flaky_check.py): a seeded random order pytest takes, on 1 and 2 workers in turn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import flaky_check


def test_the_runs_alternate_workers_and_seed_the_order():
    assert [flaky_check.workers(run) for run in (1, 2, 3, 4, 5)] == [1, 2, 1, 2, 1]
    command = flaky_check.pytest_command(Path("python"), 4)
    assert command[command.index("-n") + 1] == "2" and "--random-order-seed=4" in command
    assert "not slow" in command  # what make test runs; --all adds the slow tests
    assert "not slow" not in flaky_check.pytest_command(Path("python"), 4, everything=True)
    assert "--random-order-bucket=module" in command  # modules and each module's tests shuffled
    assert "--random-order-bucket=global" in flaky_check.pytest_command(Path("python"), 4, bucket="global")


def test_pytest_takes_the_order_flags_and_replays_an_order(tmp_path):
    """The plugin is a dev dependency, off unless asked for; the same seed gives the same order."""
    names = [f"test_{letter}" for letter in "abcdefgh"]
    (tmp_path / "test_order.py").write_text("".join(f"def {name}():\n    pass\n\n\n" for name in names))
    order = flaky_check.pytest_command(Path(sys.executable), 3)[1:]
    order = [flag for flag in order if flag not in ("-q", "-n", "1")] + ["-p", "no:xdist", "-v"]

    def ran(*flags: str) -> list[str]:
        run = [sys.executable, *flags, "test_order.py"]
        output = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
        return [line.split("::")[1].split()[0] for line in output.splitlines() if "::test_" in line]

    shuffled = ran(*order)
    assert sorted(shuffled) == names and ran(*order) == shuffled
    assert ran("-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-v") == names  # off unless asked for
