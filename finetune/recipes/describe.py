"""Every key of a recipe type with its type, default and help: what `finetune recipes --keys` prints."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

UNIONS = (Union, UnionType)  # Union[A, B] and Optional[A], and A | B (what the recipes write)


class KeyField(NamedTuple):
    """One dotted key of a recipe type, its pydantic field, and the section variants it belongs to: ((dotted tag key,
    tag value), ...), e.g. (("model.family", "awd_lstm"),) for a key of the awd_lstm model section only."""

    key: str
    field: FieldInfo
    variant: tuple[tuple[str, str], ...]


def key_fields(model: type[BaseModel], prefix: str = "", variant: tuple[tuple[str, str], ...] = ()) -> list[KeyField]:
    """Every leaf key of a recipe type with its field: sections are walked into, a section that is one of several
    (model family, task kind) once per variant. `describe_keys` and the recipe tests read the keys from here."""
    fields = []
    for name, field in model.model_fields.items():
        section = field.annotation
        if get_origin(section) in UNIONS and len(get_args(section)) == 2 and type(None) in get_args(section):
            section = next(argument for argument in get_args(section) if argument is not type(None))
        if isinstance(section, type) and issubclass(section, BaseModel):
            fields += key_fields(section, f"{prefix}{name}.", variant)
            continue
        variants = _section_variants(section)
        if variants:
            tag = next(name for name in ("family", "kind") if name in variants[0].model_fields)
            for member in variants:
                value = type_label(member.model_fields[tag].annotation)
                fields += key_fields(member, f"{prefix}{name}.", (*variant, (f"{prefix}{name}.{tag}", value)))
            continue
        fields.append(KeyField(f"{prefix}{name}", field, variant))
    return fields


def describe_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every key of a recipe type, for `finetune recipes --keys`.

    Keys of alternative sections (one per model family, or per task kind) are listed once with the families or
    kinds they apply to; the same key with another meaning in other variants is listed again."""
    rows: dict[tuple[str, str], tuple[str, str, str, str]] = {}  # (key, meaning) -> row
    families: dict[tuple[str, str], list[str]] = {}
    tags: dict[tuple[str, str], list[str]] = {}  # a family or kind key: each variant's description of its own value
    for key, field, variant in key_fields(model, prefix):
        is_tag = bool(variant) and key == variant[-1][0]
        identity = (key, "" if is_tag or not variant else field.description or "")
        rows.setdefault(identity, (key, type_label(field.annotation), _default(field), field.description or ""))
        if is_tag:
            tags.setdefault(identity, []).append(field.description or "")
        if variant:
            families.setdefault(identity, []).append(variant[-1][1])
    described = []
    for identity, (key, label, default, meaning) in rows.items():
        if identity in tags:  # each section says what its own family or kind is: "bert: masked LM; gpt2: ..."
            meanings = "; ".join(dict.fromkeys(meaning for meaning in tags[identity] if meaning))
            described.append((key, "|".join(families[identity]), default, meanings))
        elif identity in families:
            described.append((key, label, default, f"({', '.join(families[identity])}) {meaning}"))
        else:
            described.append((key, label, default, meaning))
    return described


def _default(field: FieldInfo) -> str:
    """A field's default as `recipes --keys` shows it."""
    if field.is_required():
        return "(required)"
    if field.default_factory is not None:
        return repr(field.get_default(call_default_factory=True))
    return repr(field.default)


def _section_variants(annotation: Any) -> list[type[BaseModel]]:
    """The section types of a field that is one of several sections (the model families), else []."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) not in UNIONS:
        return []
    members = [get_args(member)[0] if get_origin(member) is Annotated else member for member in get_args(annotation)]
    return members if all(isinstance(member, type) and issubclass(member, BaseModel) for member in members) else []


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
