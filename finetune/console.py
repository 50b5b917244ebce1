"""The console: one rich Console for messages, progress bars for long phases, and the one filter of library chatter."""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)
_live: PhaseProgress | None = None  # the progress display on screen now (rich allows one at a time)
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
_parallelism_turned_off = False  # whether quiet_library_chatter (not the user) turned the tokenizers' threads off


class PhaseProgress(Progress):
    """A Progress that phases started while it is shown (an evaluation during an epoch) add their bars to."""

    def __enter__(self) -> PhaseProgress:
        global _live
        super().__enter__()
        if _live is None:
            _live = self
        return self

    def __exit__(self, *exception) -> None:
        global _live
        if _live is self:
            _live = None
        super().__exit__(*exception)


def progress_bar(enabled: bool = True, transient: bool = False) -> Progress:
    """A progress bar with a free-text field for loss, lr and throughput; disabled off the main process."""
    return PhaseProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        disable=not enabled,
        transient=transient,
    )


class Advance(Protocol):
    """What `phase_bar` yields: `advance(count=1)` moves its bar on by `count` steps."""

    def __call__(self, count: int = 1) -> None: ...


@contextmanager
def phase_bar(description: str, total: int | None, enabled: bool = True) -> Iterator[Advance]:
    """A bar for a short phase (an evaluation), gone when it ends; yields `advance(count=1)`.

    Started while another bar is shown (a periodic evaluation inside a training epoch), it becomes a
    second line of that display instead of a second display, which rich refuses.
    """
    host = _live
    if host is not None and enabled:
        task = host.add_task(description, total=total, status="")

        def advance_shared(count: int = 1) -> None:
            host.advance(task, count)

        try:
            yield advance_shared
        finally:
            host.remove_task(task)
        return
    # Quiet: not the main process; not a terminal (a log file): a bar that vanishes leaves only a blank line. A
    # notebook is no terminal, but rich draws its bars there (as widgets).
    shown = enabled and not console.quiet and (console.is_terminal or console.is_jupyter)
    with progress_bar(shown, transient=True) as progress:
        task = progress.add_task(description, total=total, status="")

        def advance(count: int = 1) -> None:
            progress.advance(task, count)

        yield advance


@contextmanager
def silenced() -> Iterator[None]:
    """No console messages inside the block (a call repeated many times, whose notes would repeat with it)."""
    was = console.quiet
    console.quiet = True
    try:
        yield
    finally:
        console.quiet = was


@contextmanager
def parallel_tokenizing() -> Iterator[None]:
    """The fast tokenizers' batch encoding on every core (Rust threads) inside the block, off again after it.

    `quiet_library_chatter` turns the library's threads off for the process, because DataLoader workers are
    forked later and a child forked after the threads ran must not use them (the library would warn, then turn
    them off in the child itself). Tokenising a corpus happens before any worker is forked, in one thread of
    ours, so the threads are safe there; restoring "false" at the end keeps every later fork quiet and
    single-threaded. A value the user set (on or off) is left alone.
    """
    if not _parallelism_turned_off or os.environ.get(TOKENIZERS_PARALLELISM) != "false":
        yield
        return
    os.environ[TOKENIZERS_PARALLELISM] = "true"  # read by the library at every batch call
    try:
        yield
    finally:
        os.environ[TOKENIZERS_PARALLELISM] = "false"


# ---------------------------------------------------------------------------------------------
# Library chatter: what transformers, accelerate and torch print that is noise in this toolkit's flows
# ---------------------------------------------------------------------------------------------


# Weights of a task head or of a language-model head: new (or left behind) by design when fine-tuning.
_HEAD_KEY = re.compile(r"^(\w+\.)?(classifier|score|pre_classifier|pooler|cls|lm_head|decoder)(\.|$)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXPECTED_STATUSES = {"MISSING", "UNEXPECTED", "MISMATCH"}
# Pretraining tokenises whole documents and packs them into blocks; task examples are truncated to task.max_length.
_LONG_SEQUENCE = "Token indices sequence length is longer than the specified maximum"


class LibraryNoise(logging.Filter):
    """Drops the transformers warnings that are expected in this toolkit's flows, and only those.

    - the load report ("Some weights ... newly initialized") when it lists head weights only: a fresh
      classification head on a pretrained backbone is what fine-tuning means, and a pretraining head
      (masked-LM `cls.*`, `lm_head`, the LSTM decoder) is left behind on purpose. A report naming any
      backbone weight still comes through: that is a real problem;
    - "Token indices sequence length is longer than ...": no sequence reaches the model untruncated.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_LONG_SEQUENCE):
            return False
        if "LOAD REPORT" not in message:
            return True
        rows = [[cell.strip() for cell in _ANSI.sub("", line).split("|")] for line in message.splitlines()]
        reported = [row for row in rows if len(row) >= 2 and row[1] in _EXPECTED_STATUSES | {"CONVERSION"}]
        return not reported or not all(row[1] in _EXPECTED_STATUSES and _HEAD_KEY.match(row[0]) for row in reported)


_LIBRARY_NOISE = LibraryNoise()


def quiet_library_chatter() -> None:
    """Silence, once and only here, the library messages that do not concern a user of this toolkit."""
    # The tokenizers library warns at every fork after it ran (DataLoader workers); our workers never tokenise
    # (a streamed corpus's do, one document batch at a time). `parallel_tokenizing` turns it on where it is safe.
    global _parallelism_turned_off
    if TOKENIZERS_PARALLELISM not in os.environ:
        os.environ[TOKENIZERS_PARALLELISM] = "false"
        _parallelism_turned_off = True
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Loading weights" bars for checkpoints that load in a blink
    for name in ("transformers.modeling_utils", "transformers.tokenization_utils_base"):  # where those are logged
        transformers_logging.get_logger(name).addFilter(_LIBRARY_NOISE)
    logging.getLogger("accelerate").setLevel(logging.ERROR)  # notes on its defaults (e.g. the CPU backend)
    # Deprecation notices of the libraries (this toolkit raises none): nothing a recipe can change.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TRANSFORMERS_CACHE.*")
