"""Recipes: typed, validated YAML configs with dotted `key=value` overrides.

A recipe is checked completely before any work starts: unknown keys, wrong types, values out
of range and missing input files are reported as one line that names the key and the file.
Relative paths are read relative to the working directory the command runs in.
"""

from __future__ import annotations

import os
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator,
                      model_serializer, model_validator)

from finetune.errors import UserError
from finetune.safe_yaml import YAMLProblem, load_yaml


class MustExist:
    """Marks a path field whose file (kind "file") or folder (kind "folder") must exist before a run starts."""

    def __init__(self, kind: Literal["file", "folder"]):
        self.kind = kind


InputFile = Annotated[Path, MustExist("file")]
InputFolder = Annotated[Path, MustExist("folder")]


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, never silently ignored; so are nan and inf."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


SEED_RANGE = {"ge": 0, "lt": 2**32}  # what numpy's and torch's generators accept
Seed = Annotated[int, Field(**SEED_RANGE)]
MAX_VOCABULARY = 2**20  # the largest vocabularies in use have ~256k pieces; the tokenizer trainer aborts on huge ones


# ---------------------------------------------------------------------------------------------
# Sections shared by the stages
# ---------------------------------------------------------------------------------------------


def accelerate_tracker_names() -> list[str]:
    """The tracker names accelerate accepts for `training.log_with` ("all": every installed one)."""
    from accelerate.utils import LoggerType  # late import: recipe validation needs accelerate only for this key

    return [member.value for member in LoggerType]


class TrainingConfig(Section):
    """How the optimisation runs: length, batch, optimiser, logging, device."""

    epochs: int = Field(1, gt=0, description="passes over the training data")
    max_steps: Optional[int] = Field(None, gt=0, description="stop after this many optimizer steps (overrides epochs)")
    batch_size: int = Field(32, gt=0, description="examples (or blocks) per optimizer step, per process")
    gradient_accumulation_steps: int = Field(1, gt=0, description="micro-batches summed into one optimizer step")
    lr: float = Field(5e-4, gt=0, description="peak learning rate of the top layer group")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decay; biases and norm weights are never decayed")
    adam_betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="AdamW betas, each in [0, 1)")
    max_grad_norm: Optional[float] = Field(1.0, gt=0, description="clip the gradient norm to this; null: no clipping")
    log_every: int = Field(10, gt=0, description="write a metrics.jsonl line every this many optimizer steps")
    log_with: list[str] = Field(
        default_factory=list, description="experiment trackers that also get every metrics.jsonl record, through "
        "accelerate: tensorboard (into RUN_DIR/trackers), wandb, mlflow, comet_ml, aim, clearml, dvclive, ...; all: "
        "every installed one; empty: none"
    )
    device: Literal["auto", "cpu"] = Field("auto", description="auto: the GPU when there is one, else the CPU")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on GPUs that support it, off on CPUs (bf16 on CPUs is very slow)"
    )
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes")
    group_by_length: bool = Field(
        True, description="finetune: batches of examples of similar length (sorted within chunks of 50 shuffled "
        "batches, then the batches shuffled; fastai's SortishSampler): ~3x less padding on GLUE; false: plain shuffle"
    )

    @field_validator("log_with", mode="before")
    @classmethod
    def _known_trackers(cls, names: Any) -> Any:
        """One name is a list of one; every name must be a tracker accelerate knows."""
        names = [names] if isinstance(names, str) else names
        if isinstance(names, list) and names:
            known = accelerate_tracker_names()
            unknown = [name for name in names if name not in known]
            if unknown:
                raise ValueError(f"unknown tracker {_ECHO.repr(unknown[0])} (accelerate supports {', '.join(known)})")
        return names


SCHEDULE_KINDS = Literal["stlr", "linear", "one_cycle", "constant", "range_test"]
SCHEDULE_KIND_HELP = ("stlr: slanted triangular (ULMFiT); linear: warmup then linear decay; one_cycle: fastai's "
                      "fit_one_cycle (cosine rise and fall, momentum cycled); constant; range_test: exponential "
                      "growth from lr / range_ratio to lr (what `finetune lr-find` runs)")


class ScheduleConfig(Section):
    """The learning-rate schedule: a pure function of the optimizer step (see training/schedules.py)."""

    kind: SCHEDULE_KINDS = Field("stlr", description=SCHEDULE_KIND_HELP)
    cut_frac: float = Field(0.1, gt=0, lt=1, description="stlr: fraction of steps spent increasing the LR")
    ratio: float = Field(32.0, ge=1, description="stlr: how much smaller the lowest LR is than the peak")
    warmup_fraction: float = Field(0.1, ge=0, lt=1, description="linear: fraction of steps of linear warmup")
    pct_start: float = Field(0.25, gt=0, lt=1, description="one_cycle: fraction of steps spent raising the LR "
                             "(fastai's 0.25)")
    div: float = Field(25.0, ge=1, description="one_cycle: the LR starts at the peak / div (fastai's 25)")
    final_div: float = Field(1e5, ge=1, description="one_cycle: the LR ends at the peak / final_div (fastai's 1e5)")
    range_ratio: float = Field(1e8, gt=1, description="range_test: the first step's LR is training.lr / range_ratio")
    momentum: Optional[tuple[float, float]] = Field(
        (0.95, 0.85), description="one_cycle: Adam's beta1 falls from the first value to the second while the LR "
        "rises, and back while it falls (fastai's moms); null: training.adam_betas' beta1 throughout"
    )

    @field_validator("momentum")
    @classmethod
    def _momentum_is_a_decay(cls, value: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
        if value is not None and not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"momentum {list(value)}: each beta1 must be in [0, 1)")
        return value


class PretrainScheduleConfig(ScheduleConfig):
    """Language-model pretraining defaults to linear warmup then decay, as BERT does."""

    kind: SCHEDULE_KINDS = Field("linear", description=SCHEDULE_KIND_HELP)


class TaskConfig(Section):
    """A classification or regression task: a GLUE task by name, or a custom one described here."""

    name: str = Field(description="a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, mnli-mm, qnli, rte, wnli, ax) "
                      "or a custom name")
    data_dir: Optional[InputFolder] = Field(
        None, description="folder with the task's files: train.tsv / dev.tsv / test.tsv in the GLUE layout (a custom "
        "task: also CSV or JSON Lines); not with source hub"
    )
    source: Literal["files", "hub"] = Field(
        "files", description="files: read data_dir; hub: a GLUE task from the hub's nyu-mll/glue (needs a network)"
    )
    max_length: int = Field(128, gt=1, description="truncate each example to this many tokens")
    # Custom tasks only (a GLUE task brings its own):
    text_columns: Optional[list[str]] = Field(None, min_length=1, max_length=2, description="custom: 1 or 2 text columns")
    label_column: Optional[str] = Field(None, description="custom: the label column")
    labels: Optional[list[str]] = Field(None, min_length=2, description="custom: label strings; omit for regression")

    @field_validator("labels", "text_columns")
    @classmethod
    def _distinct(cls, names: Optional[list[str]]) -> Optional[list[str]]:
        repeated = sorted({name for name in names or [] if names.count(name) > 1})
        if repeated:
            raise ValueError(f"'{repeated[0]}' is listed twice")
        return names

    metrics: Optional[list[Literal["accuracy", "f1", "mcc", "pearson", "spearman"]]] = Field(
        None, min_length=1, description="custom: metrics to report, the first one selects the best model"
    )
    format: Optional[Literal["tsv", "csv", "jsonl"]] = Field(
        None, description="custom: how the files are read; null: by each file's extension (.tsv, .csv, .jsonl)"
    )
    files: Optional[dict[str, str]] = Field(
        None, description="custom: split -> file name in data_dir; null: train/dev/test with the format's extension"
    )
    index_column: Optional[str] = Field(None, description="custom: the id column of test files; null: index")

    @model_validator(mode="after")
    def _custom_or_known(self) -> "TaskConfig":
        from finetune.glue.specs import GLUE_TASKS  # late import: specs imports nothing from here

        custom_keys = [k for k in ("text_columns", "label_column", "labels", "metrics", "format", "files",
                                   "index_column") if getattr(self, k) is not None]
        if (self.source == "files") == (self.data_dir is None):
            raise ValueError("give data_dir (source files) or source hub, not both" if self.data_dir is not None
                             else "data_dir is required (or source: hub for a GLUE task)")
        if self.name in GLUE_TASKS:
            if custom_keys:
                raise ValueError(f"'{self.name}' is a GLUE task with its own columns; remove {', '.join(custom_keys)}")
        elif self.source == "hub":
            raise ValueError(f"source hub reads GLUE tasks; '{self.name}' is a custom task: give data_dir")
        elif self.text_columns is None or self.label_column is None:
            known = ", ".join(sorted(GLUE_TASKS))
            raise ValueError(
                f"unknown task '{self.name}' (GLUE tasks: {known}); a custom task needs text_columns and label_column"
            )
        regression = self.labels is None
        for metric in self.metrics or []:
            if (metric in ("pearson", "spearman")) != regression:
                kind = "regression (no labels)" if metric in ("pearson", "spearman") else "classification (labels)"
                raise ValueError(f"metric {metric} is for {kind} tasks")
            if metric == "f1" and len(self.labels) != 2:
                raise ValueError(f"metric f1 (of the positive class) needs 2 labels, not {len(self.labels)}")
        return self


# ---------------------------------------------------------------------------------------------
# pretrain
# ---------------------------------------------------------------------------------------------


ARCHITECTURE_KEYS = ("layers", "hidden", "heads", "intermediate", "max_positions")
AWD_LSTM_ARCHITECTURE_KEYS = ("embedding_size", "hidden", "layers", "embedding_init_range")


def _drop_architecture(data: dict[str, Any], checkpoint: Optional[str], keys: tuple[str, ...]) -> dict[str, Any]:
    """`data` (a dumped model section) without the architecture `keys` when a checkpoint gives the architecture."""
    if checkpoint is not None:
        for key in keys:
            data.pop(key, None)
    return data


class TransformerModelConfig(Section):
    """A transformer from scratch (sizes as in BERT-tiny 2/128 ... BERT-small 4/512) or continued."""

    checkpoint: Optional[str] = Field(
        None, description="continue pretraining this Hugging Face folder or hub name (ULMFiT's target-domain "
        "LM stage); its architecture and tokenizer are kept"
    )
    layers: int = Field(2, gt=0, description="transformer blocks")
    hidden: int = Field(128, gt=0, description="hidden size")
    heads: int = Field(2, gt=0, description="attention heads; must divide hidden")
    intermediate: Optional[int] = Field(None, gt=0, description="feed-forward size; null: 4 x hidden")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout on hidden states and attention")
    max_positions: Optional[int] = Field(
        None, gt=0, description="position embeddings (longest input); null: corpus.block_size"
    )

    @model_validator(mode="after")
    def _consistent_architecture(self) -> "TransformerModelConfig":
        given = [key for key in ARCHITECTURE_KEYS if key in self.model_fields_set]
        if self.checkpoint is not None and given:
            raise ValueError(f"the architecture comes from model.checkpoint; remove {', '.join(given)}")
        if self.hidden % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden})")
        return self

    @model_serializer(mode="wrap")
    def _without_unused_architecture(self, handler: Any) -> dict[str, Any]:
        """A continued model's section as saved: no architecture keys (they come from the checkpoint, and the
        validator above refuses them beside it), so a run's saved recipe.yaml loads again for --resume."""
        return _drop_architecture(handler(self), self.checkpoint, ARCHITECTURE_KEYS)


class MaskedLMModelConfig(TransformerModelConfig):
    """A BERT-style encoder trained to fill in masked tokens."""

    family: Literal["bert"] = Field("bert", description="bert: masked LM; gpt2: causal transformer; "
                                    "awd_lstm: ULMFiT's causal LSTM")


class CausalLMModelConfig(TransformerModelConfig):
    """A GPT-2-style decoder trained to predict the next token."""

    family: Literal["gpt2"] = Field(description="bert: masked LM; gpt2: causal transformer; "
                                    "awd_lstm: ULMFiT's causal LSTM")


class AWDLSTMModelConfig(Section):
    """ULMFiT's AWD-LSTM: an LSTM language model regularised by five kinds of dropout, decoder tied."""

    family: Literal["awd_lstm"] = Field(description="bert: masked LM; gpt2: causal transformer; "
                                        "awd_lstm: ULMFiT's causal LSTM")
    checkpoint: Optional[str] = Field(
        None, description="continue pretraining this AWD-LSTM checkpoint folder (ULMFiT's target-domain LM stage)"
    )
    embedding_size: int = Field(400, gt=0, description="embedding size (also the last LSTM's size: tied decoder)")
    hidden: int = Field(1152, gt=0, description="hidden size of the inner LSTM layers")
    layers: int = Field(3, gt=0, description="stacked LSTM layers")
    # The five dropouts at fastai's ULMFiT language-model defaults.
    output_dropout: float = Field(0.1, ge=0, lt=1, description="dropout on the last LSTM's output")
    hidden_dropout: float = Field(0.15, ge=0, lt=1, description="variational dropout between LSTM layers")
    input_dropout: float = Field(0.25, ge=0, lt=1, description="variational dropout on the embedded input")
    embedding_dropout: float = Field(0.02, ge=0, lt=1, description="drops whole embedding rows (words)")
    weight_dropout: float = Field(0.2, ge=0, lt=1, description="DropConnect on the hidden-to-hidden weights")
    # fastai's 0.1 leaves the embedded input so small that, with Adam on a corpus of a few million tokens, the LM
    # sits at the unigram plateau for hundreds of steps; 0.5 leaves it within ~20 (recipes/pretrain/awd-lstm-*).
    embedding_init_range: float = Field(
        0.1, gt=0, description="embedding (and tied decoder) drawn uniform in [-range, range] (fastai: 0.1)"
    )
    # Training objective, not architecture: also for a continued model.checkpoint (ULMFiT's stage 2 regularises
    # too). Added to the loss that is back-propagated only; metrics.jsonl's loss stays the next-token
    # cross-entropy, comparable with the validation loss (as fastai's RNNRegularizer, defaults of its TextLearner).
    activation_regularization: float = Field(
        2.0, ge=0, description="AR (fastai's alpha): adds alpha x mean square of the last LSTM's output after "
        "output dropout to the training loss; 0: off"
    )
    temporal_activation_regularization: float = Field(
        1.0, ge=0, description="TAR (fastai's beta): adds beta x mean square of the step-to-step change of the last "
        "LSTM's output (before dropout) to the training loss; 0: off"
    )

    @model_validator(mode="after")
    def _architecture_from_checkpoint(self) -> "AWDLSTMModelConfig":
        given = [key for key in AWD_LSTM_ARCHITECTURE_KEYS if key in self.model_fields_set]
        if self.checkpoint is not None and given:
            raise ValueError(f"the architecture comes from model.checkpoint; remove {', '.join(given)}")
        return self

    @model_serializer(mode="wrap")
    def _without_unused_architecture(self, handler: Any) -> dict[str, Any]:
        """A continued model's section as saved: no architecture keys (see TransformerModelConfig's)."""
        return _drop_architecture(handler(self), self.checkpoint, AWD_LSTM_ARCHITECTURE_KEYS)


MODEL_FAMILIES = ("bert", "gpt2", "awd_lstm")


def _model_family(value: Any) -> str:
    """The `family` key of a model section (bert when absent, the historical default)."""
    if isinstance(value, dict):
        return value.get("family", "bert")
    return getattr(value, "family", "bert")


LanguageModelConfig = Annotated[
    Union[
        Annotated[MaskedLMModelConfig, Tag("bert")],
        Annotated[CausalLMModelConfig, Tag("gpt2")],
        Annotated[AWDLSTMModelConfig, Tag("awd_lstm")],
    ],
    Discriminator(_model_family),
]


class TokenizerConfig(Section):
    """The tokenizer: trained on the corpus inside the pretrain stage (WordPiece for masked LMs, byte-level BPE
    for causal ones), or an existing one reused."""

    path: Optional[InputFolder] = Field(
        None, description="reuse this tokenizer folder (e.g. an earlier run's checkpoint) instead of training one"
    )
    vocab_size: int = Field(8000, ge=100, le=MAX_VOCABULARY,
                            description="vocabulary size of a trained tokenizer, special tokens included")
    lowercase: Optional[bool] = Field(
        None, description="lowercase (and for WordPiece strip accents) before tokenizing; null: true for bert "
        "(uncased, as BERT), false for the byte-level BPE of causal LMs"
    )
    min_frequency: int = Field(2, gt=0, description="ignore pieces seen fewer times than this")
    new_vocabulary: bool = Field(
        False, description="awd_lstm with model.checkpoint: train a tokenizer on this corpus and map the "
        "checkpoint's rows onto it (new tokens start at the mean row), as ULMFiT's LM fine-tuning does"
    )


class CorpusConfig(Section):
    """Raw text: one document per non-empty line of text files (or a `datasets` dataset), packed into blocks."""

    train_files: list[InputFile] = Field(default_factory=list, description="text files to pretrain on")
    validation_files: list[InputFile] = Field(default_factory=list, description="held-out text; empty: split off")
    dataset: Optional[str] = Field(
        None, description="instead of train_files: a `datasets` dataset name (needs a network or the hub cache)"
    )
    dataset_config: Optional[str] = Field(None, description="the dataset's configuration, e.g. wikitext-2-raw-v1")
    text_column: str = Field("text", description="the dataset's column holding the text")
    task: Optional[TaskConfig] = Field(
        None, description="instead of train_files: the text columns of a task's files (ULMFiT's target-task LM "
        "fine-tuning), each text one document; labels are not read"
    )
    task_splits: list[str] = Field(
        default_factory=lambda: ["train"], min_length=1,
        description="with task: the splits whose text is read (train; add test for its unlabeled text)",
    )
    validation_fraction: float = Field(0.05, gt=0, lt=1, description="documents held out when no validation_files")
    block_size: int = Field(
        128, ge=8, description="tokens per training block: the context length (bert/gpt2, [CLS] included) or "
        "the truncated-BPTT length (awd_lstm; ULMFiT: 70)"
    )
    cache_dir: Optional[Path] = Field(
        Path("~/.cache/finetune/corpus"),
        description="tokenized corpora are cached here by content and tokenizer; null: no cache",
    )

    @model_validator(mode="after")
    def _one_source(self) -> "CorpusConfig":
        if [bool(self.train_files), bool(self.dataset), self.task is not None].count(True) != 1:
            raise ValueError("give exactly one of train_files, dataset and task")
        return self


class MaskingConfig(Section):
    """BERT masking: choose `probability` of the tokens; of those, mask / randomise / keep."""

    probability: float = Field(0.15, gt=0, lt=1, description="fraction of (non-special) tokens chosen")
    mask_fraction: float = Field(0.8, ge=0, le=1, description="of the chosen, fraction replaced by [MASK]")
    random_fraction: float = Field(0.1, ge=0, le=1, description="of the chosen, fraction replaced by a random token")
    whole_word: bool = Field(
        False, description="choose whole words (a WordPiece token and its ## continuations) instead of single tokens"
    )

    @model_validator(mode="after")
    def _fractions_fit(self) -> "MaskingConfig":
        if self.mask_fraction + self.random_fraction > 1:
            raise ValueError(
                f"mask_fraction + random_fraction = {self.mask_fraction + self.random_fraction:g} exceeds 1"
            )
        return self


class RunRecipe(Section):
    """What every stage's recipe has: its stage, a description and the run directory."""

    stage: str
    description: str = Field("", description="one line shown by `finetune recipes`")
    run_dir: Path = Field(description="folder for everything the run writes (~ is the home folder)")
    overwrite: bool = Field(
        False, description="replace the earlier finetune run in run_dir: only a folder with finetune's marker file, "
        "and only the files finetune wrote there (anything else of yours stays)")

    @field_validator("run_dir")
    @classmethod
    def _home_expanded(cls, run_dir: Path) -> Path:
        return run_dir.expanduser()


class TrainingRunRecipe(RunRecipe):
    """What the training stages (pretrain, finetune) share: periodic checkpoints that `--resume` continues from."""

    checkpoint_every: Optional[int] = Field(
        None, gt=0, description="save a checkpoint with the full training state every N steps (for --resume)"
    )
    keep_checkpoints: int = Field(2, gt=0, description="how many of the periodic checkpoints to keep (newest)")


class PretrainRecipe(TrainingRunRecipe):
    """`finetune pretrain`: train a masked (bert) or causal (gpt2, awd_lstm) language model on raw text."""

    stage: Literal["pretrain"]
    seed: Seed = Field(0, description="seed for initialisation, data order and masking")
    model: LanguageModelConfig = Field(default_factory=MaskedLMModelConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    corpus: CorpusConfig
    masking: Optional[MaskingConfig] = Field(None, description="masked LMs only; filled in with defaults for bert")
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    schedule: PretrainScheduleConfig = Field(default_factory=PretrainScheduleConfig)
    discriminative: "DiscriminativeConfig" = Field(
        default_factory=lambda: DiscriminativeConfig(factor=1.0),
        description="layer-wise learning rates; 1.0 (off) for pretraining from scratch, ULMFiT uses 2.6 when "
        "fine-tuning a language model on target-task text",
    )
    eval_every: Optional[int] = Field(None, gt=0, description="validation every N steps; null: at each epoch end")

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """Fill in what depends on the model family, so the saved recipe shows every value used."""
        if not isinstance(data, dict):
            return data
        family = _model_family(data.get("model") or {})
        if family == "bert" and data.get("masking") is None:
            data = {**data, "masking": {}}
        tokenizer = data.get("tokenizer") or {}
        if isinstance(tokenizer, dict) and tokenizer.get("lowercase") is None:
            data = {**data, "tokenizer": {**tokenizer, "lowercase": family == "bert"}}
        return data

    @model_validator(mode="after")
    def _consistent_sections(self) -> "PretrainRecipe":
        family, checkpoint = self.model.family, self.model.checkpoint
        if family != "bert" and self.masking is not None:
            raise ValueError(f"masking applies to masked LMs (model.family: bert), not {family}; remove it")
        if self.tokenizer.new_vocabulary and (family != "awd_lstm" or checkpoint is None):
            raise ValueError("tokenizer.new_vocabulary needs model.family awd_lstm and a model.checkpoint")
        if checkpoint is not None and self.tokenizer.path is not None:
            raise ValueError("model.checkpoint brings its own tokenizer; remove tokenizer.path")
        max_positions = getattr(self.model, "max_positions", None)
        if max_positions is not None and max_positions < self.corpus.block_size:
            raise ValueError(f"model.max_positions ({max_positions}) is smaller than "
                             f"corpus.block_size ({self.corpus.block_size})")
        return self


# ---------------------------------------------------------------------------------------------
# finetune
# ---------------------------------------------------------------------------------------------


class BackboneConfig(Section):
    """Where the pretrained weights come from."""

    checkpoint: str = Field(description="a Hugging Face model folder (a pretrain run's checkpoint) or hub name")
    init: Literal["pretrained", "random"] = Field(
        "pretrained", description="random: same architecture, fresh weights (the baseline pretraining must beat)"
    )
    trust_remote_code: bool = Field(
        False, strict=True, description="run Python code shipped with the checkpoint (its config's auto_map); "
        "only for code you have read: false refuses such checkpoints"
    )
    activation_regularization: Optional[float] = Field(
        None, ge=0, description="AWD-LSTM classifiers: AR's alpha on the encoder's top-layer outputs, in the "
        "back-propagated loss only; null: the checkpoint's value, else fastai's 2.0; 0: off"
    )
    temporal_activation_regularization: Optional[float] = Field(
        None, ge=0, description="AWD-LSTM classifiers: TAR's beta (jumps between neighbouring tokens' outputs); "
        "null: the checkpoint's value, else fastai's 1.0; 0: off"
    )


class DiscriminativeConfig(Section):
    """Discriminative learning rates: group l gets lr / factor ** (depth of l from the top)."""

    factor: float = Field(2.6, ge=1, description="ULMFiT: 2.6; 1.0 turns it off; BERT layer decay 0.9 -> 1/0.9")


class UnfreezingConfig(Section):
    """Gradual unfreezing: start with the top groups trainable and thaw more each epoch (or every N steps)."""

    mode: Literal["gradual", "none"] = Field("gradual", description="none: every group trainable from the start")
    initial_groups: int = Field(1, gt=0, description="groups trainable at the start (the first epoch), from the top")
    # None only with every_steps/every_fraction: per-epoch unfreezing fills in 1, so the saved recipe (which a
    # --resume reloads) shows the value used and never holds a groups_per_epoch beside every_steps.
    groups_per_epoch: Optional[int] = Field(
        None, gt=0, description="groups thawed at the start of each later epoch; null: 1 (none with every_steps or "
        "every_fraction)"
    )
    schedule: Optional[list[int]] = Field(
        None, min_length=1, description="gradual: trainable groups (from the top) per epoch, e.g. [1, 2, 3]; the "
        "last entry holds for later epochs; replaces initial_groups/groups_per_epoch"
    )
    # Step-wise unfreezing: a run of one or two epochs (most transformer fine-tuning) has too few epoch
    # boundaries to thaw a deep model by, and a fraction says "all thawed by 30% of training" without the step count.
    every_steps: Optional[int] = Field(
        None, gt=0, description="gradual: thaw one more group (from the top, starting from initial_groups) every N "
        "optimizer steps, instead of per epoch"
    )
    every_fraction: Optional[float] = Field(
        None, gt=0, le=1, description="gradual: thaw one more group every this fraction of the run's optimizer "
        "steps (rounded, at least 1 step), instead of per epoch; e.g. 0.1 with 4 groups: all trainable by 30%"
    )

    @model_validator(mode="after")
    def _schedule_grows(self) -> "UnfreezingConfig":
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
        if isinstance(data, dict) and data.get("groups_per_epoch") is None and \
                data.get("every_steps") is None and data.get("every_fraction") is None:
            return {**data, "groups_per_epoch": 1}
        return data

    @model_validator(mode="after")
    def _one_pace(self) -> "UnfreezingConfig":
        """One way to pace the thawing: per epoch (groups_per_epoch or schedule), every_steps or every_fraction."""
        stepwise = [key for key in ("every_steps", "every_fraction") if getattr(self, key) is not None]
        paces = stepwise + (["schedule"] if self.schedule is not None else [])
        if len(paces) > 1:
            raise ValueError(f"unfreezing.{paces[0]} and unfreezing.{paces[1]} both set the pace of thawing; "
                             "keep one")
        if stepwise and self.mode == "none":
            raise ValueError(f"unfreezing.{stepwise[0]} thaws gradually; it needs mode gradual, not none")
        if stepwise and self.groups_per_epoch is not None:
            raise ValueError(f"unfreezing.groups_per_epoch thaws per epoch, unfreezing.{stepwise[0]} by steps; "
                             "remove groups_per_epoch (or set it to null)")
        return self


class FinetuneRecipe(TrainingRunRecipe):
    """`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's techniques."""

    stage: Literal["finetune"]
    seed: Seed = Field(0, description="seed for the head's initialisation, data order and dropout")
    seeds: Optional[list[Seed]] = Field(
        None, min_length=1, description="run once per seed (into run_dir/seed-N) and report mean, median and "
        "spread of the dev metrics; replaces seed"
    )
    model: BackboneConfig
    task: TaskConfig
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    discriminative: DiscriminativeConfig = Field(default_factory=DiscriminativeConfig)
    unfreezing: UnfreezingConfig = Field(default_factory=UnfreezingConfig)
    classifier_dropout: Optional[float] = Field(
        None, ge=0, lt=1, description="dropout in the classification head; null: the backbone's default (BERT-style "
        "models: their hidden dropout; AWD-LSTM: 0.4 before its first pooling block)"
    )
    pooling: Literal["model", "mean"] = Field(
        "model", description="model: the checkpoint's own kind of head (BERT-style: [CLS] through the pooler; GPT-2: "
        "the last non-pad token; AWD-LSTM: concat pooling); mean: dropout and a linear layer on the average of the "
        "last layer over the real tokens, what sentence-embedding checkpoints (e.g. all-MiniLM-L6-v2) were "
        "trained for"
    )
    eval_every: Optional[int] = Field(None, gt=0, description="dev evaluation every N steps, besides each epoch end")
    keep_best: bool = Field(
        True, description="the saved checkpoint is the one with the best dev score (the task's first metric); "
        "false: the one after the last step"
    )
    early_stopping_patience: Optional[int] = Field(
        None, gt=0, description="stop after this many dev evaluations without a new best score; null: never"
    )

    @model_validator(mode="after")
    def _seeds_are_distinct(self) -> "FinetuneRecipe":
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds} repeats a seed")
        return self


# ---------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------


class GlueTaskEntry(Section):
    """One GLUE task of an eval recipe's `tasks`: its fine-tuned checkpoints and, optionally, its own folder."""

    checkpoints: list[str] = Field(
        min_length=1, description="fine-tuned checkpoint folders; several (runs, seeds) are aggregated"
    )
    data_dir: Optional[InputFolder] = Field(
        None, description="the task's folder (mnli's also holding diagnostic.tsv for AX); null: glue_dir/FOLDER"
    )

    @model_validator(mode="before")
    @classmethod
    def _checkpoints_alone(cls, value: Any) -> Any:
        """`rte: runs/rte/checkpoint` and `rte: [a, b]` are short for `rte: {checkpoints: [...]}`."""
        if isinstance(value, str):
            return {"checkpoints": [value]}
        return {"checkpoints": value} if isinstance(value, list) else value

    @model_validator(mode="after")
    def _distinct_checkpoints(self) -> "GlueTaskEntry":
        repeated = sorted({path for path in self.checkpoints if self.checkpoints.count(path) > 1})
        if repeated:
            raise ValueError(f"checkpoint {repeated[0]} is listed twice (it would count twice in the mean)")
        return self


GLUE_ONLY_EVAL_KEYS = ("glue_dir", "source", "max_length", "submission", "allow_incomplete")
SINGLE_TASK_EVAL_KEYS = ("models", "split", "write_predictions")


class EvalRecipe(RunRecipe):
    """`finetune eval`: score fine-tuned checkpoints on one task split, or on GLUE tasks (GLUE scores, submission)."""

    stage: Literal["eval"]
    # One task (custom or GLUE): `models` scored on `split`.
    task: Optional[TaskConfig] = Field(None, description="the one task to score models on (or use tasks)")
    split: str = Field("dev", description="task: which split file to score: dev -> dev.tsv")
    models: Optional[dict[str, str]] = Field(
        None, min_length=1, description="task: report row name -> fine-tuned checkpoint folder"
    )
    write_predictions: bool = Field(
        False, description="task: also write predictions/MODEL.tsv (index, predicted label name or score); a split "
        "without labels (test) is then predicted but not scored"
    )
    # GLUE: a map of tasks to checkpoints.
    tasks: Optional[dict[str, GlueTaskEntry]] = Field(
        None, min_length=1, description="GLUE task -> checkpoint folder, list of folders (runs/seeds, aggregated), "
        "or {checkpoints, data_dir}: dev scores, GLUE scores; mnli also scores mnli-mm and predicts AX"
    )
    glue_dir: Optional[InputFolder] = Field(
        None, description="tasks: the GLUE root in download_glue_data.py's layout (CoLA/, SST-2/, ..., MNLI/, "
        "diagnostic/)"
    )
    source: Literal["files", "hub"] = Field(
        "files", description="tasks: files (glue_dir or each data_dir) or hub (nyu-mll/glue; needs a network)"
    )
    max_length: int = Field(128, gt=1, description="tasks: truncate each example to this many tokens")
    submission: bool = Field(
        False, description="tasks: also predict every test file (each task's best checkpoint on dev) into "
        "RUN_DIR/submission.zip for the GLUE leaderboard"
    )
    allow_incomplete: bool = Field(
        False, description="submission: write the archive although tasks are missing (they are listed)"
    )
    batch_size: int = Field(64, gt=0, description="examples per forward pass")
    device: Literal["auto", "cpu"] = Field("auto", description="auto: the GPU when there is one, else the CPU")
    trust_remote_code: bool = Field(
        False, strict=True, description="run Python code shipped with the checkpoints (their config's auto_map); "
        "only for code you have read: false refuses such checkpoints"
    )

    @model_validator(mode="after")
    def _one_task_or_a_map(self) -> "EvalRecipe":
        from finetune.glue.specs import GLUE_TASKS  # late import: specs imports nothing from here

        if (self.task is None) == (self.tasks is None):
            raise ValueError("give task and models (one task) or tasks (GLUE task -> checkpoints), not both"
                             if self.task is not None else "give task and models (one task) or tasks (GLUE tasks)")
        # Keys of the other shape must keep their defaults (a saved, resolved recipe holds every key).
        changed = {key for key, field in type(self).model_fields.items() if getattr(self, key) != field.default}
        if self.task is not None:
            if self.models is None:
                raise ValueError("models: required key is missing (report row name -> checkpoint folder)")
            misplaced = [key for key in GLUE_ONLY_EVAL_KEYS if key in changed]
            if misplaced:
                raise ValueError(f"{', '.join(misplaced)}: only with tasks (GLUE), not with a single task")
            return self
        misplaced = [key for key in SINGLE_TASK_EVAL_KEYS if key in changed]
        if misplaced:
            raise ValueError(f"{', '.join(misplaced)}: only with task; tasks are scored on dev (and test with "
                             "submission)")
        if self.source == "hub" and (self.glue_dir is not None or any(entry.data_dir for entry in self.tasks.values())):
            raise ValueError("source hub reads no folders; remove glue_dir and data_dir")
        for name, entry in self.tasks.items():
            spec = GLUE_TASKS.get(name)
            if spec is None:
                raise ValueError(f"tasks.{name}: not a GLUE task ({', '.join(GLUE_TASKS)}); score a custom task "
                                 "with task and models")
            if spec.predicted_by is not None:
                raise ValueError(f"tasks.{name}: predicted by the {spec.predicted_by} model; give the checkpoints "
                                 f"under tasks.{spec.predicted_by}")
            if self.source == "files" and entry.data_dir is None and self.glue_dir is None:
                raise ValueError(f"tasks.{name}: no data: give its data_dir, or glue_dir for every task")
        if self.allow_incomplete and not self.submission:
            raise ValueError("allow_incomplete applies to submission; set submission: true")
        return self


PretrainRecipe.model_rebuild()  # its discriminative section is defined with the finetune sections below

Recipe = Union[PretrainRecipe, FinetuneRecipe, EvalRecipe]
RECIPE_TYPES: dict[str, type[Section]] = {"pretrain": PretrainRecipe, "finetune": FinetuneRecipe, "eval": EvalRecipe}

# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

_OVERRIDE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)=(.*)$", re.DOTALL)


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a recipe file with the strict safe loader (finetune/safe_yaml.py); any problem is a one-line UserError."""
    if not path.is_file():
        raise UserError(f"recipe {path}: no such file" if not path.is_dir() else f"recipe {path}: a folder, not a file")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except YAMLProblem as problem:
        where = f" line {problem.line}" if problem.line is not None else ""
        raise UserError(f"recipe {path}{where}: {problem.problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"recipe {path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise UserError(f"recipe {path}: expected a mapping of keys at the top level")
    return data


def apply_override(data: dict[str, Any], override: str, source: Path) -> None:
    """Set one dotted `key=value` in the raw recipe; the value is parsed as YAML (`[1, 2]`, `true`, `1e-3`)."""
    match = _OVERRIDE.match(override)
    if not match:
        raise UserError(f"override '{_shortened(override)}': expected key=value, e.g. training.lr=1e-3")
    key, raw_value = match.groups()
    try:
        value = load_yaml(raw_value) if raw_value.strip() else ""
    except YAMLProblem as problem:
        # Never fall back to the raw text: `run_dir=x/[oops` would quietly name a folder `[oops`.
        raise UserError(f"override '{_shortened(override)}': the value is not valid YAML ({problem.problem}); "
                        f"quote it to mean the text itself: {key}='{_shortened(raw_value)}'") from None
    node = data
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"recipe {source}: override '{key}': '{'.'.join(parts[: depth + 1])}' is not a section")
        node = child
    node[parts[-1]] = value


def _format_validation_error(error: ValidationError, source: Path) -> str:
    """All problems of a recipe on one line, each naming its dotted key."""
    problems = []
    for item in error.errors():
        # A model section is validated as its family's type; pydantic puts that tag in the location.
        location = [part for index, part in enumerate(item["loc"])
                    if not (part in MODEL_FAMILIES and index > 0 and item["loc"][index - 1] == "model")]
        key = ".".join(str(part) for part in location)  # empty for checks of the whole recipe: they name their keys
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "union_tag_invalid":
            key, message = f"{key}.family", f"unknown model family {item['ctx']['tag']} (expected {', '.join(MODEL_FAMILIES)})"
        elif item["type"] == "extra_forbidden":
            message = "unknown key"
        elif item["type"] == "missing":
            message = "required key is missing"
        elif "input" in item and not isinstance(item["input"], (dict, list)):
            message += f" (got {_ECHO.repr(item['input'])})"
        problems.append(f"{key}: {message}" if key else message)
    return _shortened(f"recipe {source}: " + "; ".join(problems), MAX_ERROR_LENGTH)


def _bounded_repr() -> reprlib.Repr:
    """repr() that shows a bad value at most a few items and levels deep: errors echo what the user gave, bounded."""
    bounded = reprlib.Repr()  # keyword arguments only from Python 3.12
    bounded.maxlevel, bounded.maxstring, bounded.maxother, bounded.maxlist, bounded.maxdict = 2, 60, 60, 4, 4
    return bounded


_ECHO = _bounded_repr()
MAX_ERROR_LENGTH = 600  # characters of a whole error line


def _shortened(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters with an ellipsis: errors echo what the user gave, never without bound."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def input_path_problems(section: BaseModel, prefix: str = "") -> list[tuple[str, Path, str]]:
    """(dotted key, path, problem) for every input path field (also inside lists and sub-sections) that is missing or of
    the wrong kind: a folder where a file is read, or a file where a folder is."""
    problems = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            problems += input_path_problems(value, key + ".")
            continue
        kind = _input_path_kind(field)
        if value is None or kind is None:
            continue
        for path in (value if isinstance(value, list) else [value]):
            path = Path(path)
            if not path.exists():
                problems.append((key, path, f"no such {kind}: {path}"))
            elif kind == "file" and not path.is_file():
                problems.append((key, path, f"{path} is a folder, not a file" if path.is_dir() else
                                 f"{path}: not a regular file"))
            elif kind == "folder" and not path.is_dir():
                problems.append((key, path, f"{path} is a file, not a folder"))
    return problems


def _input_path_kind(field: Any) -> Optional[str]:
    """"file" or "folder" for `InputFile`/`InputFolder` fields (also optional or in a list), else None."""
    metadata = list(field.metadata)
    for argument in getattr(field.annotation, "__args__", ()):
        metadata += getattr(argument, "__metadata__", ())
    return next((meta.kind for meta in metadata if isinstance(meta, MustExist)), None)


def output_folder_problem(path: Path) -> Optional[str]:
    """Why a folder a run writes into (run_dir, a cache) cannot be used, or None: it is a file, lies inside a
    file, or it (or the folder it would be created in) cannot be written."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    existing = next(folder for folder in (path, *path.absolute().parents) if folder.exists())
    if not existing.is_dir():
        return f"{path} would be inside {existing}, which is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable" + ("" if existing == path else f" (needed to create {path})")
    return None


def run_dir_location_problem(run_dir: Path) -> Optional[str]:
    """Why `run_dir` may never be a run directory, or None: the working folder, a folder above it, the home folder
    (or one above it) or the root would put a run's files, and what `overwrite` removes, among the user's own."""
    if str(run_dir).strip() in ("", "."):
        return "empty or '.': give a folder of its own, e.g. runs/NAME"
    resolved = Path(run_dir).expanduser().resolve()
    working, home = Path.cwd().resolve(), Path.home().resolve()
    if resolved == working or resolved in working.parents:
        return f"{run_dir} is the working folder or a folder above it: give a folder of its own, e.g. runs/NAME"
    if resolved == home or resolved in home.parents:
        return f"{run_dir} is the home folder or a folder above it: give a folder of its own"
    return None


def path_problems(recipe: BaseModel) -> list[tuple[str, str]]:
    """(key, problem) for every path of a recipe that cannot be used: inputs missing or of the wrong kind, output
    folders that cannot be written, a run_dir that would mix a run into the user's own folders."""
    problems = [(key, problem) for key, _, problem in input_path_problems(recipe)]
    outputs = [("run_dir", recipe.run_dir)]
    corpus = getattr(recipe, "corpus", None)
    if corpus is not None and corpus.cache_dir is not None:
        outputs.append(("corpus.cache_dir", corpus.cache_dir))
    location = run_dir_location_problem(recipe.run_dir)
    if location is not None:
        problems.append(("run_dir", location))
    problems += [(key, problem) for key, path in outputs if (problem := output_folder_problem(path)) is not None]
    return problems


def load_recipe(
    path: Path | str,
    overrides: list[str] = (),
    expected_stage: Optional[str] = None,
    check_paths: bool = True,
) -> Recipe:
    """Load, override and validate a recipe; raise UserError naming the key and file on any problem."""
    path = Path(path)
    data = read_yaml(path)
    for override in overrides:
        apply_override(data, override, path)
    stage = data.get("stage")
    if stage not in RECIPE_TYPES:
        raise UserError(f"recipe {path}: stage: expected one of {', '.join(RECIPE_TYPES)} (got {_ECHO.repr(stage)})")
    if expected_stage is not None and stage != expected_stage:
        raise UserError(f"recipe {path}: stage: this is a '{stage}' recipe; run it with `finetune {stage}`")
    try:
        recipe = RECIPE_TYPES[stage].model_validate(data)
    except ValidationError as error:
        raise UserError(_format_validation_error(error, path)) from None
    if check_paths:
        for key, problem in path_problems(recipe):
            raise UserError(f"recipe {path}: {key}: {problem}")
    return recipe


def recipe_to_yaml(recipe: BaseModel) -> str:
    """The fully resolved recipe (defaults filled in) as YAML, as saved in the run directory."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def describe_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every key of a recipe type, for `finetune recipes --keys`."""
    rows = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        section = annotation
        if get_origin(section) is Union and len(get_args(section)) == 2 and type(None) in get_args(section):
            section = next(argument for argument in get_args(section) if argument is not type(None))
        if isinstance(section, type) and issubclass(section, BaseModel):
            rows += describe_keys(section, f"{prefix}{name}.")
            continue
        if _section_variants(annotation):
            rows += _describe_variants(_section_variants(annotation), f"{prefix}{name}.")
            continue
        if field.is_required():
            default = "(required)"
        elif field.default_factory is not None:
            default = repr(field.default_factory())
        else:
            default = repr(field.default)
        rows.append((f"{prefix}{name}", type_label(annotation), default, field.description or ""))
    return rows


def _section_variants(annotation: Any) -> list[type[BaseModel]]:
    """The section types of a field that is one of several sections (the model families), else []."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is not Union:
        return []
    members = [get_args(member)[0] if get_origin(member) is Annotated else member for member in get_args(annotation)]
    return members if all(isinstance(member, type) and issubclass(member, BaseModel) for member in members) else []


def _describe_variants(variants: list[type[BaseModel]], prefix: str) -> list[tuple[str, str, str, str]]:
    """Keys of alternative sections (one per model family), each marked with the families it applies to."""
    rows: dict[tuple[str, str], tuple[str, str, str, str]] = {}  # (key, meaning) -> row: same key, other meaning
    families: dict[tuple[str, str], list[str]] = {}
    for variant in variants:
        family = type_label(variant.model_fields["family"].annotation)
        for row in describe_keys(variant, prefix):
            identity = (row[0], "" if row[0] == f"{prefix}family" else row[3])
            rows.setdefault(identity, row)
            families.setdefault(identity, []).append(family)
    described = []
    for identity, (key, label, default, meaning) in rows.items():
        if key == f"{prefix}family":
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
    if origin is Union:
        labels = [type_label(argument) for argument in arguments if argument is not type(None)]
        return " or ".join(labels) + (" or null" if type(None) in arguments else "")
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_label(a) for a in arguments)}]"
    return getattr(annotation, "__name__", str(annotation))


# ---------------------------------------------------------------------------------------------
# ulmfit: the three stages of ULMFiT as one recipe
# ---------------------------------------------------------------------------------------------

# Each stage's folder inside the flow's run_dir; a stage's checkpoint is FOLDER/checkpoint (the stages' CHECKPOINT_DIR).
ULMFIT_STAGE_FOLDERS = {"general_lm": "1-general-lm", "target_lm": "2-target-lm", "classifier": "3-classifier"}
ULMFIT_UPSTREAM = {"target_lm": "general_lm", "classifier": "target_lm"}  # whose checkpoint a stage starts from
FLOW_SET_KEYS = ("stage", "run_dir", "description", "overwrite")  # a section's keys that the flow sets itself
ULMFIT_STAGE_DESCRIPTIONS = {  # fixed, so that a new top-level description does not stop --resume of a stage
    "general_lm": "ulmfit stage 1 of 3: general-domain language model",
    "target_lm": "ulmfit stage 2 of 3: the language model fine-tuned on the target task's text",
    "classifier": "ulmfit stage 3 of 3: the classifier on the fine-tuned language model",
}


class PretrainedLanguageModel(Section):
    """`general_lm: {checkpoint: PATH}`: no stage 1; stage 2 continues this language model (e.g. a downloaded one)."""

    checkpoint: InputFolder = Field(description="a language model checkpoint folder of the family target_lm trains")


class UlmfitRecipe(RunRecipe):
    """`finetune ulmfit`: ULMFiT's three stages as one run; each section is the body of its stage's recipe.

    The flow sets what wires the stages together (each section's stage, run_dir, description and overwrite, and
    the model.checkpoint of stages 2 and 3), so a section that gives them is refused rather than silently ignored.
    """

    stage: Literal["ulmfit"]
    seed: Seed = Field(0, description="the seed of every stage whose section gives none")
    general_lm: Union[PretrainRecipe, PretrainedLanguageModel] = Field(
        description="stage 1, into RUN_DIR/1-general-lm: a pretrain recipe without stage and run_dir (model.family "
        "defaults to awd_lstm), or {checkpoint: PATH} to start stage 2 from an existing language model")
    target_lm: PretrainRecipe = Field(
        description="stage 2, into RUN_DIR/2-target-lm: a pretrain recipe without stage, run_dir and "
        "model.checkpoint (stage 1's; model.family defaults to stage 1's); e.g. corpus.task, "
        "tokenizer.new_vocabulary, discriminative.factor 2.6")
    classifier: FinetuneRecipe = Field(
        description="stage 3, into RUN_DIR/3-classifier: a finetune recipe without stage, run_dir and "
        "model.checkpoint (stage 2's)")

    @model_validator(mode="before")
    @classmethod
    def _wire_stages(cls, data: Any) -> Any:
        """Give each section what the flow decides for it, so the stage recipe classes validate it as written."""
        if not isinstance(data, dict):
            return data
        run_dir = data.get("run_dir")
        # An unusable run_dir is reported at the top level; a placeholder keeps the sections from repeating it.
        base = Path(run_dir).expanduser() if isinstance(run_dir, str) and run_dir.strip() else Path("run_dir")
        general = data.get("general_lm")
        skipped = isinstance(general, dict) and "checkpoint" in general
        if skipped and len(general) > 1:
            raise ValueError("general_lm: give either {checkpoint: PATH} (no stage 1) or a pretrain recipe, not both "
                             f"(remove {', '.join(sorted(str(key) for key in general if key != 'checkpoint'))})")
        checkpoints = {"general_lm": general["checkpoint"] if skipped else str(base / "1-general-lm" / "checkpoint"),
                       "target_lm": str(base / "2-target-lm" / "checkpoint")}
        seed = data.get("seed", 0)
        general_model = general.get("model") if isinstance(general, dict) else None
        # Stage 2 continues stage 1's model: its family unless the section names one; ULMFiT's AWD-LSTM by default.
        family = general_model.get("family", "awd_lstm") if isinstance(general_model, dict) else "awd_lstm"
        wired = dict(data)
        for section, folder in ULMFIT_STAGE_FOLDERS.items():
            body = data.get(section)
            if not isinstance(body, dict) or (section == "general_lm" and skipped):
                continue
            model = body.get("model", {})
            _refuse_flow_keys(section, body, model, base / folder)
            body = {**body, "stage": "finetune" if section == "classifier" else "pretrain",
                    "run_dir": str(base / folder), "description": ULMFIT_STAGE_DESCRIPTIONS[section]}
            if "seed" not in body and isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32:
                body["seed"] = seed  # an invalid top-level seed is reported once, at the top level
            if isinstance(model, dict) and section != "classifier":
                model = {"family": family, **model}
            if isinstance(model, dict) and section in ULMFIT_UPSTREAM:
                model = {**model, "checkpoint": checkpoints[ULMFIT_UPSTREAM[section]]}
            wired[section] = {**body, "model": model}
        return wired

    @field_validator("general_lm", mode="wrap")
    @classmethod
    def _one_form(cls, value: Any, handler: Any) -> Any:
        """Validate the section as the form it is written in, so that errors name its keys, not both forms' keys."""
        if isinstance(value, dict):
            form = PretrainedLanguageModel if "checkpoint" in value else PretrainRecipe
            return form.model_validate(value)  # pydantic reports its errors under general_lm.KEY
        if isinstance(value, (PretrainRecipe, PretrainedLanguageModel)):
            return handler(value)
        raise ValueError("expected a pretrain recipe (without stage and run_dir) or {checkpoint: PATH}")

    @model_validator(mode="after")
    def _same_family(self) -> "UlmfitRecipe":
        general = self.general_lm
        if isinstance(general, PretrainRecipe) and general.model.family != self.target_lm.model.family:
            raise ValueError(f"target_lm.model.family: {self.target_lm.model.family}, but general_lm trains a "
                             f"{general.model.family} model, which stage 2 continues")
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> dict[str, Any]:
        """The recipe without what the flow set, so that a saved flow recipe loads again (defaults stay filled in,
        but for the continued model of stage 2: its architecture comes from stage 1, and the model section may not
        name it)."""
        data = handler(self)
        for section in ULMFIT_STAGE_FOLDERS:
            body = data.get(section)
            if isinstance(body, dict) and "stage" in body:  # a stage recipe, not {checkpoint: PATH}
                for key in FLOW_SET_KEYS:
                    body.pop(key, None)
                if section in ULMFIT_UPSTREAM:
                    body["model"].pop("checkpoint", None)
        written = self.target_lm.model.model_fields_set
        data["target_lm"]["model"] = {key: value for key, value in data["target_lm"]["model"].items() if key in written}
        return data

    def stage_recipes(self) -> dict[str, Optional[TrainingRunRecipe]]:
        """Section name -> the stage's recipe as the flow runs it (general_lm: None when a checkpoint replaces it)."""
        general = self.general_lm if isinstance(self.general_lm, PretrainRecipe) else None
        return {"general_lm": general, "target_lm": self.target_lm, "classifier": self.classifier}


def _refuse_flow_keys(section: str, body: dict[str, Any], model: Any, folder: Path) -> None:
    """A section may not set what the flow wires: one line naming the first such key and what the flow uses."""
    given = [key for key in FLOW_SET_KEYS if key in body]
    if given:
        key = given[0]
        why = {"stage": "the ulmfit flow knows each section's stage", "run_dir": f"the ulmfit flow runs this stage in "
               f"{folder}"}.get(key, f"only the ulmfit recipe's own (top-level) {key} applies")
        raise ValueError(f"{section}.{key}: {why}; remove it")
    if section in ULMFIT_UPSTREAM and isinstance(model, dict) and "checkpoint" in model:
        raise ValueError(f"{section}.model.checkpoint: the ulmfit flow starts this stage from the "
                         f"{ULMFIT_UPSTREAM[section]} stage's checkpoint; remove it")


RECIPE_TYPES["ulmfit"] = UlmfitRecipe
