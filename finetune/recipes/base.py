"""What every stage's recipe shares: the strict Section base, path markers, training, schedule and task sections,
and the run recipe bases (stage, run_dir, periodic checkpoints)."""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from finetune.glue.specs import GLUE_TASKS, label_text, template_columns


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


def _bounded_repr() -> reprlib.Repr:
    """repr() that shows a bad value at most a few items and levels deep: errors echo what the user gave, bounded."""
    bounded = reprlib.Repr()  # keyword arguments only from Python 3.12
    bounded.maxlevel, bounded.maxstring, bounded.maxother, bounded.maxlist, bounded.maxdict = 2, 60, 60, 4, 4
    return bounded


ECHO = _bounded_repr()  # echoes a user's value in an error, cut to a readable length


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
    group_by_length: bool = Field(
        True,
        description="finetune: batches of examples of similar length (sorted within chunks of 50 shuffled "
        "batches, then the batches shuffled; fastai's SortishSampler): ~3x less padding on GLUE; false: plain shuffle",
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
        if isinstance(names, list) and names:
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


SPAN_KEYS = ("doc_stride", "n_best", "max_answer_length", "null_threshold")  # task keys of kind spans only


class TaskConfig(Section):
    """A classification or regression task: a GLUE task by name, or a custom one described here."""

    name: str = Field(
        description="a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, mnli-mm, qnli, rte, wnli, ax) or a custom name"
    )
    kind: Literal["classification", "tokens", "choices", "spans", "multilabel"] = Field(
        "classification",
        description="classification: a class (or a score) per example, from its text or sentence "
        "pair; tokens: a tag per word (named entities, parts of speech), from CoNLL column files (format: conll); "
        "choices: the right answer among each question's choices, from JSON Lines in ARC's layout; spans: extractive "
        "question answering, an answer cut from a context, from SQuAD JSON files (v1.1, v2.0); multilabel: any number "
        "of labels per example (label_column holding a list, or label_columns of 0/1)",
    )
    data_dir: InputFolder | None = Field(
        None,
        description="folder with the task's files: train.tsv / dev.tsv / test.tsv in the GLUE layout (a custom "
        "task: train / dev / test, each .tsv, .csv or .jsonl); not with source hub",
    )
    source: Literal["files", "hub"] = Field(
        "files", description="files: read data_dir; hub: a GLUE task from the hub's nyu-mll/glue (needs a network)"
    )
    max_length: int | None = Field(
        None,
        gt=1,
        description="tokens the model reads per example (long_documents says what becomes of longer "
        "ones); null: 128 for a transformer, the whole document for an AWD-LSTM (read in BPT3C chunks); in an eval "
        "recipe null: each checkpoint's own",
    )
    long_documents: LongDocumentsConfig | None = Field(
        None,
        description="examples longer than max_length: truncate, head_tail or chunks (a word, or a section with "
        "its keys); null: truncate (in an eval recipe: each checkpoint's own)",
    )

    @field_validator("long_documents", mode="before")
    @classmethod
    def _mode_alone(cls, value: Any) -> Any:
        """`long_documents: chunks` is short for `long_documents: {mode: chunks}`."""
        return {"mode": value} if isinstance(value, str) else value

    both_orders: bool = Field(
        False,
        description="GPT's similarity transformation for a symmetric pair task (STS-B, MRPC, QQP): each pair "
        "read as (a, b) and (b, a), their representations added before the linear head (their logits summed); for "
        "decoder backbones (gpt2), which read a pair in one direction",
    )

    # Custom tasks only (a GLUE task brings its own):
    text_columns: list[str] | None = Field(
        None,
        min_length=1,
        description="custom: the text columns; two are a sentence pair and more are joined into "
        "one text, unless pair or text says otherwise",
    )
    pair: bool | None = Field(
        None,
        description="custom: true: the 2 text_columns are a sentence pair (the model is shown where the first "
        "ends: BERT's [SEP] and segment ids); false: the columns joined with a space into one text; null: a pair for "
        "2 columns, joined for more",
    )
    text: str | None = Field(
        None,
        description="custom: the one text the model reads, each {column} filled in from the file, e.g. "
        "'{Title}. {Description}'; text_columns may be left out (these are the columns)",
    )
    label_column: str | None = Field(None, description="custom: the label column")
    labels: list[str] | None = Field(
        None,
        min_length=2,
        description="custom: the labels as the files write them, compared as text (1 is the text "
        "1, true is true; quote anything else YAML would change: '1.0', 'yes', 'True'); omit for regression",
    )
    label_names: dict[str, Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        description="custom: names for the labels, e.g. {1: World, 2: Sports}, used by reports, predictions "
        "and the model's id2label; a label without one keeps its text",
    )

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_written(cls, labels: Any) -> Any:
        """YAML gives unquoted numbers and booleans as such: each stands for its text in the files."""
        return [_label_as_text(label) for label in labels] if isinstance(labels, list) else labels

    @field_validator("label_names", mode="before")
    @classmethod
    def _named_labels_as_written(cls, names: Any) -> Any:
        return {_label_as_text(label): name for label, name in names.items()} if isinstance(names, dict) else names

    @field_validator("labels", "text_columns", "label_columns")
    @classmethod
    def _distinct(cls, names: list[str] | None) -> list[str] | None:
        listed = names or []
        repeated = sorted({name for name in listed if listed.count(name) > 1})
        if repeated:
            raise ValueError(f"'{repeated[0]}' is listed twice")
        return names

    metrics: list[Literal["accuracy", "f1", "mcc", "pearson", "spearman"]] | None = Field(
        None, min_length=1, description="custom: metrics to report, the first one selects the best model"
    )
    format: Literal["tsv", "csv", "jsonl", "conll"] | None = Field(
        None,
        description="custom: how the files are read; null: by each file's extension (.tsv, .csv, .jsonl); "
        "conll (kind tokens): a word and its columns per line, a blank line between sentences",
    )
    tag_column: int = Field(
        -1,
        description="kind tokens: the column of each line that holds the tag (0 is the word; -1, the last: "
        "CoNLL-2003's named entities)",
    )
    files: dict[str, str] | None = Field(
        None,
        description="custom: split -> file name in data_dir; null: train, dev and test with the format's "
        "extension, or without format whichever of .tsv, .csv and .jsonl is there",
    )
    index_column: str | None = Field(None, description="custom: the id column of test files; null: index")
    # Question answering (kind spans) only; null: the defaults (in an eval recipe: each checkpoint's own).
    doc_stride: int | None = Field(
        None,
        gt=0,
        description="kind spans: tokens two windows of a long context share; null: a third of max_length "
        "(128 of the default 384)",
    )
    n_best: int | None = Field(
        None, gt=0, description="kind spans: the best starts and ends paired per window; null: 20"
    )
    max_answer_length: int | None = Field(None, gt=0, description="kind spans: the longest answer, in tokens; null: 30")
    null_threshold: float | None = Field(
        None,
        description="kind spans, SQuAD 2.0: no answer when the no-answer score beats the best span's by more "
        "than this; null: 0.0 (eval reports the threshold that would have scored best on its split)",
    )

    # Multi-label tasks (kind multilabel) only:
    label_columns: list[str] | None = Field(
        None,
        min_length=2,
        description="kind multilabel: one 0/1 column per label, named by the label (instead of label_column)",
    )
    label_separator: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="kind multilabel: what separates the labels of a label_column in TSV/CSV files (e.g. "
        "PER|LOC); null: |. A JSON list (a JSON Lines value, or a field that starts with [) is read as one",
    )
    threshold: Annotated[float, Field(gt=0, lt=1)] | Literal["dev"] | None = Field(
        None,
        description="kind multilabel: a label is predicted when its probability is above this; dev: the "
        "threshold that maximises micro F1 on dev, chosen at each evaluation and saved with the checkpoint; null: "
        "0.5 (in an eval recipe: each checkpoint's own)",
    )

    @model_validator(mode="after")
    def _custom_or_known(self) -> TaskConfig:
        multilabel_keys = [
            key for key in ("label_columns", "label_separator", "threshold") if getattr(self, key) is not None
        ]
        if multilabel_keys and self.kind != "multilabel":
            raise ValueError(f"{', '.join(multilabel_keys)}: for multi-label tasks (kind: multilabel)")
        if self.both_orders:
            both_orders_refused = "both_orders reads a sentence pair twice, each order truncated: not with "
            if self.kind != "classification":
                raise ValueError(both_orders_refused + "kind " + self.kind)
            if self.long_documents is not None and self.long_documents.mode != "truncate":
                raise ValueError(both_orders_refused + f"long_documents {self.long_documents.mode}")
        if self.kind == "spans":
            return self._check_spans()
        span_keys = [key for key in SPAN_KEYS if getattr(self, key) is not None]
        if span_keys:
            raise ValueError(f"{', '.join(span_keys)}: for question answering (kind: spans)")
        if self.kind == "tokens":
            return self._check_tagging()
        if self.kind == "choices":
            return self._check_choices()
        if self.format == "conll" or self.tag_column != TaskConfig.model_fields["tag_column"].default:
            raise ValueError(
                f"{'format: conll' if self.format == 'conll' else 'tag_column'} is for tagging tasks (kind: tokens)"
            )
        if self.kind == "multilabel":
            return self._check_multilabel()
        custom_keys = [
            k
            for k in (
                "text_columns",
                "pair",
                "text",
                "label_column",
                "labels",
                "label_names",
                "metrics",
                "format",
                "files",
                "index_column",
            )
            if getattr(self, k) is not None
        ]
        if (self.source == "files") == (self.data_dir is None):
            raise ValueError(
                "give data_dir (source files) or source hub, not both"
                if self.data_dir is not None
                else "data_dir is required (or source: hub for a GLUE task)"
            )
        if self.name in GLUE_TASKS:
            if custom_keys:
                raise ValueError(f"'{self.name}' is a GLUE task with its own columns; remove {', '.join(custom_keys)}")
        elif self.source == "hub":
            raise ValueError(f"source hub reads GLUE tasks; '{self.name}' is a custom task: give data_dir")
        elif (self.text_columns is None and self.text is None) or self.label_column is None:
            known = ", ".join(sorted(GLUE_TASKS))
            raise ValueError(
                f"unknown task '{self.name}' (GLUE tasks: {known}); a custom task needs text_columns (or text) and "
                "label_column"
            )
        else:
            self._check_text_and_labels()
        regression = self.labels is None
        for metric in self.metrics or []:
            if (metric in ("pearson", "spearman")) != regression:
                kind = "regression (no labels)" if metric in ("pearson", "spearman") else "classification (labels)"
                raise ValueError(f"metric {metric} is for {kind} tasks")
            if metric == "f1" and self.labels is not None and len(self.labels) != 2:  # no labels: refused above
                raise ValueError(f"metric f1 (of the positive class) needs 2 labels, not {len(self.labels)}")
        return self

    def _check_tagging(self) -> TaskConfig:
        """A tagging task reads CoNLL column files of its own; the keys of sentence classification do not apply."""
        if self.data_dir is None or self.source == "hub":
            raise ValueError("kind tokens reads CoNLL column files: give data_dir")
        if self.name in GLUE_TASKS:
            raise ValueError(f"'{self.name}' is a GLUE task (kind classification); name the tagging task otherwise")
        if self.format not in (None, "conll"):
            raise ValueError(f"format {self.format}: a tagging task reads CoNLL column files (format: conll)")
        other = [
            key
            for key in (
                "text_columns",
                "pair",
                "text",
                "label_column",
                "label_names",
                "metrics",
                "index_column",
                "long_documents",
            )
            if getattr(self, key) is not None
        ]
        if other:
            raise ValueError(
                f"{', '.join(other)}: not for kind tokens (each line's first column is the word, tag_column its tag)"
            )
        return self

    def _check_choices(self) -> TaskConfig:
        """A multiple-choice task reads JSON Lines in ARC's layout (id, question: stem and choices, answerKey): the
        keys of sentence classification and tagging do not apply."""
        if self.data_dir is None or self.source == "hub":
            raise ValueError("kind choices reads JSON Lines files in ARC's layout: give data_dir")
        if self.name in GLUE_TASKS:
            raise ValueError(
                f"'{self.name}' is a GLUE task (kind classification); name the multiple-choice task otherwise"
            )
        if self.format not in (None, "jsonl"):
            raise ValueError(
                f"format {self.format}: a multiple-choice task reads JSON Lines in ARC's layout (format: jsonl)"
            )
        other = [
            key
            for key in (
                "text_columns",
                "pair",
                "text",
                "label_column",
                "labels",
                "label_names",
                "metrics",
                "index_column",
                "long_documents",
            )
            if getattr(self, key) is not None
        ]
        if self.tag_column != TaskConfig.model_fields["tag_column"].default:
            other.append("tag_column")
        if other:
            raise ValueError(
                f"{', '.join(other)}: not for kind choices (each line holds a question, its choices with "
                "their labels and the answerKey)"
            )
        return self

    def _check_spans(self) -> TaskConfig:
        """A question-answering task reads SQuAD JSON files; the keys of classification and tagging do not apply."""
        if self.data_dir is None or self.source == "hub":
            raise ValueError("kind spans reads SQuAD JSON files: give data_dir")
        if self.name in GLUE_TASKS:
            raise ValueError(
                f"'{self.name}' is a GLUE task (kind classification); name the question-answering task otherwise"
            )
        if self.format is not None:
            raise ValueError(
                f"format {self.format}: a question-answering task reads SQuAD JSON files (leave format out)"
            )
        other = [
            key
            for key in (
                "text_columns",
                "pair",
                "text",
                "label_column",
                "labels",
                "label_names",
                "metrics",
                "index_column",
                "long_documents",
            )
            if getattr(self, key) is not None
        ]
        if self.tag_column != TaskConfig.model_fields["tag_column"].default:
            other.append("tag_column")
        if other:
            raise ValueError(
                f"{', '.join(other)}: not for kind spans (SQuAD files hold the questions, contexts and "
                "answers; long contexts are read in windows: doc_stride)"
            )
        if self.doc_stride is not None and self.max_length is not None and self.doc_stride >= self.max_length // 2:
            raise ValueError(
                f"doc_stride {self.doc_stride}: windows of max_length {self.max_length} tokens need "
                f"a doc_stride below half of it ({self.max_length // 2}), room left for the question"
            )
        return self

    def _check_multilabel(self) -> TaskConfig:
        """A multi-label task is a custom task whose label is a set: a list column, or a 0/1 column per label."""
        if self.data_dir is None or self.source == "hub":
            raise ValueError("kind multilabel reads the task's files: give data_dir")
        if self.name in GLUE_TASKS:
            raise ValueError(f"'{self.name}' is a GLUE task (kind classification); name the multi-label task otherwise")
        if self.text_columns is None and self.text is None:
            raise ValueError("kind multilabel needs text_columns (or text)")
        if (self.label_column is None) == (self.label_columns is None):
            both = ", not both" if self.label_column is not None else ""
            raise ValueError(
                "kind multilabel needs label_column (a list of labels per example) or label_columns "
                f"(a 0/1 column per label){both}"
            )
        if self.label_column is not None and self.labels is None:
            raise ValueError("labels: list the label set (label_column holds lists of them)")
        if self.label_columns is not None:
            if self.labels is not None:
                raise ValueError("labels: with label_columns the columns name the labels; leave labels out")
            if self.label_separator is not None:
                raise ValueError("label_separator: for a label_column holding lists, not label_columns")
        # one of label_column and label_columns, and text_columns or text, is given (checked above)
        label_columns = self.label_columns or ([self.label_column] if self.label_column is not None else [])
        text_columns = self.text_columns or (template_columns(self.text) if self.text is not None else [])
        shared = set(label_columns) & set(text_columns)
        if shared:
            raise ValueError(f"'{sorted(shared)[0]}' is both a text column and a label column")
        other = [key for key in ("label_names", "metrics") if getattr(self, key) is not None]
        if other:
            raise ValueError(
                f"{', '.join(other)}: not for kind multilabel (its scores are micro F1, macro F1 and subset accuracy)"
            )
        self._check_text_and_labels()
        return self

    def _check_text_and_labels(self) -> None:
        """A custom task's text is one text or a pair, and its label names name labels, each class its own name."""
        if self.text is not None:
            named = template_columns(self.text)
            if not named:
                raise ValueError(
                    f"text: name the columns in braces, e.g. '{{Title}}. {{Description}}' (got {ECHO.repr(self.text)})"
                )
            if self.pair:
                raise ValueError("pair: true reads two columns as a pair, text makes one text of them: give one")
            if self.text_columns is not None and set(self.text_columns) != set(named):
                raise ValueError(
                    f"text names the columns {', '.join(named)}, text_columns {', '.join(self.text_columns)}"
                    ": give the same columns, or leave text_columns out"
                )
        elif self.pair and len(self.text_columns or ()) != 2:  # text_columns is given when text is not (callers)
            raise ValueError(
                f"pair: true needs 2 text_columns, not {len(self.text_columns or ())}; pair: false joins them "
                "into one text, and text (e.g. '{A}. {B}') says how"
            )
        if self.label_names is not None:
            if self.labels is None:
                raise ValueError("label_names: a regression task (no labels) has no classes to name")
            unknown = [label for label in self.label_names if label not in self.labels]
            if unknown:
                raise ValueError(f"label_names: '{unknown[0]}' is not one of the labels ({', '.join(self.labels)})")
            names = [self.label_names.get(label, label) for label in self.labels]
            repeated = next((name for name in names if names.count(name) > 1), None)
            if repeated is not None:
                raise ValueError(f"label_names: two labels would both be called '{repeated}'")

    @property
    def reads_a_pair(self) -> bool:
        """Whether a custom task's model reads its two text columns as a sentence pair (pair, or two columns)."""
        return self.text is None and (self.pair if self.pair is not None else len(self.text_columns or ()) == 2)


def _label_as_text(label: Any) -> Any:
    """A label as its text in the files; a decimal number is refused, since YAML may not keep how it is written."""
    if isinstance(label, float):
        raise ValueError(
            f"{label!r} is a decimal number, which YAML may not keep as the files write it: quote the "
            f"label as written there (e.g. '{label!r}')"
        )
    return label_text(label)


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
