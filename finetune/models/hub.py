"""Finding checkpoints: local Hugging Face folders first, hub names for users with a network."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoTokenizer

from finetune.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_checkpoint(name: str, key: str = "model.checkpoint", marker_files: tuple[str, ...] = ("config.json",)) -> str:
    """A local model folder as is; a hub name (`org/model`) for transformers to fetch; anything else an error.

    A local folder must hold one of `marker_files` (a model's config.json, or a tokenizer's files).
    """
    path = Path(name)
    if path.is_dir():
        if not any((path / marker).is_file() for marker in marker_files):
            if marker_files == TOKENIZER_FILES:
                raise UserError(f"{key}: {path} holds no tokenizer (none of {', '.join(marker_files)})")
            raise UserError(f"{key}: {path} has no {' or '.join(marker_files)} (not a Hugging Face model folder)")
        return str(path)
    if path.exists() or not _HUB_NAME.match(name):
        raise UserError(f"{key}: no such model folder: {name}")
    return name


def load_pretrained(loader, name: str, key: str, trust_remote_code: bool = False, **kwargs):
    """Call a transformers `from_pretrained`, turning a failed download or bad folder into one line.

    Every load in the package goes through here. Python code shipped with a checkpoint (its config's
    `auto_map`) runs only when a recipe sets `trust_remote_code` itself; passing False explicitly also keeps
    transformers from asking on the terminal.
    """
    try:
        return loader(name, trust_remote_code=trust_remote_code, **kwargs)
    except OSError as error:
        raise UserError(f"{key}: cannot load '{name}': {_first_line(error)}") from None
    except ValueError as error:
        if "trust_remote_code" in str(error):
            raise UserError(f"{key}: '{name}' ships Python code of its own, which runs only with "
                            "trust_remote_code: true in the recipe (set it only for code you have read)") from None
        if "does not recognize this architecture" in str(error) or "Unrecognized model in" in str(error):
            raise UserError(f"{key}: '{name}' is no model family transformers knows (config.json: model_type "
                            "missing or unknown)") from None
        if "Couldn't instantiate the backend tokenizer" in str(error):
            raise UserError(f"{key}: '{name}' has no tokenizer transformers can read (tokenizer.json, or the "
                            "vocabulary files of its model family)") from None
        if "Unrecognized configuration class" in str(error):
            raise  # a known family without this kind of head: the caller says which (heads.load_classifier)
        raise UserError(f"{key}: cannot load '{name}': {_first_line(error)}") from None  # e.g. no tokenizer files


def _first_line(error: Exception) -> str:
    """The first line of an exception's message (or its type)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def load_tokenizer(name: str, key: str = "model.checkpoint", trust_remote_code: bool = False):
    """The tokenizer saved with a checkpoint, or in a folder of its own."""
    # A folder without any of these would give an empty tokenizer (transformers builds one from config.json alone).
    source = resolve_checkpoint(name, key, marker_files=TOKENIZER_FILES)
    return load_pretrained(AutoTokenizer.from_pretrained, source, key, trust_remote_code)
