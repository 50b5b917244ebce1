"""Finding checkpoints: local Hugging Face folders first, hub names for users with a network."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from transformers import CONFIG_MAPPING, AutoTokenizer, PreTrainedTokenizerBase

from finetune.errors import CheckpointError
from finetune.models.checkpoint_files import check_checkpoint_files, file_fault
from finetune.recipes.loader import HUB_NAME, missing_model_folder

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
CONFIG_FILE = "config.json"
WEIGHT_FILES = "model*.safetensors"  # model.safetensors, or the shards model-00001-of-00002.safetensors, ...


def resolve_checkpoint(name: str, *, marker_files: tuple[str, ...] = ("config.json",)) -> str:
    """A local model folder as is; a hub name (`org/model`) for transformers to fetch; anything else a
    CheckpointError (which recipe key or option gave `name` is the caller's to say: `recipe_key`).

    A local folder must hold one of `marker_files` (a model's config.json, or a tokenizer's files).
    """
    path = Path(name)
    if path.is_dir():
        if not any((path / marker).is_file() for marker in marker_files):
            if marker_files == TOKENIZER_FILES:
                raise CheckpointError(f"{path} holds no tokenizer (none of {', '.join(marker_files)})", value=path)
            raise CheckpointError(
                f"{path} has no {' or '.join(marker_files)} (not a Hugging Face model folder)", value=path
            )
        if (path / CONFIG_FILE).is_file():  # tokenizers read it too
            check_config_file(path / CONFIG_FILE)
        check_weight_files(path)
        check_checkpoint_files(path)  # a cut tokenizer, adapter or other file: one line naming it too
        return str(path)
    if missing_model_folder(name):
        raise CheckpointError(f"no such model folder: {name}", value=name)
    return name


def check_config_file(path: Path) -> None:
    """A checkpoint's config.json must be one JSON object: transformers meets anything else with a traceback."""
    try:
        text = path.read_text(encoding="utf-8")
        config = json.loads(text)
    except UnicodeDecodeError:
        raise CheckpointError("not UTF-8 text", source=path) from None
    except json.JSONDecodeError as error:
        raise CheckpointError(f"not valid JSON ({error.msg})", source=path, line=error.lineno) from None
    if not isinstance(config, dict):
        line = text[: len(text) - len(text.lstrip())].count("\n") + 1  # where the top-level value starts
        raise CheckpointError(
            f"expected a JSON object, found {type(config).__name__}", source=path, line=line, value=config
        )


def check_weight_files(folder: Path) -> None:
    """Every weight file of a local checkpoint must be a whole safetensors file (a cut copy fails deep in torch)."""
    for path in sorted(folder.glob(WEIGHT_FILES)):
        fault = file_fault(path)
        if fault is not None:
            raise CheckpointError(f"{fault}; copy or save it again", source=path)


def load_model_folder(
    model_class, name: str, *, trust_remote_code: bool = False, label_counts: tuple[int, int] | None = None, **kwargs
):
    """`model_class.from_pretrained` through `load_pretrained`, refusing weights of other shapes than config.json's.

    transformers would fail with a traceback, or re-initialise those tensors when asked to ignore them.
    `label_counts`: (stored, new) outputs of a warm-started classifier: tensors whose shapes differ only there
    are its output layer, renewed for the new labels. Whole weights only: models/loading.py's `load_model` also
    reads LoRA adapter folders, and is what the package calls.
    """
    if Path(name).is_dir():
        check_weight_files(Path(name))
    with _held_load_report() as report:
        model, loading = load_pretrained(
            model_class.from_pretrained,
            name,
            trust_remote_code=trust_remote_code,
            ignore_mismatched_sizes=True,
            output_loading_info=True,
            # transformers >= 5.2x swaps layers for kernels fetched from the Hub on model.train()/eval() unless told
            # not to: code downloaded mid-run, and a failure on a GPU machine without network (seen on an H200)
            use_kernels=False,
            **kwargs,
        )
        position = {tensor: index for index, tensor in enumerate(model.state_dict())}
        mismatched = sorted(
            (position.get(tensor, len(position)), tensor, list(stored), list(expected))
            for tensor, stored, expected in loading["mismatched_keys"]
            if not _new_output_size(stored, expected, label_counts)
        )
        if mismatched:
            report.discard()  # the line below says what the report's table would
            _, tensor, stored, expected = mismatched[0]
            more = f" ({len(mismatched) - 1} more tensors differ)" if len(mismatched) > 1 else ""
            raise CheckpointError(
                f"the weights of {name} do not match its {CONFIG_FILE}: {tensor} has shape "
                f"{stored} in the weights, {expected} by {CONFIG_FILE}{more}",
                value=tensor,
            )
    return model


def _new_output_size(stored, expected, label_counts: tuple[int, int] | None) -> bool:
    """Whether two shapes differ only where a classifier's output size went from label_counts[0] to [1]."""
    return (
        label_counts is not None
        and len(stored) == len(expected)
        and all(old == new or (old, new) == label_counts for old, new in zip(stored, expected))
    )


class _HeldRecords(logging.Filter):
    """Keeps back the records of a logger (transformers' load report) until the load is accepted or refused."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def discard(self) -> None:
        self.records.clear()


@contextlib.contextmanager
def _held_load_report(logger_name: str = "transformers.modeling_utils") -> Iterator[_HeldRecords]:
    """What `logger_name` logs inside (by default transformers' load report), logged at the end unless discarded:
    a refused load says it in one line."""
    logger = logging.getLogger(logger_name)
    held = _HeldRecords()
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)
        for record in held.records:
            logger.handle(record)  # through the logger's own filters again (console.LibraryNoise)


def load_pretrained(loader, name: str, *, trust_remote_code: bool = False, **kwargs):
    """Call a transformers `from_pretrained`, turning a failed download or bad folder into a one-line CheckpointError.

    Every load in the package goes through here. Python code shipped with a checkpoint (its config's
    `auto_map`) runs only when a recipe sets `trust_remote_code` itself; passing False explicitly also keeps
    transformers from asking on the terminal. What transformers' configuration code logs about a load that is then
    refused (e.g. "You are using a model of type ... to instantiate ...") is dropped: the one line says it all.
    """
    with _held_load_report("transformers.configuration_utils") as notes:
        try:
            return _load_pretrained(loader, name, trust_remote_code, **kwargs)
        except CheckpointError:
            notes.discard()
            raise


def _load_pretrained(loader, name: str, trust_remote_code: bool, **kwargs):
    """`load_pretrained` without the held notes.

    transformers raises a ValueError for many reasons, told apart only by its wording (which changes between
    versions); the checkpoint's own files say which reason it was, so they are read instead.
    """
    try:
        return loader(name, trust_remote_code=trust_remote_code, **kwargs)
    except OSError as error:  # no such hub name, no network, a file missing
        raise CheckpointError(f"cannot load '{name}': {_first_line(error)}", value=name) from None
    except ValueError as error:
        config = _stored_json(name, CONFIG_FILE)
        if not trust_remote_code and _ships_code(name, config):
            raise CheckpointError(
                f"'{name}' ships Python code of its own, which runs only with trust_remote_code: "
                "true in the recipe (set it only for code you have read)",
                value=name,
            ) from None
        if config is not None and config.get("model_type") not in CONFIG_MAPPING:
            raise CheckpointError(
                f"'{name}' is no model family transformers knows (config.json: model_type missing or unknown)",
                value=config.get("model_type"),
            ) from None
        if _loads_a_tokenizer(loader) and _stored_file(name, "tokenizer.json") is None:
            raise CheckpointError(
                f"'{name}' has no tokenizer transformers can read (tokenizer.json, or the "
                "vocabulary files of its model family)",
                value=name,
            ) from None
        model_type = getattr(kwargs.get("config"), "model_type", None) or (config or {}).get("model_type")
        if _auto_class_lacks_family(loader, model_type):
            raise  # a known family without this kind of head (heads refuses one before asking)
        raise CheckpointError(f"cannot load '{name}': {_first_line(error)}", value=name) from None


def _stored_file(name: str, file_name: str) -> Path | None:
    """A file of a checkpoint as stored on this machine: in its folder, or in the hub cache (where the failed
    load put it); None if there is none."""
    if Path(name).is_dir():
        path = Path(name) / file_name
        return path if path.is_file() else None
    cached = try_to_load_from_cache(name, file_name)
    return Path(cached) if isinstance(cached, str) else None


def _stored_json(name: str, file_name: str) -> dict | None:
    """A checkpoint's JSON file as a dict; None when it is not stored here or is no JSON object."""
    path = _stored_file(name, file_name)
    try:
        stored = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) else None


def _ships_code(name: str, config: dict | None) -> bool:
    """Whether the checkpoint points transformers at Python code of its own (an `auto_map`)."""
    tokenizer_config = _stored_json(name, "tokenizer_config.json")
    return any(stored is not None and "auto_map" in stored for stored in (config, tokenizer_config))


def _loads_a_tokenizer(loader) -> bool:
    """Whether `loader` is a tokenizer class's `from_pretrained` (AutoTokenizer's or a family's)."""
    owner = getattr(loader, "__self__", None)
    return isinstance(owner, type) and issubclass(owner, (AutoTokenizer, PreTrainedTokenizerBase))


def _auto_class_lacks_family(loader, model_type: str | None) -> bool:
    """Whether `loader` is an Auto class's `from_pretrained` with no class for `model_type` (an n-gram model
    asked for a sequence-classification head)."""
    return auto_class_lacks_family(getattr(loader, "__self__", None), model_type)


def auto_class_lacks_family(auto_class, model_type: str | None) -> bool:
    """Whether `auto_class` (AutoModelForSequenceClassification, ...) has no class for `model_type`, a family
    transformers knows (or one registered with it); False for a family shipped as code (its config's auto_map
    names its classes)."""
    mapping = getattr(auto_class, "_model_mapping", None)
    return (
        mapping is not None
        and model_type is not None
        and model_type in CONFIG_MAPPING
        and CONFIG_MAPPING[model_type] not in mapping
    )


def is_classifier(config) -> bool:
    """True for the config of a fine-tuned sequence classifier (not of a language model or bare encoder)."""
    return any(name.endswith("ForSequenceClassification") for name in (config.architectures or []))


def _first_line(error: Exception) -> str:
    """The first line of an exception's message (or its type)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def load_tokenizer(name: str, *, trust_remote_code: bool = False):
    """The tokenizer saved with a checkpoint, or in a folder of its own."""
    # A folder without any of these would give an empty tokenizer (transformers builds one from config.json alone).
    source = resolve_checkpoint(name, marker_files=TOKENIZER_FILES)
    return load_pretrained(AutoTokenizer.from_pretrained, source, trust_remote_code=trust_remote_code)


def refuse_other_model_type(config, model_type: str, name: str, refusal: str) -> None:
    """A checkpoint to continue must be of `model_type`; another is refused in one line naming its type and
    `refusal` (what continues what)."""
    if config.model_type != model_type:
        raise CheckpointError(f"{name} is a '{config.model_type}' model; {refusal}", value=config.model_type)


def stored_model_type(name: str) -> str | None:
    """The model_type in a checkpoint's config.json as stored on this machine (its folder, or the hub cache),
    read without loading anything; None when it is not stored here or names none (nothing is refused here: the
    load that follows refuses a bad name)."""
    if not Path(name).is_dir() and not HUB_NAME.match(name):
        return None
    model_type = (_stored_json(name, CONFIG_FILE) or {}).get("model_type")
    return model_type if isinstance(model_type, str) else None


def stored_architectures(name: str) -> list[str] | None:
    """The model classes a checkpoint's config.json names (`architectures`) as stored on this machine (its folder, or
    the hub cache), read without loading anything; None when it is not stored here."""
    if not Path(name).is_dir() and not HUB_NAME.match(name):
        return None
    config = _stored_json(name, CONFIG_FILE)
    if config is None:
        return None
    architectures = config.get("architectures")
    return [str(architecture) for architecture in architectures] if isinstance(architectures, list) else []
