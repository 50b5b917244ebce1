"""Bugs found while type-checking finetune/models and finetune/recipes (mypy-d)."""

from __future__ import annotations

from finetune.recipes import PretrainRecipe
from finetune.recipes.describe import describe_keys, type_label


def test_optional_keys_are_described_as_their_type_or_null():
    # `X | None` (types.UnionType), as the recipes annotate optional keys, reads as Optional[X] did
    assert type_label(int | None) == "int or null"
    assert type_label(int | str) == "int or str"


def test_an_optional_section_lists_its_keys():
    keys = {row[0]: row for row in describe_keys(PretrainRecipe)}
    assert "masking.probability" in keys and "masking" not in keys
    assert keys["model.intermediate"][1] == "int or null"
