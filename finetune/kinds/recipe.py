"""What the task sections of every kind share (kinds/K/recipe.py holds each kind's own keys): the task's name, its
folder, how much of an example is read; and the custom text task's keys of the sequence-classification kinds.

A recipe's `task` is one of these sections, chosen by its `kind` (recipes/task.py: the discriminated union), so a key
of another kind is an unknown key of this one, reported with the kinds it belongs to (recipes/loader.py). Each
section builds its task's TaskSpec (`spec()`): what reading, scoring and predicting use.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from finetune.glue.specs import GLUE_TASKS
from finetune.recipes.base import ECHO, InputFolder, LongDocumentsConfig, Section
from finetune.tasks.specs import STANDARD_FILES, TaskSpec, label_text, template_columns


class OwnHead(NamedTuple):
    """A task kind whose model is its family's own per token or per choice, not a pooled classifier."""

    pooling_refused: str  # why a pooling key does not apply (after "pooling: VALUE ")
    called: str  # what the model is instead of a classifier
    default_why: str  # the run summary's reason for its pooling: model


class TaskSection(Section):
    """The keys of every task kind."""

    kind_name: ClassVar[str]  # the section's `kind`
    # transformers' Auto class of the kind's model (AutoModelForTokenClassification, ...), by name: the recipes layer
    # imports no transformers. The kind object gives the class (TaskKind.auto_class); the models layer, below the
    # kinds', finds each kind's head by it (models/task_heads.py).
    auto_class_name: ClassVar[str]
    own_head: ClassVar[OwnHead | None] = None  # None: a pooled sequence classifier (pooling, a backward LM apply)
    # The training keys that change the kind's loss (recipes/finetune.py refuses the others on its tasks).
    loss_keys: ClassVar[tuple[str, ...]] = ()
    trains_on_pairs: ClassVar[bool] = False  # method contrastive (SetFit's pairs of rows of the same class or not)
    self_trains: ClassVar[bool] = False  # unlabelled_text: one class per row, a probability to be confident of
    distils: ClassVar[bool] = False  # distillation: a teacher's logits as soft targets (kinds/distillation.py)
    distils_unlabelled: ClassVar[bool] = False  # distillation: the teacher labels unlabelled_text for it too
    # The calibration methods (recipes/finetune.py's `calibration`, besides none) that fit the kind's outputs.
    calibrations: ClassVar[tuple[str, ...]] = ()

    name: str = Field(
        description="a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, mnli-mm, qnli, rte, wnli, ax) or a custom name"
    )
    data_dir: InputFolder | None = Field(
        None,
        description="folder with the task's files: train.tsv / dev.tsv / test.tsv in the GLUE layout (a custom "
        "task: train / dev / test, each .tsv, .csv or .jsonl); not with source hub",
    )
    max_length: int | None = Field(
        None,
        gt=1,
        description="tokens the model reads per example (long_documents says what becomes of longer "
        "ones); null: 128 for a transformer, the whole document for an AWD-LSTM (read in BPT3C chunks); in an eval "
        "recipe null: each checkpoint's own",
    )
    files: dict[str, str] | None = Field(
        None,
        description="custom: split -> file name in data_dir; null: train, dev and test with the format's "
        "extension, or without format whichever of .tsv, .csv and .jsonl is there",
    )

    dev_split: float | None = Field(
        None,
        description="for a task without a dev file: this share of the training rows (e.g. 0.1) is held out as "
        "dev, stratified by label for classification, drawn with the recipe's seed; the rows taken are written to "
        "RUN_DIR/dev_split.json, which --resume, a re-run and `finetune eval` of the run read",
    )

    @field_validator("dev_split", mode="before")
    @classmethod
    def _a_share(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1):
            raise ValueError("a share of the training rows, above 0 and below 1")  # the key and value: the formatter
        return value

    def computable_metrics(self) -> tuple[str, ...]:
        """The metrics the task could report: its own, and where the kind has a `metrics` key, every one it takes."""
        return self.spec().metrics

    def computing(self, metric: str) -> TaskSection | None:
        """This section with `metric` reported last (metric_for_best names a metric the task can compute but does
        not list), or None where it cannot compute it or already does."""
        listed = self.spec().metrics
        if metric in listed or metric not in self.computable_metrics():
            return None
        return self.model_copy(update={"metrics": [*listed, metric]})  # only kinds with a metrics key get here

    def weighed_labels(self) -> tuple[str, ...]:
        """What training.class_weights or pos_weight may name: the labels as the files write them, and their
        names."""
        spec = self.spec()
        return tuple(spec.labels or ()) + tuple(spec.file_labels or ())

    @model_validator(mode="before")
    @classmethod
    def _other_kinds_keys_left_at_their_defaults(cls, data: Any) -> Any:
        """Drop a key of other kinds that holds its default: every recipe saved before the kinds had sections of
        their own (finetune_recipe.yaml beside each checkpoint) writes all of the one section's keys, null or not."""
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if key in cls.model_fields or not _a_default(key, value)}

    def spec(self) -> TaskSpec:
        """The task's spec: what reading, scoring and predicting its examples use."""
        raise NotImplementedError


class DrawnRowsKeys(Section):
    """`task.labels_per_class`, the key of the kinds whose training rows can be drawn class by class (classification,
    multilabel): few labels, drawn again and again (the finetune recipe's draw and draws)."""

    labels_per_class: int | None = Field(
        None,
        description="few labels: the training rows become this many rows of each class, drawn at random after "
        "dev_split's hold-out with the recipe's draw as seed (draws runs several draws); a class with fewer rows "
        "gives all of them, said in one line; kind multilabel: at least this many rows of each label and of rows "
        "without one, rarest label first; the rows taken go to RUN_DIR/labelled_rows.json; null: every training row",
    )

    @field_validator("labels_per_class", mode="before")
    @classmethod
    def _a_row_count(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError("a number of training rows per class, 1 or more (null: every training row)")
        return value


class OwnFilesSection(TaskSection):
    """A task read from files of its kind's own layout (CoNLL, ARC's JSON Lines, SQuAD JSON) in data_dir."""

    reads: ClassVar[str]  # what its files are, for "kind K reads ...: give data_dir"

    @model_validator(mode="after")
    def _files_of_its_own(self) -> OwnFilesSection:
        """It reads data_dir, and a GLUE task's name is not its to take."""
        if self.data_dir is None:
            raise ValueError(f"kind {self.kind_name} reads {self.reads}: give data_dir")
        if self.name in GLUE_TASKS:
            kind = GLUE_TASKS[self.name].kind
            raise ValueError(f"'{self.name}' is a GLUE task (kind {kind}); name the task otherwise")
        return self


def _sections(section: type[TaskSection] = TaskSection) -> list[type[TaskSection]]:
    """Every task section class, the kinds' and their bases."""
    return [section] + [sub for child in section.__subclasses__() for sub in _sections(child)]


def _a_default(key: str, value: Any) -> bool:
    """Whether `value` is the default of `key` in a task section that has it (null, -1, false, files, ...)."""
    fields = [section.model_fields[key] for section in _sections() if key in section.model_fields]
    return any(not field.is_required() and field.default_factory is None and field.default == value for field in fields)


def label_as_text(label: Any) -> Any:
    """A label as its text in the files; a decimal number is refused, since YAML may not keep how it is written."""
    if isinstance(label, float):
        raise ValueError(
            f"{label!r} is a decimal number, which YAML may not keep as the files write it: quote the "
            f"label as written there (e.g. '{label!r}')"
        )
    return label_text(label)


def distinct(names: list[str] | None) -> list[str] | None:
    """`names` when none is listed twice."""
    listed = names or []
    repeated = sorted({name for name in listed if listed.count(name) > 1})
    if repeated:
        raise ValueError(f"'{repeated[0]}' is listed twice")
    return names


class HubDatasetSection(Section):
    """`task.hub`: the `datasets` dataset a custom task's rows come from (source hub), written into the run folder."""

    name: str = Field(
        min_length=1,
        description="a dataset on the hub (e.g. imdb), a folder saved with save_to_disk, or a builder for local "
        "files (csv, json, parquet) with data_files",
    )
    config: str | None = Field(None, description="the dataset's configuration (load_dataset's second argument)")
    data_files: dict[str, str | list[str]] | None = Field(
        None, description="builder csv, json or parquet: the dataset's split -> local file(s)"
    )
    splits: dict[str, str] = Field(
        default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"},
        description="the task's split (train, dev, test) -> the dataset's split; a task split left out is not written",
    )

    @field_validator("splits")
    @classmethod
    def _task_splits(cls, splits: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(splits) - {"train", "dev", "test"})
        if unknown:
            raise ValueError(f"'{unknown[0]}' is not a task split (train, dev, test)")
        return splits


class TextTaskSection(TaskSection):
    """A task whose examples are rows of text columns (TSV, CSV, JSON Lines): the sequence-classification kinds."""

    auto_class_name: ClassVar[str] = "AutoModelForSequenceClassification"

    source: Literal["files", "hub"] = Field(
        "files",
        description="files: read data_dir; hub: a GLUE task from the hub's nyu-mll/glue, or a custom task's rows "
        "from the dataset of `hub` (written to RUN_DIR/data when the run starts)",
    )
    hub: HubDatasetSection | None = Field(
        None,
        description="source hub, a custom task: the dataset its rows come from; text_columns and label_column name "
        "its columns (class ids are written as their names)",
    )
    long_documents: LongDocumentsConfig | None = Field(
        None,
        description="examples longer than max_length: truncate, head_tail or chunks (a word, or a section with "
        "its keys); null: truncate (in an eval recipe: each checkpoint's own)",
    )
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
    format: Literal["tsv", "csv", "jsonl"] | None = Field(
        None, description="custom: how the files are read; null: by each file's extension (.tsv, .csv, .jsonl)"
    )
    index_column: str | None = Field(None, description="custom: the id column of test files; null: index")
    both_orders: bool = Field(
        False,
        description="GPT's similarity transformation for a symmetric pair task (STS-B, MRPC, QQP): each pair "
        "read as (a, b) and (b, a), their representations added before the linear head (their logits summed); for "
        "decoder backbones (gpt2), which read a pair in one direction; kinds classification and regression",
    )

    @field_validator("long_documents", mode="before")
    @classmethod
    def _mode_alone(cls, value: Any) -> Any:
        """`long_documents: chunks` is short for `long_documents: {mode: chunks}`."""
        return {"mode": value} if isinstance(value, str) else value

    @field_validator("format", mode="before")
    @classmethod
    def _not_conll(cls, value: Any) -> Any:
        if value == "conll":
            raise ValueError("conll is for tagging tasks (kind: tokens)")
        return value

    @field_validator("text_columns")
    @classmethod
    def _distinct_columns(cls, names: list[str] | None) -> list[str] | None:
        return distinct(names)

    @property
    def reads_a_pair(self) -> bool:
        """Whether a custom task's model reads its two text columns as a sentence pair (pair, or two columns)."""
        return self.text is None and (self.pair if self.pair is not None else len(self.text_columns or ()) == 2)

    def check_source(self) -> None:
        """data_dir or (a GLUE task) the hub, not both."""
        if (self.source == "files") == (self.data_dir is None):
            raise ValueError(
                "give data_dir (source files) or source hub, not both"
                if self.data_dir is not None
                else "data_dir is required (or source: hub for a GLUE task)"
            )

    def check_text(self) -> None:
        """A custom task's text is one text or a pair, read from columns it names."""
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

    def text_spec(
        self,
        labels: tuple[str, ...] | None,
        metrics: tuple[str, ...],
        spec_type: type[TaskSpec] = TaskSpec,
        **keys: Any,
    ) -> TaskSpec:
        """A custom task's spec from its text keys, with the kind's labels, metrics and other spec `keys` (those of
        its `spec_type`, the kind's own TaskSpec subclass where it has one: kinds/K/spec.py)."""
        columns = self.text_columns or template_columns(self.text or "")
        template = self.text
        if template is None and len(columns) > 1 and not self.reads_a_pair:
            template = " ".join(f"{{{column}}}" for column in columns)  # joined with a space into one text
        files = self.files or ({split: f"{split}.{self.format}" for split in STANDARD_FILES} if self.format else None)
        return spec_type(
            name=self.name,
            text_columns=tuple(columns),
            label_column=self.label_column or "",
            labels=labels,
            metrics=metrics,
            files=dict(files) if files is not None else None,
            index_column=self.index_column or "index",
            file_format=self.format,
            text_template=template,
            kind=self.kind_name,
            **keys,
        )


class GlueOrCustomSection(TextTaskSection):
    """A task that is a GLUE task by name, or a custom one described by its text keys (classification, regression)."""

    CUSTOM_KEYS: ClassVar[tuple[str, ...]] = (
        "text_columns",
        "pair",
        "text",
        "label_column",
        "format",
        "files",
        "index_column",
    )

    def check_glue_or_custom(self, custom_keys: tuple[str, ...]) -> None:
        """A GLUE task brings its own columns; a custom one needs its text and label columns."""
        self.check_source()
        if self.both_orders and self.long_documents is not None and self.long_documents.mode != "truncate":
            raise ValueError(
                "both_orders reads a sentence pair twice, each order truncated: not with "
                f"long_documents {self.long_documents.mode}"
            )
        given = [key for key in self.CUSTOM_KEYS + custom_keys if getattr(self, key) is not None]
        if self.hub is not None and self.source != "hub":
            raise ValueError("hub names the dataset of source hub: set source: hub, or remove hub")
        if self.name in GLUE_TASKS and self.hub is not None:
            given.append("hub")
        if self.name in GLUE_TASKS:
            if given:
                raise ValueError(f"'{self.name}' is a GLUE task with its own columns; remove {', '.join(given)}")
            if GLUE_TASKS[self.name].kind != self.kind_name:
                raise ValueError(f"'{self.name}' is a GLUE task of kind {GLUE_TASKS[self.name].kind}")
        elif self.source == "hub" and self.hub is None:
            raise ValueError(f"source hub: '{self.name}' is a custom task: name its dataset in hub (hub.name)")
        elif (self.text_columns is None and self.text is None) or self.label_column is None:
            known = ", ".join(sorted(GLUE_TASKS))
            raise ValueError(
                f"unknown task '{self.name}' (GLUE tasks: {known}); a custom task needs text_columns (or text) and "
                "label_column"
            )
        else:
            self.check_text()

    def glue_spec(self) -> TaskSpec | None:
        """The GLUE table's record of a GLUE task (read from the hub with source hub); None for a custom task."""
        if self.name not in GLUE_TASKS:
            return None
        spec = GLUE_TASKS[self.name]
        return replace(spec, source="hub") if self.source == "hub" else spec


LabelName = Annotated[str, Field(min_length=1)]
