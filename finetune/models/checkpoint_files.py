"""Whether a checkpoint's files are whole, checked before anything reads them: a copy cut short, a disk that filled up
or a file edited by hand otherwise fails deep inside safetensors, torch or json with a traceback, or (accelerate's
random states) is skipped without a word. Each file is checked by its kind, cheaply, without loading it:

- `.safetensors`: the header parses and its tensors' extent is the file's size (safetensors' own check);
- `.json`: the text parses as JSON;
- `.bin`, `.pkl`, `.pt` (torch.save's zip archives: optimizer and random states): the zip directory at the end of
  the file reads, which a cut copy has lost (torch's older pickle format is left alone).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from safetensors import SafetensorError, safe_open

from finetune.errors import CheckpointError

TORCH_ARCHIVES = {".bin", ".pkl", ".pt"}


def file_fault(path: Path) -> str | None:
    """What is wrong with one checkpoint file (None: whole, or a kind this module does not check)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            with safe_open(str(path), framework="pt"):  # reads and checks the header against the file's size
                pass
        elif suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif suffix in TORCH_ARCHIVES:
            return _torch_file_fault(path)
    except SafetensorError as error:
        return f"not a complete safetensors file ({str(error).removeprefix('Error while deserializing header: ')})"
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"not valid JSON ({error.msg if isinstance(error, json.JSONDecodeError) else 'not UTF-8'})"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    return None


def _torch_file_fault(path: Path) -> str | None:
    """torch.save writes zip archives ("PK..."): a cut one has lost the directory at its end. Files of torch's
    older pickle format (some hub checkpoints' pytorch_model.bin) cannot be checked without loading them."""
    with open(path, "rb") as handle:
        start = handle.read(2)
    if not start:
        return "an empty file"
    if start == b"PK" and not zipfile.is_zipfile(path):
        return "not a complete torch file (its zip directory is missing: the file was cut short)"
    return None


def check_checkpoint_files(folder: str | Path, recursive: bool = False) -> None:
    """Raise a CheckpointError naming the first broken file of a checkpoint folder (`recursive`: its subfolders too,
    e.g. a periodic checkpoint's training_state/)."""
    folder = Path(folder)
    paths = folder.rglob("*") if recursive else folder.iterdir()
    for path in sorted(path for path in paths if path.is_file()):
        fault = file_fault(path)
        if fault is not None:
            raise CheckpointError(fault, source=path)
