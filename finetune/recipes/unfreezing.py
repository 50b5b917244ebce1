"""The `unfreezing` section of a fine-tuning run: gradual unfreezing, per epoch or every N optimizer steps."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from finetune.recipes.base import Section

# The techniques left open (null) are decided by the backbone when the run starts (training/techniques.py): what this
# project measured best for an AWD-LSTM (ULMFiT's) differs from what it measured best for a pretrained transformer.
BY_BACKBONE = "null: by the backbone at run start, "


class UnfreezingConfig(Section):
    """Gradual unfreezing: start with the top groups trainable and thaw more each epoch (or every N steps)."""

    mode: Literal["gradual", "none"] | None = Field(
        None,
        description="none: every group trainable from the start; " + BY_BACKBONE + "gradual when the section "
        "changes a key of gradual unfreezing, else AWD-LSTM gradual (ULMFiT's), transformers none",
    )
    initial_groups: int = Field(1, gt=0, description="groups trainable at the start (the first epoch), from the top")
    # None only with every_steps/every_fraction: per-epoch unfreezing fills in 1, so the saved recipe (which a
    # --resume reloads) shows the value used and never holds a groups_per_epoch beside every_steps.
    groups_per_epoch: int | None = Field(
        None,
        gt=0,
        description="groups thawed at the start of each later epoch; null: 1 (none with every_steps or every_fraction)",
    )
    schedule: list[int] | None = Field(
        None,
        min_length=1,
        description="gradual: trainable groups (from the top) per epoch, e.g. [1, 2, 3]; the "
        "last entry holds for later epochs; replaces initial_groups/groups_per_epoch",
    )
    # Step-wise unfreezing: a run of one or two epochs (most transformer fine-tuning) has too few epoch
    # boundaries to thaw a deep model by, and a fraction says "all thawed by 30% of training" without the step count.
    every_steps: int | None = Field(
        None,
        gt=0,
        description="gradual: thaw one more group (from the top, starting from initial_groups) every N "
        "optimizer steps, instead of per epoch",
    )
    every_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="gradual: thaw one more group every this fraction of the run's optimizer "
        "steps (rounded, at least 1 step), instead of per epoch; e.g. 0.1 with 4 groups: all trainable by 30%",
    )

    @model_validator(mode="after")
    def _schedule_grows(self) -> UnfreezingConfig:
        if self.schedule is not None:
            if any(count <= 0 for count in self.schedule):
                raise ValueError("unfreezing.schedule entries must be positive group counts")
            if any(later < earlier for earlier, later in zip(self.schedule, self.schedule[1:])):
                raise ValueError(f"unfreezing.schedule {self.schedule} refreezes groups: counts must not decrease")
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_group_per_epoch_by_default(cls, data: Any) -> Any:
        """groups_per_epoch is 1 unless the thawing goes by steps (see the field's comment)."""
        if (
            isinstance(data, dict)
            and data.get("groups_per_epoch") is None
            and data.get("every_steps") is None
            and data.get("every_fraction") is None
        ):
            return {**data, "groups_per_epoch": 1}
        return data

    @model_validator(mode="after")
    def _one_pace(self) -> UnfreezingConfig:
        """One way to pace the thawing: per epoch (groups_per_epoch or schedule), every_steps or every_fraction."""
        stepwise = [key for key in ("every_steps", "every_fraction") if getattr(self, key) is not None]
        paces = stepwise + (["schedule"] if self.schedule is not None else [])
        if len(paces) > 1:
            raise ValueError(f"unfreezing.{paces[0]} and unfreezing.{paces[1]} both set the pace of thawing; keep one")
        if stepwise and self.mode == "none":
            raise ValueError(f"unfreezing.{stepwise[0]} thaws gradually; it needs mode gradual, not none")
        if stepwise and self.groups_per_epoch is not None:
            raise ValueError(
                f"unfreezing.groups_per_epoch thaws per epoch, unfreezing.{stepwise[0]} by steps; "
                "remove groups_per_epoch (or set it to null)"
            )
        return self
