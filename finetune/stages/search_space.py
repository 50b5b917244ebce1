"""A search space file: recipe key -> how to draw its value, read and checked before any trial starts.

    training.lr: {low: 1.0e-5, high: 1.0e-3, log: true}   # a float range (log: drawn on a log scale)
    training.epochs: {low: 2, high: 4}                   # an int range (both ends ints; `step` optional)
    training.batch_size: {choices: [16, 32]}             # one of a list

Every key must be a key of the recipe's stage (`finetune recipes keys` lists them) and every end of a range and
every choice must be a value the recipe accepts there; the first problem is a one-line UserError naming the space
file and the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.errors import UserError
from finetune.recipes.loader import load_yaml_file, recipe_keys, suggested_key

RANGE_FIELDS, CHOICE_FIELDS = {"low", "high", "log", "step"}, {"choices"}


@dataclass(frozen=True)
class Dimension:
    """One key of the space: a range (`low`..`high`, ints when both ends are) or a list of `choices`."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def is_int(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    def contains(self, value: Any) -> bool:
        """Whether `value` (e.g. the recipe's own) is one this dimension can draw."""
        if self.choices is not None:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high and (not self.is_int or float(value).is_integer())

    def describe(self) -> str:
        if self.choices is not None:
            return "{" + ", ".join(map(str, self.choices)) + "}"
        return f"{self.low:g} .. {self.high:g}" + (" (log)" if self.log else "")


def yaml_value(value: Any) -> str:
    """`value` as an override's YAML text that reads back as the same value (1e-05 -> 1.0e-05: YAML 1.1 wants a
    dot in a float's mantissa, else it reads a string)."""
    if isinstance(value, float):
        text = repr(value)
        mantissa, exponent, power = text.partition("e")
        return f"{mantissa}.0e{power}" if exponent and "." not in mantissa else text
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value).lower() if isinstance(value, bool) else str(value)


def overrides_for(params: dict[str, Any]) -> list[str]:
    """A trial's drawn values as dotted key=value overrides."""
    return [f"{key}={yaml_value(value)}" for key, value in params.items()]


def read_space(path: Path, stage: str, check_value: Callable[[str], None]) -> list[Dimension]:
    """Read and check the space file `path` for a recipe of `stage`; `check_value(override)` loads the recipe with
    one `key=value` override and raises UserError when the recipe refuses it."""
    data = load_yaml_file(path, "space")
    if not isinstance(data, dict) or not data:
        raise UserError(
            f"space {path}: expected a mapping of recipe keys to ranges, e.g. training.lr: {{low: 1.0e-5, "
            "high: 1.0e-3, log: true}"
        )
    known = set(recipe_keys(stage))
    dimensions = []
    for key, spec in data.items():
        if key not in known:
            near = suggested_key(str(key), stage)
            hint = f" (did you mean {near}?)" if near else " (`finetune recipes keys` lists them)"
            raise UserError(f"space {path}: {key}: not a key of a {stage} recipe{hint}")
        dimension = _dimension(str(key), spec, path)
        for value in dimension.choices or (dimension.low, dimension.high):
            try:
                check_value(f"{key}={yaml_value(value)}")
            except UserError as error:
                raise UserError(f"space {path}: {key}: the recipe refuses {value!r} ({error})") from None
        dimensions.append(dimension)
    return dimensions


def _dimension(key: str, spec: Any, path: Path) -> Dimension:
    """One key's spec, checked: a range or a list of choices."""
    where = f"space {path}: {key}"
    if not isinstance(spec, dict) or not spec or not (set(spec) <= RANGE_FIELDS or set(spec) <= CHOICE_FIELDS):
        raise UserError(f"{where}: expected {{low: L, high: H}} (with log: true or step: S) or {{choices: [A, B]}}")
    if set(spec) == CHOICE_FIELDS:  # {choices: [...]}
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or len(set(map(repr, choices))) != len(choices):
            raise UserError(f"{where}: choices: expected a list of different values, e.g. [16, 32]")
        return Dimension(key, choices=tuple(_number_or_value(choice) for choice in choices))
    if "low" not in spec or "high" not in spec:
        raise UserError(f"{where}: a range needs both low and high")
    low, high, step = (_number(spec.get(name), f"{where}: {name}") for name in ("low", "high", "step"))
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{where}: log: expected true or false")
    if low is None or high is None or not low < high:
        raise UserError(f"{where}: expected low < high (got {low} and {high})")
    if log and (low <= 0 or step is not None):
        raise UserError(f"{where}: a log range needs low > 0 and no step")
    if step is not None and (step <= 0 or step > high - low):
        raise UserError(f"{where}: step: expected a value in (0, high - low]")
    if isinstance(low, int) != isinstance(high, int):  # 0 .. 0.3 means floats
        low, high = float(low), float(high)
    return Dimension(key, low=low, high=high, log=log, step=step)


def _number(value: Any, where: str) -> float | int | None:
    """A range's end or step: an int, a float, or a float the YAML reader left as text ('1e-5')."""
    if value is None:
        return None
    number = _number_or_value(value)
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        raise UserError(f"{where}: expected a number (got {value!r})")
    return number


def _number_or_value(value: Any) -> Any:
    """'1e-5' (YAML 1.1 reads a float without a dot as text) as the float it means; anything else as it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
