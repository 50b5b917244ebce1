"""A lock file that keeps two runs out of one run directory at the same time.

RUN_DIR/.finetune-lock holds the owner's pid, host and process start time. It is created with
O_EXCL, so of two runs racing for a folder exactly one gets it; the other stops before touching
anything. A run killed with SIGKILL cannot remove its lock: a lock whose process no longer runs
(on this host, checked by pid and start time, so a reused pid is not mistaken for the owner) is
stale and taken over. A lock written on another host cannot be checked and is never taken over.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
from pathlib import Path

from finetune.errors import UserError

LOCK_FILE = ".finetune-lock"

_held: set[Path] = set()  # run directories whose lock this process holds


def _process_start_time(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux), None where unknown or not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the command name in parentheses may hold spaces


def _this_process() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "start_time": _process_start_time(os.getpid())}


def lock_owner(run_dir: Path) -> dict | None:
    """The lock's owner if a live process (not this one) holds `run_dir`, else None (no lock, ours, or stale)."""
    try:
        owner = json.loads((Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8"))
        pid = int(owner["pid"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        # Being written this very moment (created, not yet filled) by another run, or damaged: not ours to take.
        return {"pid": "?", "host": "?"}
    me = _this_process()
    if owner.get("host") != me["host"]:
        return owner  # cannot be checked from here
    if pid == me["pid"]:
        return None
    running = _process_start_time(pid)
    if running is None and not Path("/proc").is_dir():  # no /proc (macOS): ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
            return owner
        except ProcessLookupError:
            return None
        except PermissionError:
            return owner
    if running is None or (owner.get("start_time") is not None and owner["start_time"] != running):
        return None  # that process ended (killed?): the lock is stale
    return owner


def in_use_error(run_dir: Path, owner: dict) -> UserError:
    return UserError(
        f"run_dir {run_dir} is in use by another run (process {owner.get('pid')} on "
        f"{owner.get('host')}); wait for it to end or choose another run_dir (if no run is using it, "
        f"delete {Path(run_dir) / LOCK_FILE})"
    )


def check_not_locked(run_dir: Path) -> None:
    """Raise UserError if another live run holds `run_dir`."""
    owner = lock_owner(run_dir)
    if owner is not None:
        raise in_use_error(run_dir, owner)


def acquire(run_dir: Path) -> None:
    """Take `run_dir`'s lock (the folder must exist); raise UserError if another live run holds it."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    for _ in range(2):  # the second try follows the removal of a stale lock
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = lock_owner(run_dir)
            if owner is not None:
                raise in_use_error(run_dir, owner) from None
            path.unlink(missing_ok=True)  # stale, or already ours
            continue
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(_this_process(), handle)
        _held.add(run_dir)
        return
    raise in_use_error(run_dir, {"pid": "?", "host": "?"})


def release(run_dir: Path) -> None:
    """Remove the lock of `run_dir` if this process holds it."""
    run_dir = Path(run_dir)
    if run_dir in _held:
        _held.discard(run_dir)
        if lock_owner(run_dir) is None:  # still ours (nobody took it over)
            (run_dir / LOCK_FILE).unlink(missing_ok=True)


def release_all() -> None:
    """Release every lock this process holds (the end of a command, or of the interpreter)."""
    for run_dir in list(_held):
        release(run_dir)


def held_locks() -> list[Path]:
    """The run directories this process holds, in no particular order."""
    return list(_held)


atexit.register(release_all)
