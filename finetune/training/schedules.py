"""Learning-rate schedules as pure functions of the optimizer step.

Each returns a multiplier of the peak learning rate, so a schedule can be tested or plotted
without an optimizer: `lr(step) = peak_lr * multiplier(step, total_steps, ...)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable


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


def _cosine(start: float, end: float, position: float) -> float:
    """Half a cosine from `start` (position 0) to `end` (position 1)."""
    return end + (start - end) / 2 * (1 + math.cos(math.pi * min(1.0, max(0.0, position))))


def _one_cycle_phase(step: int, total_steps: int, pct_start: float) -> tuple[bool, float]:
    """(rising, position within the phase) of `step` in a one-cycle run whose first `pct_start` rises."""
    rise = max(1, round(total_steps * pct_start))
    if step < rise:
        return True, step / rise
    return False, (step - rise) / max(1, total_steps - rise)


def one_cycle(step: int, total_steps: int, pct_start: float = 0.25, div: float = 25.0, final_div: float = 1e5) -> float:
    """fastai's `fit_one_cycle` LRs (Smith 2018): a cosine rise from peak/div to the peak over the first
    `pct_start` of the steps, then a cosine fall to peak/final_div at the end."""
    rising, position = _one_cycle_phase(step, total_steps, pct_start)
    if rising:
        return _cosine(1 / div, 1.0, position)
    return _cosine(1.0, 1 / final_div, position)


def one_cycle_momentum(
    step: int, total_steps: int, pct_start: float = 0.25, high: float = 0.95, low: float = 0.85
) -> float:
    """Adam's beta1 in fastai's one cycle: down from `high` to `low` while the LR rises, back up while it falls
    (a large LR with less momentum, then more momentum to settle)."""
    rising, position = _one_cycle_phase(step, total_steps, pct_start)
    return _cosine(high, low, position) if rising else _cosine(low, high, position)


def exponential_range(step: int, total_steps: int, ratio: float) -> float:
    """The LR range test's schedule (Smith 2017): from 1/ratio of the peak at the first step to the peak at the
    last, growing by the same factor every step."""
    return ratio ** (min(step, total_steps - 1) / max(1, total_steps - 1) - 1)


def constant(step: int, total_steps: int) -> float:
    """No schedule: always the peak."""
    return 1.0


def make_schedule(config, total_steps: int) -> Callable[[int], float]:
    """The multiplier function of a recipe's `schedule` section, closed over the run's length."""
    if config.kind == "stlr":
        return lambda step: slanted_triangular(step, total_steps, config.cut_frac, config.ratio)
    if config.kind == "linear":
        return lambda step: linear_warmup_decay(step, total_steps, config.warmup_fraction)
    if config.kind == "one_cycle":
        return lambda step: one_cycle(step, total_steps, config.pct_start, config.div, config.final_div)
    if config.kind == "range_test":
        return lambda step: exponential_range(step, total_steps, config.range_ratio)
    return lambda step: constant(step, total_steps)


def make_momentum_schedule(config, total_steps: int) -> Callable[[int], float] | None:
    """Adam's beta1 per step where the schedule cycles it (one_cycle with `momentum`); None: betas stay put."""
    if config.kind != "one_cycle" or config.momentum is None:
        return None
    high, low = config.momentum
    return lambda step: one_cycle_momentum(step, total_steps, config.pct_start, high, low)
