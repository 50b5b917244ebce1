"""The `intermediate` recipe: intermediate-task training (STILTs, Phang et al. 2018) as one run. Fine-tune on task A
(say MNLI or RTE), then on task B from that encoder with B's new head; and, to know what A bought, B from the same
starting checkpoint without A."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from finetune.recipes.base import RunRecipe, Seed
from finetune.recipes.finetune import FinetuneRecipe
from finetune.recipes.flow_sections import FLOW_SET_KEYS, flow_base, refuse_flow_keys, with_flow_seed

# Each stage's folder inside the flow's run_dir; a stage's checkpoint is FOLDER/checkpoint.
INTERMEDIATE_STAGE_FOLDERS = {"intermediate": "1-intermediate", "target": "2-target", "target_alone": "3-target-alone"}
INTERMEDIATE_UPSTREAM = {"target": "intermediate"}  # whose checkpoint a stage starts from
INTERMEDIATE_SECTIONS = ("intermediate", "target")  # the recipe's sections (target_alone is target, started elsewhere)
STAGE_DESCRIPTIONS = {  # fixed, so that a new top-level description does not stop --resume of a stage
    "intermediate": "intermediate stage 1: the intermediate task",
    "target": "intermediate stage 2: the target task from the intermediate task's encoder",
    "target_alone": "intermediate stage 3: the target task without the intermediate one (the comparison)",
}


class IntermediateRecipe(RunRecipe):
    """`finetune intermediate`: task A, then task B from A's encoder with a new head, and B without A to compare.

    The flow sets what wires the stages together (each section's stage, run_dir, description and overwrite, and the
    target's model.checkpoint), so a section that gives them is refused rather than silently ignored.
    """

    stage: Literal["intermediate"]
    seed: Seed = Field(0, description="the seed of every stage whose section gives none")
    intermediate: FinetuneRecipe = Field(
        description="stage 1, into RUN_DIR/1-intermediate: a finetune recipe without stage and run_dir, on the "
        "intermediate task (A) from its model.checkpoint; one run (no seeds or draws): the target starts from its "
        "checkpoint"
    )
    target: FinetuneRecipe = Field(
        description="stage 2, into RUN_DIR/2-target: a finetune recipe without stage, run_dir and model.checkpoint "
        "(stage 1's encoder, under a new head: model.new_head defaults to true) on the target task (B); seeds run "
        "B once per seed from the one intermediate checkpoint"
    )
    compare: bool = Field(
        True,
        description="also stage 3, into RUN_DIR/3-target-alone: the target section again from "
        "intermediate.model.checkpoint (B without A, the same seeds), and report.md compares the two",
    )

    @model_validator(mode="before")
    @classmethod
    def _wire_stages(cls, data: Any) -> Any:
        """Give each section what the flow decides for it, so that FinetuneRecipe validates it as written."""
        if not isinstance(data, dict):
            return data
        base = flow_base(data)
        seed = data.get("seed", 0)
        wired = dict(data)
        for section in INTERMEDIATE_SECTIONS:
            body = data.get(section)
            if not isinstance(body, dict):
                continue  # refused by its field's own validation
            model = body.get("model", {})
            upstream = "the intermediate stage's checkpoint (and, to compare, intermediate.model.checkpoint)"
            folder = base / INTERMEDIATE_STAGE_FOLDERS[section]
            refuse_flow_keys("intermediate", section, body, folder, upstream if section == "target" else None)
            body = {**body, "stage": "finetune", "run_dir": str(folder), "description": STAGE_DESCRIPTIONS[section]}
            body = with_flow_seed(body, seed)
            if section == "target" and isinstance(model, dict):
                stage_1 = base / INTERMEDIATE_STAGE_FOLDERS["intermediate"] / "checkpoint"
                model = {"new_head": True, **model, "checkpoint": str(stage_1)}
            wired[section] = {**body, "model": model}
        return wired

    @model_validator(mode="after")
    def _one_intermediate_checkpoint(self) -> IntermediateRecipe:
        for key in ("seeds", "draws"):
            if getattr(self.intermediate, key) is not None:
                raise ValueError(
                    f"intermediate.{key}: the target starts from one intermediate checkpoint; give "
                    "intermediate.seed (target.seeds runs the target once per seed)"
                )
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> dict[str, Any]:
        """The recipe without what the flow set, so that a saved flow recipe loads again."""
        data = handler(self)
        for section in INTERMEDIATE_SECTIONS:
            for key in FLOW_SET_KEYS:
                data[section].pop(key, None)
        data["target"]["model"].pop("checkpoint", None)
        return data

    def stage_recipes(self) -> dict[str, FinetuneRecipe | None]:
        """Section name -> the stage's recipe as the flow runs it (target_alone: None without compare)."""
        alone = None
        if self.compare:
            model = self.target.model.model_copy(update={"checkpoint": self.intermediate.model.checkpoint})
            run_dir = self.run_dir / INTERMEDIATE_STAGE_FOLDERS["target_alone"]
            alone = self.target.model_copy(
                update={"model": model, "run_dir": run_dir, "description": STAGE_DESCRIPTIONS["target_alone"]}
            )
        return {"intermediate": self.intermediate, "target": self.target, "target_alone": alone}
