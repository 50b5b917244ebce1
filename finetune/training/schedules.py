"""Learning-rate schedules as pure functions of the optimizer step.

Each returns a multiplier of the peak learning rate, so a schedule can be tested or plotted
without an optimizer: `lr(step) = peak_lr * multiplier(step, total_steps, ...)`.
"""

from __future__ import annotations

import math
from typing import Callable


def slanted_triangular(step: int, total_steps: int, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """STLR (Howard & Ruder 2018, eq. 3): a short linear rise to the peak, then a long linear decay."""
    # 1. the step at which the LR stops increasing
    cut = max(1, math.floor(total_steps * cut_frac))
    # 2. p: the position on the triangle, 0 at both ends and 1 at the peak
    if step < cut:
        p = step / cut
    else:
        p = 1 - (step - cut) / max(1, total_steps - cut)
    p = max(0.0, p)
    # 3. the lowest LR is 1/ratio of the peak
    return (1 + p * (ratio - 1)) / ratio


def linear_warmup_decay(step: int, total_steps: int, warmup_fraction: float = 0.1) -> float:
    """BERT's schedule: linear warmup from 0 to the peak, then linear decay to 0."""
    warmup = math.floor(total_steps * warmup_fraction)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup))


def constant(step: int, total_steps: int) -> float:
    """No schedule: always the peak."""
    return 1.0


def make_schedule(config, total_steps: int) -> Callable[[int], float]:
    """The multiplier function of a recipe's `schedule` section, closed over the run's length."""
    if config.kind == "stlr":
        return lambda step: slanted_triangular(step, total_steps, config.cut_frac, config.ratio)
    if config.kind == "linear":
        return lambda step: linear_warmup_decay(step, total_steps, config.warmup_fraction)
    return lambda step: constant(step, total_steps)
