"""Run `finetune pretrain` with a wall-clock stop, the same safety net the peer gets from peer_budget.py.

    python bench/ours_budget.py --budget-seconds 300 -- pretrain RECIPE.yaml key=value ...

The recipe has no time budget: the benchmark plans training.max_steps from the measured throughput so that the LR
schedule completes, and this wrapper only ends training after the step that crosses the budget, should the run be
slower than measured. The clock starts at the loop's first `finished` check, just before the first step.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time

from finetune.training.loop import TrainingLoop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-seconds", type=float, required=True, help="wall-clock training budget")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the arguments of `finetune`")
    arguments = parser.parse_args()
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    within_steps = TrainingLoop.finished.fget

    def finished(loop: TrainingLoop) -> bool:
        start = loop.__dict__.setdefault("budget_start", time.perf_counter())
        return within_steps(loop) or time.perf_counter() - start >= arguments.budget_seconds

    TrainingLoop.finished = property(finished)
    sys.argv = ["finetune", *command]
    runpy.run_module("finetune", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
