"""Run the peer script unchanged, but stop it at a wall-clock budget and keep its trained model.

    python bench/peers/peer_budget.py --budget-seconds 300 --save-to DIR -- PEER.py --steps N [peer options]

The peer (../shared/bench/peers/hf_mlm_pretrain.py) is read-only and saves nothing, so this wrapper
patches `transformers.Trainer.train` before running it with `runpy`: the patched `train` adds a
callback that ends training once the budget is spent, calls the original, then saves the model to
DIR and writes DIR/budget.json (steps done, training seconds). The caller picks the peer's --steps
so that its linear LR decay completes inside the budget; the stop is only a safety net.
"""

from __future__ import annotations

import json
import time

import transformers
from transformers import TrainerCallback

from _hf_peer import run_unchanged, wrapper_parser


class StopAtBudget(TrainerCallback):
    """Ends training at the first optimizer step that finishes past the budget; records the time spent."""

    def __init__(self, budget_seconds: float):
        self.budget_seconds, self.start, self.elapsed, self.stopped_early = budget_seconds, None, 0.0, False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.elapsed = time.perf_counter() - self.start
        if self.elapsed >= self.budget_seconds and state.global_step < state.max_steps:
            control.should_training_stop = True
            self.stopped_early = True


def main() -> None:
    parser = wrapper_parser(__doc__, "folder for the trained model and budget.json")
    parser.add_argument("--budget-seconds", type=float, required=True, help="wall-clock training budget")
    arguments = parser.parse_args()
    budget = StopAtBudget(arguments.budget_seconds)
    original_train = transformers.Trainer.train

    def train_within_budget(trainer, *args, **kwargs):
        trainer.add_callback(budget)
        output = original_train(trainer, *args, **kwargs)
        trainer.save_model(str(arguments.save_to))
        record = {
            "steps": trainer.state.global_step,
            "max_steps": trainer.state.max_steps,
            "train_seconds": round(budget.elapsed, 1),
            "stopped_at_budget": budget.stopped_early,
        }
        (arguments.save_to / "budget.json").write_text(json.dumps(record))
        return output

    transformers.Trainer.train = train_within_budget
    run_unchanged(arguments.peer)


if __name__ == "__main__":
    main()
