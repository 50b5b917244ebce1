"""Finding checkpoints: local Hugging Face folders first, hub names for users with a network."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoTokenizer

from finetune.errors import UserError

_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_checkpoint(name: str, key: str = "model.checkpoint", marker_files: tuple[str, ...] = ("config.json",)) -> str:
    """A local model folder as is; a hub name (`org/model`) for transformers to fetch; anything else an error.

    A local folder must hold one of `marker_files` (a model's config.json, or a tokenizer's files).
    """
    path = Path(name)
    if path.is_dir():
        if not any((path / marker).is_file() for marker in marker_files):
            what = "a Hugging Face model folder" if marker_files == ("config.json",) else "a tokenizer folder"
            raise UserError(f"{key}: {path} has no {' or '.join(marker_files)} (not {what})")
        return str(path)
    if path.exists() or not _HUB_NAME.match(name):
        raise UserError(f"{key}: no such model folder: {name}")
    return name


def load_pretrained(loader, name: str, key: str, **kwargs):
    """Call a transformers `from_pretrained`, turning a failed download or bad folder into one line."""
    try:
        return loader(name, **kwargs)
    except OSError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{key}: cannot load '{name}': {first_line}") from None


def load_tokenizer(name: str, key: str = "model.checkpoint"):
    """The tokenizer saved with a checkpoint, or in a folder of its own."""
    source = resolve_checkpoint(name, key, marker_files=("tokenizer_config.json", "tokenizer.json", "config.json"))
    return load_pretrained(AutoTokenizer.from_pretrained, source, key)
