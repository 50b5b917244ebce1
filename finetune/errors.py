"""The exceptions the CLI reports on one line, without a traceback, each with its exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


class UserError(Exception):
    """A mistake in the user's input (recipe, file, task): reported without a traceback, exit code 2."""


class RunFailed(Exception):
    """A run stopped on a problem it cannot train past (a non-finite loss, out of memory, a full disk): exit code 1.

    The message says what happened, at which step or path, and what to change; nothing incomplete is left
    looking like a finished run.
    """


class RunInterrupted(Exception):
    """Ctrl-C during training: a resumable checkpoint was saved at a step boundary (the CLI exits 130)."""

    def __init__(self, step: int, checkpoint: Optional[Path]):
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint = step, checkpoint
