"""The `pretrain` recipe: model families (bert, gpt2, awd_lstm, ngram), tokenizer, corpus and masking sections."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_serializer, model_validator

from finetune.recipes.adapters import ADAPTER_HELP, AdapterConfig
from finetune.recipes.base import (
    MAX_VOCABULARY,
    DiscriminativeConfig,
    InputFile,
    InputFolder,
    PretrainScheduleConfig,
    Section,
    Seed,
    TrainingConfig,
    TrainingRunRecipe,
)
from finetune.recipes.task import TaskConfig

ARCHITECTURE_KEYS = ("layers", "hidden", "heads", "intermediate", "max_positions")
AWD_LSTM_ARCHITECTURE_KEYS = ("embedding_size", "hidden", "layers", "cell", "embedding_init_range")


def _drop_architecture(data: dict[str, Any], checkpoint: str | None, keys: tuple[str, ...]) -> dict[str, Any]:
    """`data` (a dumped model section) without the architecture `keys` when a checkpoint gives the architecture."""
    if checkpoint is not None:
        for key in keys:
            data.pop(key, None)
    return data


class LanguageModelSection(Section):
    """A model section: what the recipe's rules ask of its family (the models layer's families, models/families.py,
    know the rest; this layer cannot import them). Read as class attributes, so no rule compares family names."""

    masked_lm: ClassVar[bool] = False  # masked blocks: a masking section, a WordPiece tokenizer, uncased by default
    counted: ClassVar[bool] = False  # counted from the whole corpus (ngram), not trained
    bptt_rows: ClassVar[bool] = False  # always reads BPTT rows cut from the whole corpus (awd_lstm)
    maps_new_vocabulary: ClassVar[bool] = False  # tokenizer.new_vocabulary: a continued model's rows mapped onto it


class TransformerModelConfig(LanguageModelSection):
    """A transformer from scratch (sizes as in BERT-tiny 2/128 ... BERT-small 4/512) or continued."""

    checkpoint: str | None = Field(
        None,
        description="continue pretraining this Hugging Face folder or hub name (ULMFiT's target-domain "
        "LM stage); its architecture and tokenizer are kept. bert: any encoder with a masked-LM head (bert, "
        "roberta, xlm-roberta, deberta-v2, modernbert, distilbert, albert, mpnet, an electra generator); gpt2: any "
        "decoder (gpt2, llama, mistral, qwen2, gemma, phi, opt, gpt_neox, ...)",
    )
    layers: int = Field(2, gt=0, description="transformer blocks")
    hidden: int = Field(128, gt=0, description="hidden size")
    heads: int = Field(2, gt=0, description="attention heads; must divide hidden")
    intermediate: int | None = Field(None, gt=0, description="feed-forward size; null: 4 x hidden")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout on hidden states and attention")
    max_positions: int | None = Field(
        None, gt=0, description="position embeddings (longest input); null: corpus.block_size"
    )
    adapter: AdapterConfig | None = Field(None, description="with model.checkpoint: " + ADAPTER_HELP)

    @model_validator(mode="after")
    def _consistent_architecture(self) -> TransformerModelConfig:
        given = [key for key in ARCHITECTURE_KEYS if key in self.model_fields_set]
        if self.checkpoint is not None and given:
            raise ValueError(f"the architecture comes from model.checkpoint; remove {', '.join(given)}")
        if self.adapter is not None and self.checkpoint is None:
            raise ValueError(
                "adapter trains beside the weights of model.checkpoint; a model trained from scratch has none: "
                "give model.checkpoint or remove model.adapter"
            )
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

    masked_lm: ClassVar[bool] = True
    family: Literal["bert"] = Field(
        "bert",
        description="bert: masked LM; gpt2: causal transformer; "
        "awd_lstm: ULMFiT's causal LSTM; ngram: Kneser-Ney n-gram baseline",
    )


class CausalLMModelConfig(TransformerModelConfig):
    """A GPT-2-style decoder trained to predict the next token; with memory_length or a sparse attention pattern,
    our own model (models/causal_transformer.py) instead of GPT2LMHeadModel."""

    family: Literal["gpt2"] = Field(
        description="bert: masked LM; gpt2: causal transformer; "
        "awd_lstm: ULMFiT's causal LSTM; ngram: Kneser-Ney n-gram baseline"
    )
    memory_length: int = Field(
        0,
        ge=0,
        description="Transformer-XL: every layer also attends to the last N states of the previous "
        "segments of its stream (no gradient), with relative positions instead of a position table; the corpus is "
        "then read as BPTT batches in order, as awd_lstm; 0: plain GPT-2",
    )
    attention: Literal["dense", "strided", "fixed"] = Field(
        "dense",
        description="Sparse Transformer pattern: strided: the last attention_stride positions and every "
        "attention_stride-th before them; fixed: the own block of attention_stride positions and the last position "
        "of every earlier block; dense: every earlier position",
    )
    attention_stride: int | None = Field(
        None, gt=0, description="the stride of a strided or fixed attention; must divide corpus.block_size"
    )

    @model_validator(mode="after")
    def _memory_and_attention(self) -> CausalLMModelConfig:
        # Values, not the keys given: a run's saved recipe.yaml spells every default out.
        if (self.attention == "dense") != (self.attention_stride is None):
            raise ValueError(
                f"attention {self.attention} "
                + ("takes no attention_stride; remove it" if self.attention == "dense" else "needs attention_stride")
            )
        if self.checkpoint is not None and (self.memory_length or self.attention != "dense"):
            raise ValueError(
                "memory_length and attention build a new model; model.checkpoint continues a checkpoint as it "
                "is: remove them"
            )
        if self.memory_length and self.max_positions is not None:
            raise ValueError("max_positions: with memory_length, positions are relative (no table); remove it")
        if self.memory_length and self.hidden % 2:
            raise ValueError(
                f"hidden ({self.hidden}) must be even with memory_length (relative positions are sine and cosine pairs)"
            )
        return self


class AWDLSTMModelConfig(LanguageModelSection):
    """ULMFiT's AWD-LSTM: an LSTM language model regularised by five kinds of dropout, decoder tied."""

    bptt_rows: ClassVar[bool] = True
    maps_new_vocabulary: ClassVar[bool] = True
    family: Literal["awd_lstm"] = Field(
        description="bert: masked LM; gpt2: causal transformer; awd_lstm: ULMFiT's causal LSTM"
    )
    checkpoint: str | None = Field(
        None, description="continue pretraining this AWD-LSTM checkpoint folder (ULMFiT's target-domain LM stage)"
    )
    embedding_size: int = Field(400, gt=0, description="embedding size (also the last LSTM's size: tied decoder)")
    hidden: int = Field(1152, gt=0, description="hidden size of the inner LSTM layers")
    layers: int = Field(3, gt=0, description="stacked LSTM layers")
    cell: Literal["lstm", "qrnn", "rnn"] = Field(
        "lstm",
        description="the recurrent layers: lstm (ULMFiT), qrnn (MultiFiT's quasi-recurrent layers: one "
        "matrix product per sequence, then an elementwise recurrence; faster per token), rnn (tanh, a baseline)",
    )
    # The five dropouts at fastai's ULMFiT language-model defaults.
    output_dropout: float = Field(0.1, ge=0, lt=1, description="dropout on the last LSTM's output")
    hidden_dropout: float = Field(0.15, ge=0, lt=1, description="variational dropout between LSTM layers")
    input_dropout: float = Field(0.25, ge=0, lt=1, description="variational dropout on the embedded input")
    embedding_dropout: float = Field(0.02, ge=0, lt=1, description="drops whole embedding rows (words)")
    weight_dropout: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="DropConnect on the hidden-to-hidden weights (qrnn: on its gates' weights, as fastai)",
    )
    # fastai's 0.1 leaves the embedded input so small that, with Adam on a corpus of a few million tokens, the LM
    # sits at the unigram plateau for hundreds of steps; 0.5 leaves it within ~20 (recipes/pretrain/awd-lstm-*).
    embedding_init_range: float = Field(
        0.1, gt=0, description="embedding (and tied decoder) drawn uniform in [-range, range] (fastai: 0.1)"
    )
    # Training objective, not architecture: also for a continued model.checkpoint (ULMFiT's stage 2 regularises
    # too). Added to the loss that is back-propagated only; metrics.jsonl's loss stays the next-token
    # cross-entropy, comparable with the validation loss (as fastai's RNNRegularizer, defaults of its TextLearner).
    activation_regularization: float = Field(
        2.0,
        ge=0,
        description="AR (fastai's alpha): adds alpha x mean square of the last LSTM's output after "
        "output dropout to the training loss; 0: off",
    )
    temporal_activation_regularization: float = Field(
        1.0,
        ge=0,
        description="TAR (fastai's beta): adds beta x mean square of the step-to-step change of the last "
        "LSTM's output (before dropout) to the training loss; 0: off",
    )

    @model_validator(mode="after")
    def _architecture_from_checkpoint(self) -> AWDLSTMModelConfig:
        given = [key for key in AWD_LSTM_ARCHITECTURE_KEYS if key in self.model_fields_set]
        if self.checkpoint is not None and given:
            raise ValueError(f"the architecture comes from model.checkpoint; remove {', '.join(given)}")
        return self

    @model_serializer(mode="wrap")
    def _without_unused_architecture(self, handler: Any) -> dict[str, Any]:
        """A continued model's section as saved: no architecture keys (see TransformerModelConfig's)."""
        return _drop_architecture(handler(self), self.checkpoint, AWD_LSTM_ARCHITECTURE_KEYS)


class NGramModelConfig(LanguageModelSection):
    """The baseline: an n-gram model with interpolated modified Kneser-Ney smoothing, counted on the corpus's token
    ids in one pass (no training loop: the training, schedule and discriminative keys do not apply)."""

    counted: ClassVar[bool] = True
    family: Literal["ngram"] = Field(
        description="bert: masked LM; gpt2: causal transformer; "
        "awd_lstm: ULMFiT's causal LSTM; ngram: Kneser-Ney n-gram baseline"
    )
    order: int = Field(3, ge=1, le=6, description="n: the longest n-gram counted (3: trigrams; 1: a unigram model)")
    discounts: Literal["modified"] = Field(
        "modified",
        description="modified Kneser-Ney: three discounts per order from its count-of-counts (Chen & Goodman 1998)",
    )
    checkpoint: str | None = Field(None, description="not supported: an n-gram model is always counted anew")

    @field_validator("checkpoint")
    @classmethod
    def _counted_anew(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("an ngram model is counted from scratch; continuing a checkpoint is not supported")
        return value


# model.family -> its section: the tags of the pydantic discriminated union below (the one place family names are
# written in the recipes).
MODEL_SECTIONS: dict[str, type[LanguageModelSection]] = {
    "bert": MaskedLMModelConfig,
    "gpt2": CausalLMModelConfig,
    "awd_lstm": AWDLSTMModelConfig,
    "ngram": NGramModelConfig,
}
MODEL_FAMILIES = tuple(MODEL_SECTIONS)


def _model_family(value: Any) -> str:
    """The `family` key of a model section (bert when absent, the historical default)."""
    if isinstance(value, dict):
        return value.get("family", "bert")
    return getattr(value, "family", "bert")


if TYPE_CHECKING:
    # What the checker sees: the same sections, spelled out (mypy cannot read a Union built at run time).
    LanguageModelConfig = MaskedLMModelConfig | CausalLMModelConfig | AWDLSTMModelConfig | NGramModelConfig
else:
    # A Union of a tuple built at run time: it has no `A | B` spelling.
    LanguageModelConfig = Annotated[
        Union[tuple(Annotated[section, Tag(name)] for name, section in MODEL_SECTIONS.items())],  # noqa: UP007
        Discriminator(_model_family),
    ]


class TokenizerConfig(Section):
    """The tokenizer: trained on the corpus inside the pretrain stage (WordPiece for masked LMs, byte-level BPE
    for causal ones), or an existing one reused."""

    path: InputFolder | None = Field(
        None, description="reuse this tokenizer folder (e.g. an earlier run's checkpoint) instead of training one"
    )
    vocab_size: int = Field(
        8000, ge=100, le=MAX_VOCABULARY, description="vocabulary size of a trained tokenizer, special tokens included"
    )
    lowercase: bool | None = Field(
        None,
        description="lowercase (and for WordPiece strip accents) before tokenizing; null: true for bert "
        "(uncased, as BERT), false for the byte-level BPE of causal LMs",
    )
    min_frequency: int = Field(2, gt=0, description="ignore pieces seen fewer times than this")
    new_vocabulary: bool = Field(
        False,
        description="awd_lstm with model.checkpoint: train a tokenizer on this corpus and map the "
        "checkpoint's rows onto it (new tokens start at the mean row), as ULMFiT's LM fine-tuning does",
    )


class CorpusConfig(Section):
    """Raw text: documents of text files (each non-empty line, paragraph or file) or of a `datasets` dataset (each
    row), each followed by a separator and packed into blocks."""

    train_files: list[InputFile] = Field(default_factory=list, description="text files to pretrain on")
    validation_files: list[InputFile] = Field(default_factory=list, description="held-out text; empty: split off")
    document: Literal["line", "paragraph", "file"] = Field(
        "line",
        description="what a document of text files is (a separator follows each; validation holds out whole "
        "ones): line: each non-empty line, stripped; paragraph: the lines up to a blank line, stripped, joined by line "
        "breaks; file: each file whole, line breaks, blank lines and indentation kept (running text, e.g. a play). "
        "Byte-level BPE (gpt2, awd_lstm, ngram) makes line breaks tokens; bert's WordPiece reads them as spaces. "
        "Paragraphs and files are read and tokenised in ~64 KB pieces",
    )
    dataset: str | None = Field(
        None, description="instead of train_files: a `datasets` dataset name (needs a network or the hub cache)"
    )
    dataset_config: str | None = Field(None, description="the dataset's configuration, e.g. wikitext-2-raw-v1")
    text_column: str = Field("text", description="the dataset's column holding the text")
    dataset_files: list[str] | dict[str, list[str]] | None = Field(
        None,
        description="with dataset: its data_files, e.g. dataset: json with a list of local JSON Lines files "
        "(the train split), or {train: [...], validation: [...]}",
    )
    validation_split: str | None = Field(
        None, description="with dataset: the split to validate on (e.g. validation) instead of validation_fraction"
    )
    streaming: bool = Field(
        False,
        description="with dataset: read it as a stream, tokenised on the fly into blocks, nothing cached, "
        "for text larger than a token cache should hold; needs training.max_steps and validation_split, "
        "validation_documents or validation_files",
    )
    validation_documents: int | None = Field(
        None,
        gt=0,
        description="with streaming: the first N documents of the stream are the validation text (never trained on)",
    )
    task: TaskConfig | None = Field(
        None,
        description="instead of train_files: the text columns of a task's files (ULMFiT's target-task LM "
        "fine-tuning), each text one document; labels are not read",
    )
    task_splits: list[str] = Field(
        default_factory=lambda: ["train"],
        min_length=1,
        description="with task: the splits whose text is read (train; add test for its unlabeled text)",
    )
    validation_fraction: float = Field(0.05, gt=0, lt=1, description="documents held out when no validation_files")
    block_size: int = Field(
        128,
        ge=8,
        description="tokens per training block: the context length (bert/gpt2, [CLS] included) or "
        "the truncated-BPTT length (awd_lstm; ULMFiT: 70)",
    )
    cache_dir: Path | None = Field(
        Path("~/.cache/finetune/corpus"),
        description="tokenized corpora are cached here by content and tokenizer; null: no cache",
    )
    reverse: bool | None = Field(
        None,
        description="true: a backward LM (ULMFiT's bidirectional ensemble), trained on each document's tokens "
        "in reverse order (gpt2, awd_lstm); its checkpoint records it and every later stage reads text backwards; "
        "null: as model.checkpoint reads (forwards from scratch)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> CorpusConfig:
        if [bool(self.train_files), bool(self.dataset), self.task is not None].count(True) != 1:
            raise ValueError("give exactly one of train_files, dataset and task")
        if self.document != "line" and not self.train_files:  # rows and a task's texts are documents already
            raise ValueError(
                f"document: {self.document} reads text files (train_files); each row of a dataset and "
                "each text of a task is one document (its own line breaks kept): remove it"
            )
        for key in ("dataset_files", "validation_split", "streaming"):
            if getattr(self, key) and not self.dataset:
                raise ValueError(f"{key} applies to a `datasets` corpus (corpus.dataset); remove it")
        validation = [
            key for key in ("validation_files", "validation_split", "validation_documents") if getattr(self, key)
        ]
        if len(validation) > 1:
            raise ValueError(f"give one validation text, not {' and '.join(validation)}")
        if self.validation_documents is not None and not self.streaming:
            raise ValueError(
                "validation_documents applies to a streamed dataset (streaming: true); use validation_fraction"
            )
        if self.streaming and not validation:
            raise ValueError(
                "a streamed dataset needs its validation text: validation_split (a split of the "
                "dataset), validation_documents (the stream's first N documents) or validation_files"
            )
        # Against the default, not the keys given: a run's saved recipe.yaml spells every default out.
        if self.streaming and self.validation_fraction != CorpusConfig.model_fields["validation_fraction"].default:
            raise ValueError(
                "a stream has no length to take a fraction of: use validation_split, "
                "validation_documents or validation_files instead of validation_fraction"
            )
        return self


class MaskingConfig(Section):
    """BERT masking: choose `probability` of the tokens; of those, mask / randomise / keep."""

    probability: float = Field(0.15, gt=0, lt=1, description="fraction of (non-special) tokens chosen")
    mask_fraction: float = Field(0.8, ge=0, le=1, description="of the chosen, fraction replaced by [MASK]")
    random_fraction: float = Field(0.1, ge=0, le=1, description="of the chosen, fraction replaced by a random token")
    whole_word: bool = Field(
        False,
        description="choose whole words instead of single tokens: the words the tokenizer marks (WordPiece's ## "
        "continuations, byte-level BPE's Ġ and SentencePiece's ▁ word starts)",
    )

    @model_validator(mode="after")
    def _fractions_fit(self) -> MaskingConfig:
        if self.mask_fraction + self.random_fraction > 1:
            raise ValueError(
                f"mask_fraction + random_fraction = {self.mask_fraction + self.random_fraction:g} exceeds 1"
            )
        return self


class PretrainRecipe(TrainingRunRecipe):
    """`finetune pretrain`: train a masked (bert) or causal (gpt2, awd_lstm) language model on raw text, or count
    the n-gram baseline (ngram)."""

    stage: Literal["pretrain"]
    seed: Seed = Field(0, description="seed for initialisation, data order and masking")
    model: LanguageModelConfig = Field(default_factory=MaskedLMModelConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    corpus: CorpusConfig
    masking: MaskingConfig | None = Field(None, description="masked LMs only; filled in with defaults for bert")
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    schedule: PretrainScheduleConfig = Field(default_factory=PretrainScheduleConfig)
    discriminative: DiscriminativeConfig = Field(
        default_factory=lambda: DiscriminativeConfig(factor=1.0),
        description="layer-wise learning rates; 1.0 (off) for pretraining from scratch, ULMFiT uses 2.6 when "
        "fine-tuning a language model on target-task text",
    )
    eval_every: int | None = Field(None, gt=0, description="validation every N steps; null: at each epoch end")
    ngram_floor: int | None = Field(
        None,
        ge=1,
        le=6,
        description="gpt2, awd_lstm: before training, count an n-gram model of this order "
        "(Kneser-Ney) on the same tokens and score it on the same validation text; the report shows its loss as the "
        "floor the network has to go below; null: none",
    )

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """Fill in what depends on the model family, so the saved recipe shows every value used."""
        if not isinstance(data, dict):
            return data
        section = MODEL_SECTIONS.get(_model_family(data.get("model") or {}))  # None: the union refuses it next
        masked_lm = section is not None and section.masked_lm
        if masked_lm and data.get("masking") is None:
            data = {**data, "masking": {}}
        tokenizer = data.get("tokenizer") or {}
        if isinstance(tokenizer, dict) and tokenizer.get("lowercase") is None:
            data = {**data, "tokenizer": {**tokenizer, "lowercase": masked_lm}}
        return data

    @model_validator(mode="after")
    def _consistent_sections(self) -> PretrainRecipe:
        model, checkpoint = self.model, self.model.checkpoint
        family = model.family
        if not model.masked_lm and self.masking is not None:
            raise ValueError(f"masking applies to masked LMs (model.family: bert), not {family}; remove it")
        if self.corpus.reverse and model.masked_lm:
            raise ValueError(
                "corpus.reverse: a masked LM (bert) already sees both directions; backward LMs are "
                "causal (gpt2, awd_lstm)"
            )
        if self.ngram_floor is not None and (model.masked_lm or model.counted):  # trained causal families only
            raise ValueError(f"ngram_floor: a next-token floor for the causal families (gpt2, awd_lstm), not {family}")
        if self.ngram_floor is not None and self.corpus.streaming:
            raise ValueError("ngram_floor: an n-gram model is counted on the whole corpus, which a stream never holds")
        if self.corpus.reverse and model.counted:  # its counts read the token arrays forwards
            raise ValueError("corpus.reverse: backward LMs are gpt2 or awd_lstm; the ngram baseline counts forwards")
        if self.tokenizer.new_vocabulary and (not model.maps_new_vocabulary or checkpoint is None):
            raise ValueError("tokenizer.new_vocabulary needs model.family awd_lstm and a model.checkpoint")
        if checkpoint is not None and self.tokenizer.path is not None:
            raise ValueError("model.checkpoint brings its own tokenizer; remove tokenizer.path")
        if self.corpus.streaming:
            self._check_streaming()
        stride = getattr(self.model, "attention_stride", None)
        if stride is not None and self.corpus.block_size % stride:
            raise ValueError(
                f"model.attention_stride ({stride}) must divide corpus.block_size ({self.corpus.block_size})"
            )
        max_positions = getattr(self.model, "max_positions", None)
        if max_positions is not None and max_positions < self.corpus.block_size:
            raise ValueError(
                f"model.max_positions ({max_positions}) is smaller than corpus.block_size ({self.corpus.block_size})"
            )
        return self

    def _check_streaming(self) -> None:
        """What a streamed corpus needs: a known run length, a tokenizer that exists, a block layout."""
        if self.model.bptt_rows:
            raise ValueError(
                "corpus.streaming: awd_lstm reads BPTT rows cut from the whole corpus; stream with "
                "bert or gpt2, or give awd_lstm text files (tokenised once, memory-mapped)"
            )
        if self.model.counted:
            raise ValueError(
                "corpus.streaming: ngram counts the whole corpus at once; give it text files "
                "(tokenised once, memory-mapped) or a dataset read whole"
            )
        if getattr(self.model, "memory_length", 0):
            raise ValueError(
                "corpus.streaming: model.memory_length reads BPTT rows cut from the whole corpus, as "
                "awd_lstm; give text files (tokenised once, memory-mapped)"
            )
        if self.training.max_steps is None:
            raise ValueError("corpus.streaming: a stream has no length, so the run's is training.max_steps; give it")
        if self.training.epochs != 1:  # the default, which a saved recipe.yaml spells out
            raise ValueError(
                "corpus.streaming: the run's length is training.max_steps (the stream starts again "
                "when it ends); remove training.epochs"
            )
        if self.tokenizer.path is None and self.model.checkpoint is None:
            raise ValueError(
                "corpus.streaming: a tokenizer is not trained on a stream; give tokenizer.path (e.g. an "
                "earlier run's checkpoint) or model.checkpoint"
            )
