"""The end of a training run: its wall time saved, its trackers closed, its plots drawn."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from finetune.reporting.plots import write_plots_or_warn
from finetune.reporting.trackers import finish_trackers

TIMING_FILE = "timing.json"  # inside the run directory; metrics.jsonl records hold no wall-clock times


def finish_run(accelerator, run_dir: Path, loop) -> None:
    """Called by a stage after its checkpoint is saved; nothing here can fail the run (plots only warn)."""
    finish_trackers(accelerator)
    if accelerator.is_main_process:
        # From the training loop's creation (setup and tokenising excluded) to now: training, evaluations, saving.
        timing = {"training_wall_time_s": round(time.perf_counter() - loop.started, 1), "steps": loop.step}
        (Path(run_dir) / TIMING_FILE).write_text(json.dumps(timing) + "\n", encoding="utf-8")
        write_plots_or_warn(Path(run_dir))
    # Every process leaves together, so that none starts the next command (or its exit) while the main process still
    # writes plots and the model card. (The teardown abort once blamed on this was gloo's worker threads outliving
    # Python's shutdown: training/driver.py's leave_process_group.)
    accelerator.wait_for_everyone()


def read_timing(run_dir: Path) -> dict[str, Any] | None:
    """The run's timing.json, or None for a run that has none (unfinished, or older than the file)."""
    path = Path(run_dir) / TIMING_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
