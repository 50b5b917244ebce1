"""Every key of a recipe type with its type, default and help: what `finetune recipes --keys` prints."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

UNIONS = (Union, UnionType)  # Union[A, B] and Optional[A], and A | B (what the recipes write)


def describe_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every key of a recipe type, for `finetune recipes --keys`."""
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        section = annotation
        if get_origin(section) in UNIONS and len(get_args(section)) == 2 and type(None) in get_args(section):
            section = next(argument for argument in get_args(section) if argument is not type(None))
        if isinstance(section, type) and issubclass(section, BaseModel):
            rows += describe_keys(section, f"{prefix}{name}.")
            continue
        if _section_variants(section):
            rows += _describe_variants(_section_variants(section), f"{prefix}{name}.")
            continue
        if field.is_required():
            default = "(required)"
        elif field.default_factory is not None:
            default = repr(field.get_default(call_default_factory=True))
        else:
            default = repr(field.default)
        rows.append((f"{prefix}{name}", type_label(annotation), default, field.description or ""))
    return rows


def _section_variants(annotation: Any) -> list[type[BaseModel]]:
    """The section types of a field that is one of several sections (the model families), else []."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) not in UNIONS:
        return []
    members = [get_args(member)[0] if get_origin(member) is Annotated else member for member in get_args(annotation)]
    return members if all(isinstance(member, type) and issubclass(member, BaseModel) for member in members) else []


def _describe_variants(variants: list[type[BaseModel]], prefix: str) -> list[tuple[str, str, str, str]]:
    """Keys of alternative sections (one per model family, or per task kind: their `family` or `kind` tells them
    apart), each marked with the families or kinds it applies to."""
    rows: dict[tuple[str, str], tuple[str, str, str, str]] = {}  # (key, meaning) -> row: same key, other meaning
    families: dict[tuple[str, str], list[str]] = {}
    tag = next(name for name in ("family", "kind") if name in variants[0].model_fields)
    for variant in variants:
        family = type_label(variant.model_fields[tag].annotation)
        for row in describe_keys(variant, prefix):
            identity = (row[0], "" if row[0] == f"{prefix}{tag}" else row[3])
            rows.setdefault(identity, row)
            families.setdefault(identity, []).append(family)
    described = []
    for identity, (key, label, default, meaning) in rows.items():
        if key == f"{prefix}{tag}":
            described.append((key, "|".join(families[identity]), default, meaning))
        else:
            described.append((key, label, default, f"({', '.join(families[identity])}) {meaning}"))
    return described


def type_label(annotation: Any) -> str:
    """A short human name for a field's type: `int`, `stlr|linear|constant`, `list[Path]`, `float or null`."""
    origin, arguments = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "|".join(str(argument) for argument in arguments)
    if origin is Annotated:
        return type_label(arguments[0])
    if origin in UNIONS:
        labels = [type_label(argument) for argument in arguments if argument is not type(None)]
        return " or ".join(labels) + (" or null" if type(None) in arguments else "")
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_label(a) for a in arguments)}]"
    return getattr(annotation, "__name__", str(annotation))
