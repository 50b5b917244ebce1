"""The exceptions the CLI reports on one line, without a traceback, each with its exit code.

Two kinds of input errors, by who finds them: the recipe and stage layer raise `UserError` with a message that names
the recipe key or option to change; the layers below (data, glue, model loading) raise `InputError` with the facts
they know (which file, which line, which value) and no recipe key, since they cannot tell which setting handed them
the value. `recipe_key` is the boundary between the two: the caller that knows the key wraps the call in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class UserError(Exception):
    """A mistake in the user's input (recipe, file, task): reported without a traceback, exit code 2."""


class InputError(UserError):
    """Bad input found below the recipe layer, described by its facts: `source` (a file, folder or dataset), `line`
    (1-based, in `source`), `value` (what was refused) and `reason` (what is wrong with it).

    The message reads "SOURCE line LINE: REASON" (the parts known). It is a UserError, so that one no caller names
    is still reported as one everywhere a UserError is (the CLI's one line and exit code 2, `guarded_stage`'s
    clean-up, each `except UserError`): a file's own facts are often message enough.
    """

    def __init__(self, reason: str, source: str | Path | None = None, line: int | None = None, value: Any = None):
        self.reason, self.source, self.line, self.value = reason, source, line, value
        where = f"{source}" if source is not None else ""
        where += f" line {line}" if line is not None else ""
        super().__init__(f"{where}: {reason}" if where else reason)


class DataFileError(InputError):
    """A file or dataset of examples or text that cannot be read as one (not UTF-8, a bad row, no text)."""


class CheckpointError(InputError):
    """A model or tokenizer (a local folder or a hub name) that cannot be loaded as asked."""


@contextlib.contextmanager
def recipe_key(key: str, kind: type[InputError] = InputError) -> Iterator[None]:
    """Inside, an InputError becomes the UserError "KEY: its message": the caller, which knows which recipe key (or
    command-line option) handed the value down, names it. An error already named passes through as it is, so the
    innermost wrapper (the most precise key) wins.

    `kind`: only InputErrors of that class, where one call reads several settings (a classifier's backward
    checkpoint beside its forward one): the others go on to an outer wrapper.
    """
    try:
        yield
    except kind as error:
        raise UserError(f"{key}: {error}") from error


class RunFailed(Exception):
    """A run stopped on a problem it cannot train past (a non-finite loss, out of memory, a full disk): exit code 1.

    The message says what happened, at which step or path, and what to change; nothing incomplete is left
    looking like a finished run.
    """


class RunInterrupted(Exception):
    """Ctrl-C during training: a resumable checkpoint was saved at a step boundary (the CLI exits 130)."""

    def __init__(self, step: int, checkpoint: Path | None):
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint = step, checkpoint
