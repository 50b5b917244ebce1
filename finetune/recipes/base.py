"""What every stage's recipe shares: the strict Section base, path markers, training, schedule and long-document
sections, and the run recipe bases (stage, run_dir, periodic checkpoints). The task section is recipes/task.py's."""

from __future__ import annotations

import reprlib
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class MustExist:
    """Marks a path field whose file (kind "file") or folder (kind "folder") must exist before a run starts."""

    def __init__(self, kind: Literal["file", "folder"]):
        self.kind = kind


InputFile = Annotated[Path, MustExist("file")]
InputFolder = Annotated[Path, MustExist("folder")]


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, never silently ignored; so are nan and inf, and true or
    false for a number or a number or text for true or false (see `boolean_problem`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # Runs after a field's own before-validators (pydantic runs a subclass's first): mixed_precision's turns YAML's
    # `no` (false) into "no" before this sees it.
    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        problem = boolean_problem(value, cls.model_fields[str(info.field_name)].annotation)
        if problem is not None:
            raise ValueError(problem)
        return value


# What a recipe key takes of the YAML types, beyond what its type says (pydantic's lax mode):
# - an int for a float key (`lr: 1` means 1.0), and text that reads as a number for a number key: PyYAML reads `1e-3`
#   (no dot) as text, and `training.lr=1e-3` is how users write it;
# - never a number for a text key: `name: 1.10` would become "1.10"'s float 1.1; the error says to quote it;
# - never true/false for a number (pydantic would read `epochs: yes` as 1), and never a number or text for a true/false
#   key (pydantic would read `compile: 1` or `compile: "off"` as booleans): `boolean_problem` refuses them.
_UNIONS = (Union, UnionType)
_BOOLEAN_TAKERS = (bool, Any, object)  # members of a key's type that take true/false as it is


def type_members(annotation: Any) -> list[Any]:
    """The types a value of `annotation` may be: Annotated unwrapped, unions flattened."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return type_members(get_args(annotation)[0])
    if origin in _UNIONS:
        return [member for argument in get_args(annotation) for member in type_members(argument)]
    return [annotation]


def boolean_problem(value: Any, annotation: Any) -> str | None:
    """Why `value` may not be given for a key of type `annotation` although pydantic's lax mode would convert it: true
    or false for a number, a number or text for true or false (also as an item of a list or mapping); else None."""
    members = type_members(annotation)
    if isinstance(value, bool):
        takes = any(member in _BOOLEAN_TAKERS or True in get_args(member) for member in members)
        if not takes and any(member in (int, float) for member in members):
            return "expected a number, not true or false"
        return None
    if isinstance(value, (int, float, str)) and members and all(member in (bool, NoneType) for member in members):
        return "expected true or false"
    for member in members:  # the items of a list or mapping against the item types of the first container member
        origin, arguments = get_origin(member), get_args(member)
        if isinstance(value, (list, tuple)) and origin in (list, tuple, set, frozenset) and arguments:
            item_types = arguments if origin is tuple and arguments[-1] is not Ellipsis else [arguments[0]] * len(value)
            found = [boolean_problem(item, item_type) for item, item_type in zip(value, item_types)]
            return next((f"item {index + 1}: {problem}" for index, problem in enumerate(found) if problem), None)
        if isinstance(value, dict) and origin is dict and len(arguments) == 2:
            named = [(key, boolean_problem(item, arguments[1])) for key, item in value.items()]
            return next((f"{key}: {problem}" for key, problem in named if problem), None)
    return None


SEED_RANGE = {"ge": 0, "lt": 2**32}  # what numpy's and torch's generators accept
Seed = Annotated[int, Field(**SEED_RANGE)]
MAX_VOCABULARY = 2**20  # the largest vocabularies in use have ~256k pieces; the tokenizer trainer aborts on huge ones


def _bounded_repr() -> reprlib.Repr:
    """repr() that shows a bad value at most a few items and levels deep: errors echo what the user gave, bounded."""
    bounded = reprlib.Repr()  # keyword arguments only from Python 3.12
    bounded.maxlevel, bounded.maxstring, bounded.maxother, bounded.maxlist, bounded.maxdict = 2, 60, 60, 4, 4
    return bounded


ECHO = _bounded_repr()  # echoes a user's value in an error, cut to a readable length


# ---------------------------------------------------------------------------------------------
# Sections shared by the stages
# ---------------------------------------------------------------------------------------------


# Trackers every supported accelerate version has: a recipe naming only these is checked without importing accelerate
# (and torch), so that its other mistakes are still answered at once. Any other name is looked up in accelerate itself.
COMMON_TRACKERS = frozenset({"all", "tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive"})


def accelerate_tracker_names() -> list[str]:
    """The tracker names accelerate accepts for `training.log_with` ("all": every installed one)."""
    from accelerate.utils import LoggerType  # late import: recipe validation needs accelerate only for this key

    return [member.value for member in LoggerType]


class TrainingConfig(Section):
    """How the optimisation runs: length, batch, optimiser, logging, device."""

    epochs: int = Field(1, gt=0, description="passes over the training data")
    max_steps: int | None = Field(
        None,
        gt=0,
        description="the run's length in optimizer steps, whatever epochs says (the data repeats, the "
        "epochs go on; the LR schedule and unfreezing are fitted to it); null: epochs x steps per epoch",
    )
    batch_size: int = Field(32, gt=0, description="examples (or blocks) per optimizer step, per process")
    gradient_accumulation_steps: int = Field(1, gt=0, description="micro-batches summed into one optimizer step")
    lr: float = Field(5e-4, gt=0, description="peak learning rate of the top layer group")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decay; biases and norm weights are never decayed")
    adam_betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW betas, each in [0, 1)"
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="clip the gradient norm to this; null: no clipping")
    divergence_factor: float | None = Field(
        10.0,
        gt=1,
        description="stop the run as diverged (nothing saved as its result) once a validation loss exceeds this "
        "many times the first evaluation's (and that one plus 1); null: never for a rising loss (a nan or inf "
        "validation loss always stops it)",
    )
    log_every: int = Field(10, gt=0, description="write a metrics.jsonl line every this many optimizer steps")
    log_with: list[str] = Field(
        default_factory=list,
        description="experiment trackers that also get every metrics.jsonl record, through "
        "accelerate: tensorboard (into RUN_DIR/trackers), wandb, mlflow, comet_ml, aim, clearml, dvclive, ...; all: "
        "every installed one; empty: none",
    )
    device: Literal["auto", "cpu"] = Field("auto", description="auto: the GPU when there is one, else the CPU")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on GPUs that support it, off on CPUs (bf16 on CPUs is very slow)"
    )
    compile: bool = Field(
        False,
        description="torch.compile the model in place (Inductor: fused kernels for the work between the matrix "
        "products); it compiles on the first steps, again for each new batch shape until shapes are marked dynamic, "
        "and after each change of trainable groups",
    )
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes")
    skip_padding: bool = Field(
        True,
        description="finetune: BERT-family classifiers and taggers (bert and its checkpoints such as MiniLM; fp32, "
        "no adapter, not compiled) compute their batches' real tokens only, attention alone reading the padded "
        "layout: Hugging Face's model and gradients, 2.2-2.3x faster on shuffled SST-2 and CoNLL-2003 batches on a "
        "CPU; false: the model's own forward on padded batches",
    )
    group_by_length: bool | None = Field(
        None,
        description="finetune: batches of examples of similar length (sorted within chunks of group_chunk_batches "
        "shuffled batches, then the batches shuffled; fastai's SortishSampler): ~3x less padding on GLUE, at a "
        "quality cost on some tasks (bench/grouped_batches.py); false: plain shuffle; null: shuffled when the model "
        "skips padding (skip_padding), grouped otherwise",
    )
    group_chunk_batches: int = Field(
        50,
        ge=1,
        description="finetune, with group_by_length: how many shuffled batches are sorted by length together; "
        "fewer: batches less alike in length (more padding, slower) and in content (bench/grouped_batches.py)",
    )
    split_by_length: bool = Field(
        False,
        description="finetune (classification without long_documents windows, tagging): cut each batch into pieces "
        "of similar length, each padded to its own longest, a forward and backward pass each: the batch's examples "
        "and gradient stay those of the batch, less padding is computed; pays on CPUs (on GPUs a pass's fixed cost "
        "outweighs the padding it saves); with group_by_length=false: shuffled batches' quality, faster",
    )

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _no_is_a_word(cls, value: Any) -> Any:
        """YAML reads a bare `no` as false: `mixed_precision: no` (or `training.mixed_precision=no`) means "no"."""
        return "no" if value is False else value

    @field_validator("log_with", mode="before")
    @classmethod
    def _known_trackers(cls, names: Any) -> Any:
        """One name is a list of one; every name must be a tracker accelerate knows."""
        names = [names] if isinstance(names, str) else names
        if isinstance(names, list) and names and not COMMON_TRACKERS.issuperset(names):
            known = accelerate_tracker_names()
            unknown = [name for name in names if name not in known]
            if unknown:
                raise ValueError(f"unknown tracker {ECHO.repr(unknown[0])} (accelerate supports {', '.join(known)})")
        return names


SCHEDULE_KINDS = Literal["stlr", "linear", "one_cycle", "constant", "range_test"]
SCHEDULE_KIND_HELP = (
    "stlr: slanted triangular (ULMFiT); linear: warmup then linear decay; one_cycle: fastai's "
    "fit_one_cycle (cosine rise and fall, momentum cycled); constant; range_test: exponential "
    "growth from lr / range_ratio to lr (what `finetune lr-find` runs)"
)


class ScheduleConfig(Section):
    """The learning-rate schedule: a pure function of the optimizer step (see training/schedules.py)."""

    kind: SCHEDULE_KINDS = Field("stlr", description=SCHEDULE_KIND_HELP)
    cut_frac: float = Field(0.1, gt=0, lt=1, description="stlr: fraction of steps spent increasing the LR")
    ratio: float = Field(32.0, ge=1, description="stlr: how much smaller the lowest LR is than the peak")
    warmup_fraction: float = Field(0.1, ge=0, lt=1, description="linear: fraction of steps of linear warmup")
    pct_start: float = Field(
        0.25, gt=0, lt=1, description="one_cycle: fraction of steps spent raising the LR (fastai's 0.25)"
    )
    div: float = Field(25.0, ge=1, description="one_cycle: the LR starts at the peak / div (fastai's 25)")
    final_div: float = Field(1e5, ge=1, description="one_cycle: the LR ends at the peak / final_div (fastai's 1e5)")
    range_ratio: float = Field(1e8, gt=1, description="range_test: the first step's LR is training.lr / range_ratio")
    momentum: tuple[float, float] | None = Field(
        (0.95, 0.85),
        description="one_cycle: Adam's beta1 falls from the first value to the second while the LR "
        "rises, and back while it falls (fastai's moms); null: training.adam_betas' beta1 throughout",
    )

    @field_validator("momentum")
    @classmethod
    def _momentum_is_a_decay(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"momentum {list(value)}: each beta1 must be in [0, 1)")
        return value


class PretrainScheduleConfig(ScheduleConfig):
    """Language-model pretraining defaults to linear warmup then decay, as BERT does."""

    kind: SCHEDULE_KINDS = Field("linear", description=SCHEDULE_KIND_HELP)


LONG_DOCUMENT_MODES = Literal["truncate", "head_tail", "chunks"]
LONG_DOCUMENT_MODE_KEYS = {"head_tail": ("head",), "chunks": ("overlap", "max_chunks", "pool")}


class LongDocumentsConfig(Section):
    """What becomes of an example longer than task.max_length (data/long_documents.py)."""

    mode: LONG_DOCUMENT_MODES = Field(
        "truncate",
        description="truncate: its first max_length tokens; head_tail: its first `head` and last "
        "max_length - head tokens (Sun et al. 2019: 128 + 382 was best on IMDb); chunks: windows of max_length "
        "tokens, each classified, the document's logits pooled over its windows (training, eval, predict alike)",
    )
    head: int | None = Field(
        None,
        gt=0,
        description="head_tail: tokens kept from the start, the rest of max_length from the end; null: a "
        "quarter of max_length",
    )
    overlap: int | None = Field(
        None,
        ge=0,
        description="chunks: tokens each window repeats from the one before (what Hugging Face "
        "tokenizers call stride); null: a quarter of max_length",
    )
    max_chunks: int = Field(
        8,
        gt=0,
        description="chunks: windows per document at most; a longer document is read in that many windows "
        "spread evenly over it (a batch holds up to batch_size x max_chunks windows)",
    )
    pool: Literal["mean", "max"] = Field(
        "mean", description="chunks: the document's logits: the mean or the maximum over its windows"
    )

    @model_validator(mode="after")
    def _keys_of_the_mode(self) -> LongDocumentsConfig:
        defaults = {name: field.default for name, field in type(self).model_fields.items()}
        for mode, keys in LONG_DOCUMENT_MODE_KEYS.items():
            given = [key for key in keys if getattr(self, key) != defaults[key]]
            if given and self.mode != mode:
                raise ValueError(f"{given[0]} is read in mode {mode} only (mode is {self.mode})")
        return self


class DiscriminativeConfig(Section):
    """Discriminative learning rates: group l gets lr / factor ** (depth of l from the top)."""

    factor: float = Field(2.6, ge=1, description="ULMFiT: 2.6; 1.0 turns it off; BERT layer decay 0.9 -> 1/0.9")


class RunRecipe(Section):
    """What every stage's recipe has: its stage, a description and the run directory."""

    stage: str
    description: str = Field("", description="one line shown by `finetune recipes`")
    run_dir: Path = Field(description="folder for everything the run writes (~ is the home folder)")
    overwrite: bool = Field(
        False,
        description="replace the earlier finetune run in run_dir: only a folder with finetune's marker file, "
        "and only the files finetune wrote there (anything else of yours stays)",
    )

    @field_validator("run_dir")
    @classmethod
    def _home_expanded(cls, run_dir: Path) -> Path:
        return run_dir.expanduser()


class TrainingRunRecipe(RunRecipe):
    """What the training stages (pretrain, finetune) share: periodic checkpoints that `--resume` continues from."""

    checkpoint_every: int | None = Field(
        None, gt=0, description="save a checkpoint with the full training state every N steps (for --resume)"
    )
    keep_checkpoints: int = Field(2, gt=0, description="how many of the periodic checkpoints to keep (newest)")
