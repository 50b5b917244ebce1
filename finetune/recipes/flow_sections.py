"""What the flows of stages (`ulmfit`, `intermediate`) ask of their sections: each section is the body of a stage's
recipe, without the keys the flow wires itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FLOW_SET_KEYS = ("stage", "run_dir", "description", "overwrite")  # a section's keys that the flow sets itself


def refuse_flow_keys(flow: str, section: str, body: dict[str, Any], folder: Path, upstream: str | None = None) -> None:
    """A section may not set what the flow wires: one line naming the first such key and what the flow uses.
    `upstream`: what the flow starts this section's model from (its model.checkpoint is refused then)."""
    given = [key for key in FLOW_SET_KEYS if key in body]
    if given:
        key = given[0]
        why = {
            "stage": f"the {flow} flow knows each section's stage",
            "run_dir": f"the {flow} flow runs this stage in {folder}",
        }.get(key, f"only the {flow} recipe's own (top-level) {key} applies")
        raise ValueError(f"{section}.{key}: {why}; remove it")
    model = body.get("model")
    if upstream is not None and isinstance(model, dict) and "checkpoint" in model:
        raise ValueError(f"{section}.model.checkpoint: the {flow} flow starts this stage from {upstream}; remove it")


def flow_base(data: dict[str, Any]) -> Path:
    """The flow's run_dir, under which each stage gets its folder. An unusable run_dir is reported at the top level;
    a placeholder keeps the sections from repeating it."""
    run_dir = data.get("run_dir")
    return Path(run_dir).expanduser() if isinstance(run_dir, str) and run_dir.strip() else Path("run_dir")


def with_flow_seed(body: dict[str, Any], seed: Any) -> dict[str, Any]:
    """A section with the flow's top-level seed unless it gives its own; an invalid top-level seed is reported once,
    at the top level, and not copied."""
    valid = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32
    return {**body, "seed": seed} if "seed" not in body and valid else body
