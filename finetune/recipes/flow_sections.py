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
