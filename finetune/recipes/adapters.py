"""`model.adapter`: train a LoRA adapter (through peft) on a frozen checkpoint instead of every weight of it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from finetune.recipes.base import Section

ADAPTER_HELP = (
    "train a LoRA adapter (peft) on the frozen checkpoint instead of all its weights: low-rank updates of "
    "the blocks' linear layers, the head trained fully; the checkpoint saved is the adapter (peft's format) and "
    "`finetune merge` makes a plain model of it; `lora` alone: the defaults; null: no adapter"
)


class AdapterConfig(Section):
    """A LoRA adapter (Hu et al. 2021): each adapted weight W becomes W + (alpha / rank) B A, only A and B trained."""

    kind: Literal["lora"] = Field(
        "lora",
        description="lora: a LoRA adapter, low-rank updates of linear layers (the one kind so far); `model.adapter: "
        "lora` alone: every key at its default",
    )
    rank: int = Field(8, gt=0, description="the rank r of B A (peft's r): the LoRA paper's 8 for GLUE")
    alpha: float = Field(
        16.0, gt=0, description="the update is scaled by alpha / rank (peft's lora_alpha); 2 x rank is common"
    )
    dropout: float = Field(
        0.1, ge=0, lt=1, description="dropout on the adapter's input (peft's lora_dropout); the LoRA paper's 0.1"
    )
    target_modules: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description="names (or name endings) of the linear layers to adapt, e.g. [query, value]; null: peft's "
        "choice for the family (bert: query, value; gpt2: c_attn; llama: q_proj, v_proj), or every linear layer "
        "of the blocks (peft's all-linear) for a family it has none for; the run prints which it chose",
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, data: Any) -> Any:
        """`adapter: lora` is short for `adapter: {kind: lora}` (every other key at its default)."""
        return {"kind": data} if isinstance(data, str) else data

    @field_validator("target_modules")
    @classmethod
    def _distinct(cls, names: list[str] | None) -> list[str] | None:
        repeated = sorted({name for name in names or [] if (names or []).count(name) > 1})
        if repeated:
            raise ValueError(f"'{repeated[0]}' is listed twice")
        return names
