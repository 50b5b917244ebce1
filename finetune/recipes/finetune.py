"""The `finetune` recipe: backbone, layer-wise unfreezing and the classifier stage's own keys."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Field, PrivateAttr, field_validator, model_validator

from finetune.kinds.multilabel.recipe import FORMER_NAMES
from finetune.recipes.adapters import ADAPTER_HELP, AdapterConfig
from finetune.recipes.base import (
    SCHEDULE_KIND_HELP,
    SCHEDULE_KINDS,
    DiscriminativeConfig,
    InputFile,
    ScheduleConfig,
    Section,
    Seed,
    TrainingConfig,
    TrainingRunRecipe,
)
from finetune.recipes.distillation import (
    DISTILLATION_HELP,
    KEEP_LAYERS_HELP,
    DistillationConfig,
    KeepLayers,
    keep_layers_value,
)
from finetune.recipes.few_labels import (
    METHODS,
    UNLABELLED_ROWS_HELP,
    UNLABELLED_TEXT_HELP,
    ContrastiveConfig,
    SelfTrainingConfig,
    self_training_problem,
)
from finetune.recipes.multitask_checkpoints import task_checkpoint
from finetune.recipes.task import TASK_SECTIONS, TaskConfig
from finetune.recipes.unfreezing import BY_BACKBONE, UnfreezingConfig

ClassWeight = Annotated[float, Field(gt=0)]
LOSS_KEYS = ("class_weights", "pos_weight", "label_smoothing")  # training keys a task kind's loss may take


MIN_STEPS = 200  # training.min_steps' default: see its description and training/budget.py


class FinetuneTrainingConfig(TrainingConfig):
    """`training` of a fine-tuning run: the peak LR's default depends on the backbone, the length on the data."""

    epochs: int | None = Field(  # type: ignore[assignment]  # null until the stage plans it (training/budget.py)
        None,
        gt=0,
        description="passes over the training data; null: by the data size: one epoch, or with rows too few "
        "for training.min_steps optimizer steps up to 5 epochs, each passing over the rows several times",
    )
    min_steps: int | None = Field(
        MIN_STEPS,
        gt=0,
        description="with training.epochs and max_steps left out: the fewest optimizer steps a run takes (few "
        "labelled rows are read several times an epoch to make them); null: one epoch whatever the data size",
    )

    lr: float | None = Field(  # type: ignore[assignment]  # null until training/techniques.py resolves it
        None,
        gt=0,
        description="peak learning rate of the top layer group; " + BY_BACKBONE + "AWD-LSTM 1e-2 "
        "(ULMFiT's), transformers 1e-4, from hidden size 768 up 3e-5",
    )
    class_weights: Literal["balanced"] | dict[str, ClassWeight] | None = Field(
        None,
        description="kind classification: each class's weight in the cross-entropy; balanced: scikit-learn's "
        "compute_class_weight on the training labels (examples / (classes x the class's examples)); a mapping "
        "{label: weight} (labels as the files write them, or their label_names) weighs those, the others 1; null: "
        "every class 1",
    )
    pos_weight: Literal["balanced"] | dict[str, ClassWeight] | None = Field(
        None,
        description="kind multilabel: the weight of each label's positive examples in its binary cross-entropy "
        "(BCEWithLogitsLoss's pos_weight); balanced: negatives / positives per label in the training data; a "
        "mapping {label: weight} weighs those, the others 1; null: every label 1",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="kinds classification and choices: the cross-entropy's label smoothing (this share of each "
        "target spread evenly over the classes, or a question's choices); 0: none",
    )

    @field_validator("class_weights", "pos_weight", mode="before")
    @classmethod
    def _labels_as_written(cls, weights: Any) -> Any:
        """YAML gives unquoted numbers and booleans as such: each stands for its text in the files."""
        if isinstance(weights, dict):
            return {str(label).lower() if isinstance(label, bool) else str(label): w for label, w in weights.items()}
        return weights


class FinetuneScheduleConfig(ScheduleConfig):
    """`schedule` of a fine-tuning run: the kind's default depends on the backbone."""

    kind: SCHEDULE_KINDS | None = Field(  # type: ignore[assignment]  # null until training/techniques.py resolves it
        None,
        description=SCHEDULE_KIND_HELP + "; " + BY_BACKBONE + "the kind whose own keys the section changes "
        "(cut_frac: stlr, warmup_fraction: linear, ...), else AWD-LSTM stlr, transformers linear",
    )


class FinetuneDiscriminativeConfig(DiscriminativeConfig):
    """`discriminative` of a fine-tuning run: the factor's default depends on the backbone."""

    factor: float | None = Field(  # type: ignore[assignment]  # null until training/techniques.py resolves it
        None,
        ge=1,
        description="group l gets lr / factor ** (its depth from the top); 1.0: one LR for all; "
        + BY_BACKBONE
        + "AWD-LSTM 2.6 (ULMFiT's), transformers 1.0",
    )


class BackboneConfig(Section):
    """Where the pretrained weights come from."""

    checkpoint: str = Field(description="a Hugging Face model folder (a pretrain run's checkpoint) or hub name")
    init: Literal["pretrained", "random"] = Field(
        "pretrained", description="random: same architecture, fresh weights (the baseline pretraining must beat)"
    )
    trust_remote_code: bool = Field(
        False,
        strict=True,
        description="run Python code shipped with the checkpoint (its config's auto_map); "
        "only for code you have read: false refuses such checkpoints",
    )
    backward_checkpoint: str | None = Field(
        None,
        description="AWD-LSTM classifiers: a backward language model (pretrained with corpus.reverse: true) "
        "read beside model.checkpoint, the forward one: the head pools both directions' states (ELMo's biLM; with "
        "pooling: scalar_mix, ELMo's features). Same sizes as the forward model; its vocabulary is mapped onto the "
        "forward tokenizer's",
    )
    activation_regularization: float | None = Field(
        None,
        ge=0,
        description="AWD-LSTM classifiers: AR's alpha on the encoder's top-layer outputs, in the "
        "back-propagated loss only; null: the checkpoint's value, else fastai's 2.0; 0: off",
    )
    temporal_activation_regularization: float | None = Field(
        None,
        ge=0,
        description="AWD-LSTM classifiers: TAR's beta (jumps between neighbouring tokens' outputs); "
        "null: the checkpoint's value, else fastai's 1.0; 0: off",
    )
    adapter: AdapterConfig | None = Field(None, description=ADAPTER_HELP)
    keep_layers: KeepLayers = Field(None, description=KEEP_LAYERS_HELP)
    new_head: bool = Field(
        False,
        strict=True,
        description="a fresh task head even where model.checkpoint is a fine-tuned model whose labels are the "
        "task's (its head is kept then, else replaced): only the backbone carries over; the intermediate flow's "
        "target sets it",
    )

    @field_validator("keep_layers", mode="before")
    @classmethod
    def _block_numbers(cls, value: Any) -> Any:
        return keep_layers_value(value)

    @model_validator(mode="after")
    def _adapter_on_pretrained_weights(self) -> BackboneConfig:
        if self.adapter is not None and self.init == "random":
            raise ValueError("adapter trains beside pretrained weights, which init: random leaves out; remove one")
        if self.adapter is not None and self.keep_layers is not None:
            raise ValueError(
                "keep_layers makes a new, smaller model, on which an adapter could not be loaded again (its base "
                "is model.checkpoint whole): train it whole, without adapter"
            )
        return self


class FinetuneRecipe(TrainingRunRecipe):
    """`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's techniques."""

    stage: Literal["finetune"]
    seed: Seed = Field(0, description="seed for the head's initialisation, data order and dropout")
    seeds: list[Seed] | None = Field(
        None,
        min_length=1,
        description="run once per seed (into run_dir/seed-N) and report mean, median, spread and 95% interval "
        "of the dev metrics; replaces seed",
    )
    draw: Seed = Field(
        0,
        description="with task.labels_per_class: the draw of the labelled rows, its random seed (the data's: "
        "dev_split's hold-out and the rows drawn; seed stays the training's); draws sets it for each run",
    )
    draws: int | None = Field(
        None,
        ge=1,
        description="with task.labels_per_class: run draws 0 to N-1 of the labelled rows x each seed (seeds, or "
        "seed) into run_dir/draw-D/seed-S, every seed of a draw on its rows, and report mean, spread and 95% "
        "interval of the dev metrics over all the runs, and per draw",
    )
    model: BackboneConfig
    task: TaskConfig
    training: FinetuneTrainingConfig = Field(default_factory=FinetuneTrainingConfig)
    schedule: FinetuneScheduleConfig = Field(default_factory=FinetuneScheduleConfig)
    discriminative: FinetuneDiscriminativeConfig = Field(default_factory=FinetuneDiscriminativeConfig)
    unfreezing: UnfreezingConfig = Field(default_factory=UnfreezingConfig)
    classifier_dropout: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="dropout in the classification head; null: the backbone's default (BERT-style "
        "models: their hidden dropout; AWD-LSTM: 0.4 before its first pooling block)",
    )
    # scalar_mix is a value of pooling, not a `features:` section of its own: it has no setting but on or off, and it
    # is one more answer to the question pooling answers (what the head reads), exclusive of the others.
    pooling: Literal["model", "mean", "scalar_mix"] | None = Field(
        None,
        description=BY_BACKBONE
        + "mean for a sentence-embedding checkpoint (a sentence-transformers mean Pooling module beside it), "
        "else model. model: the checkpoint's own kind of head (BERT-style: [CLS] through the pooler; GPT-2: "
        "the last non-pad token; AWD-LSTM: concat pooling); mean: dropout and a linear layer on the average "
        "of the last layer over the real tokens, what sentence-embedding checkpoints (e.g. all-MiniLM-L6-v2) "
        "were trained for; scalar_mix: ELMo's learned softmax-weighted sum of the embedding output and every "
        "layer, times a learned scale, in place of the last layer (transformers: then mean; AWD-LSTM: then "
        "concat pooling); the mix trains with the head, so unfreezing.schedule [1] gives ELMo's frozen "
        "backbone",
    )
    method: METHODS = Field(
        "auto",
        description="contrastive: SetFit's method: the encoder first learns sentence embeddings from pairs of "
        "labelled rows (the contrastive section), then a logistic regression on them starts the head, which trains "
        "on (kinds classification and multilabel, mean pooling); plain: the head on the pretrained encoder, trained "
        "as the other keys say; auto: decided at the start from the checkpoint and the labelled rows per class "
        "(finetune/kinds/method.py says the rule and the measurements behind it)",
    )
    contrastive: ContrastiveConfig = Field(
        default_factory=ContrastiveConfig, description="method contrastive: the pair training of the encoder"
    )
    unlabelled_text: list[InputFile] = Field(default_factory=list, description=UNLABELLED_TEXT_HELP)
    unlabelled_rows: int | None = Field(None, gt=0, description=UNLABELLED_ROWS_HELP)
    self_training: SelfTrainingConfig = Field(
        default_factory=SelfTrainingConfig, description="with unlabelled_text: the rounds of self-training"
    )
    distillation: DistillationConfig | None = Field(None, description=DISTILLATION_HELP)
    eval_every: int | None = Field(None, gt=0, description="dev evaluation every N steps, besides each epoch end")
    keep_best: bool = Field(
        True,
        description="the saved checkpoint is the one with the best dev score (metric_for_best); "
        "false: the one after the last step",
    )
    metric_for_best: str | None = Field(
        None,
        description="the dev metric that picks the best checkpoint (keep_best) and stops early: any metric the "
        "task computes (task.metrics, e.g. f1_macro); null: the task's first metric",
    )
    # Where each technique left open came from (training/techniques.py); not a key: the run's summary reads it.
    _technique_sources: dict[str, str] = PrivateAttr(default_factory=dict)
    early_stopping_patience: int | None = Field(
        None, gt=0, description="stop after this many dev evaluations without a new best score; null: never"
    )
    calibration: Literal["temperature", "none"] = Field(
        "none",
        description="kind classification: temperature fits one scalar T on dev after training (the T that minimises "
        "the dev negative log-likelihood of softmax(logits / T); Guo et al. 2017), saved in the checkpoint's "
        "config.json as calibration_temperature, so that predict returns probabilities that match how often the "
        "model is right (labels unchanged); none: the model's own softmax. Either way result.json and the model "
        "card hold the dev expected calibration error, Brier score and NLL before and after, and "
        "RUN_DIR/plots/reliability.png the reliability diagram",
    )

    @model_validator(mode="after")
    def _seeds_are_distinct(self) -> FinetuneRecipe:
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds} repeats a seed")
        return self

    @model_validator(mode="after")
    def _draws_of_labelled_rows(self) -> FinetuneRecipe:
        """draw and draws choose task.labels_per_class's rows: without it they would change nothing."""
        drawn = getattr(self.task, "labels_per_class", None) is not None  # the kinds that draw rows have the key
        if self.draws is not None and not drawn:
            raise ValueError(
                "draws: each draw takes task.labels_per_class rows of each class; set task.labels_per_class (kinds "
                "classification, multilabel), or use seeds to repeat runs on every training row"
            )
        if self.draw != 0 and not drawn:
            raise ValueError("draw: picks the rows task.labels_per_class draws; set labels_per_class or remove draw")
        if self.draw != 0 and self.draws is not None:
            raise ValueError(f"draw: draws runs draws 0 to {self.draws - 1}, each its own; remove draw")
        return self

    @field_validator("metric_for_best", mode="before")
    @classmethod
    def _one_spelling(cls, metric: Any) -> Any:
        """A multi-label score's former name (micro_f1, ...) is read as today's (recipes/loader.py says so)."""
        return FORMER_NAMES.get(metric, metric) if isinstance(metric, str) else metric

    @model_validator(mode="after")
    def _metric_the_task_computes(self) -> FinetuneRecipe:
        """metric_for_best names one of the task's metrics, or one its kind computes (then computed too)."""
        if self.metric_for_best is not None and self.metric_for_best not in self.task.spec().metrics:
            computing = self.task.computing(self.metric_for_best)
            if computing is not None:
                self.task = cast(TaskConfig, computing)  # the same kind as self.task
            else:
                raise ValueError(
                    f"metric_for_best: '{self.metric_for_best}' is not a metric of the task; "
                    f"one of {', '.join(self.task.computable_metrics())}"
                )
        return self

    def selection_metric(self) -> str:
        """The dev metric that picks the best checkpoint and decides early stopping: metric_for_best, else the
        task's first metric."""
        return self.metric_for_best or self.task.spec().main_metric

    @model_validator(mode="after")
    def _a_head_of_its_own(self) -> FinetuneRecipe:
        """Pooling and a backward language model are a classifier's: the kinds below have their family's head."""
        head = self.task.own_head
        if head is None:
            return self
        if self.pooling not in (None, "model"):
            raise ValueError(f"pooling: {self.pooling} {head.pooling_refused}: leave pooling out")
        if self.model.backward_checkpoint is not None:
            raise ValueError(f"model.backward_checkpoint: a bidirectional AWD-LSTM classifier, not {head.called}")
        return self

    @model_validator(mode="after")
    def _pairs_where_they_can_train(self) -> FinetuneRecipe:
        """method contrastive needs a kind with classes and a pooled sentence embedding; its section is read only
        by the methods that may train on pairs."""
        if self.method == "contrastive":
            if not self.task.trains_on_pairs:
                owners = ", ".join(kind for kind, section in TASK_SECTIONS.items() if section.trains_on_pairs)
                raise ValueError(f"method: contrastive is for task kind {owners}, not {self.task.kind}")
            if self.pooling == "model":
                raise ValueError(
                    "method: contrastive trains mean-pooled sentence embeddings: pooling mean or scalar_mix "
                    "(or leave pooling out)"
                )
        # Values other than the defaults: a saved recipe spells every key out (a run's checkpoint says method plain).
        defaults = ContrastiveConfig()
        changed = [
            key for key in type(defaults).model_fields if getattr(self.contrastive, key) != getattr(defaults, key)
        ]
        if self.method == "plain" and changed:
            raise ValueError(f"contrastive.{changed[0]} is read with method contrastive (or auto), not plain")
        return self

    @field_validator("unlabelled_text", mode="before")
    @classmethod
    def _one_file_or_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _self_training_where_it_can_run(self) -> FinetuneRecipe:
        problem = self_training_problem(
            self.unlabelled_text, self.unlabelled_rows, self.self_training, self.task, self.distillation is not None
        )
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _distillation_of_the_kind(self) -> FinetuneRecipe:
        if self.distillation is not None and not self.task.distils:
            owners = ", ".join(kind for kind, section in TASK_SECTIONS.items() if section.distils)
            raise ValueError(f"distillation: task kind {self.task.kind} is not distilled yet (kinds {owners} are)")
        if self.distillation is not None and self.unlabelled_text and not self.task.distils_unlabelled:
            kind = self.task.kind
            raise ValueError(f"unlabelled_text: a teacher of kind {kind} labels the training rows only; remove it")
        if self.distillation is not None and self.distillation.hidden_weight > 0 and self.task.own_head is not None:
            raise ValueError(
                f"distillation.hidden_weight: the cosine loss is for pooled sequence classifiers, not kind "
                f"{self.task.kind}; set it to 0"
            )
        if self.distillation is not None and self.method == "contrastive":
            raise ValueError("method: contrastive pairs labelled rows; with distillation use method plain (or auto)")
        return self

    @model_validator(mode="after")
    def _calibration_of_the_kind(self) -> FinetuneRecipe:
        """A calibration method fits the outputs of the kinds that declare it; any other kind refuses it."""
        if self.calibration == "none" or self.calibration in self.task.calibrations:
            return self
        owners = ", ".join(kind for kind, section in TASK_SECTIONS.items() if self.calibration in section.calibrations)
        raise ValueError(
            f"calibration: {self.calibration} is not for task kind {self.task.kind} (it calibrates kind {owners}); "
            "remove it or set calibration: none"
        )

    @model_validator(mode="after")
    def _loss_keys_of_the_kind(self) -> FinetuneRecipe:
        """class_weights, pos_weight and label_smoothing change the loss of the kinds that have it, and name labels
        of the task; on any other kind they are refused, never ignored."""
        for key in LOSS_KEYS:
            value = getattr(self.training, key)
            if not value or key in self.task.loss_keys:
                continue
            owners = ", ".join(kind for kind, section in TASK_SECTIONS.items() if key in section.loss_keys)
            raise ValueError(f"training.{key}: not for task kind {self.task.kind} (a key of kind {owners})")
        for key in ("class_weights", "pos_weight"):
            weights = getattr(self.training, key)
            if isinstance(weights, dict):
                labels = self.task.weighed_labels()
                unknown = [label for label in weights if label not in labels]
                if unknown:
                    raise ValueError(
                        f"training.{key}: unknown label '{unknown[0]}' (labels: {', '.join(dict.fromkeys(labels))})"
                    )
        return self

    @model_validator(mode="after")
    def _the_task_of_a_multitask_checkpoint(self) -> FinetuneRecipe:
        """A multi-task checkpoint (`finetune multitask`'s RUN_DIR/checkpoint) continues as its task's checkpoint: the
        shared encoder with that task's head (MT-DNN's second step); one line where it has no head for the task."""
        try:
            resolved = task_checkpoint(self.model.checkpoint, self.task.name)
        except ValueError as error:
            raise ValueError(f"model.checkpoint: {error}; name one of those tasks, or use one task's folder") from None
        if resolved != self.model.checkpoint:
            self.model = self.model.model_copy(update={"checkpoint": resolved})
        return self
