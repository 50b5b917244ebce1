"""The end of a training run: its wall time saved, its trackers closed, its plots drawn."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from finetune.console import console
from finetune.reporting.plots import write_plots_or_warn
from finetune.reporting.trackers import finish_trackers

TIMING_FILE = "timing.json"  # inside the run directory; metrics.jsonl records hold no wall-clock times
# FINETUNE_PLOTS=0 leaves the end-of-run plots out: about a second of matplotlib per run, which a sweep of many short
# runs (or the test suite, a few hundred of them) feels; `finetune plot RUN_DIR` draws them later from metrics.jsonl.
PLOTS_SWITCH = "FINETUNE_PLOTS"
PLOTS_OFF = ("0", "false", "no", "off")


def finish_run(accelerator, run_dir: Path, loop) -> None:
    """Called by a stage after its checkpoint is saved; nothing here can fail the run (plots only warn)."""
    finish_trackers(accelerator)
    if accelerator.is_main_process:
        # From the training loop's creation (setup and tokenising excluded) to now: training, evaluations, saving.
        timing = {"training_wall_time_s": round(time.perf_counter() - loop.started, 1), "steps": loop.step}
        (Path(run_dir) / TIMING_FILE).write_text(json.dumps(timing) + "\n", encoding="utf-8")
        if plots_wanted():
            write_plots_or_warn(Path(run_dir))
        else:
            switch = f"{PLOTS_SWITCH}={os.environ[PLOTS_SWITCH]}"
            console.print(
                f"plots not drawn ({switch}): `finetune plot {run_dir}` draws them", markup=False, soft_wrap=True
            )
    # Every process leaves together, so that none starts the next command (or its exit) while the main process still
    # writes plots and the model card. (The teardown abort once blamed on this was gloo's worker threads outliving
    # Python's shutdown: training/driver.py's leave_process_group.)
    accelerator.wait_for_everyone()


def plots_wanted() -> bool:
    """False when the environment turns the end-of-run plots off (FINETUNE_PLOTS=0, false, no or off)."""
    return os.environ.get(PLOTS_SWITCH, "1").strip().lower() not in PLOTS_OFF


def read_timing(run_dir: Path) -> dict[str, Any] | None:
    """The run's timing.json, or None for a run that has none (unfinished, or older than the file)."""
    path = Path(run_dir) / TIMING_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
