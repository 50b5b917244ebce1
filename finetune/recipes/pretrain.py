"""The `pretrain` recipe: the tokenizer, corpus and masking sections and their checks against the model section
(one per family: recipes/language_models.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

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
from finetune.recipes.language_models import MODEL_SECTIONS, LanguageModelConfig, MaskedLMModelConfig, model_family
from finetune.recipes.task import TaskConfig


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


HEAD_WARMUP_PHASE = "head_warmup"  # the phase of its records in metrics.jsonl and of its checkpoints: the key's name


class HeadWarmupConfig(Section):
    """`head_warmup`: the language-model head trains alone first (the rest of the model frozen, an optimizer and a
    linear schedule of its own), then the run trains every weight from step 0 as it would have without it."""

    steps: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="optimizer steps of the head alone before the rest of the model trains; auto: 100 when "
        "model.checkpoint holds no language-model head (a sentence-embedding checkpoint: the head starts fresh, and "
        "a random head's first gradients move the encoder's embeddings, bench/stage2_drift.py), else 0; 0: off",
    )
    lr: float = Field(1e-3, gt=0, description="the head's peak learning rate in its warm-up (a linear layer's rate)")


# training keys of how a task's examples are batched: pretraining's blocks are all corpus.block_size long.
FINETUNE_BATCHING = ("group_by_length", "group_chunk_batches", "split_by_length", "skip_padding")


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
    head_warmup: HeadWarmupConfig = Field(
        default_factory=HeadWarmupConfig,
        description="continuing a checkpoint: train its language-model head alone first (LP-FT for the head a "
        "checkpoint lacks)",
    )

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """Fill in what depends on the model family, so the saved recipe shows every value used."""
        if not isinstance(data, dict):
            return data
        section = MODEL_SECTIONS.get(model_family(data.get("model") or {}))  # None: the union refuses it next
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
        if checkpoint is None and self.head_warmup.steps not in ("auto", 0):
            raise ValueError(
                f"head_warmup.steps: {self.head_warmup.steps} steps of the head alone protect a pretrained model "
                "from its random head; a model trained from scratch starts fresh everywhere: set 0 or auto, or "
                "continue a model.checkpoint"
            )
        if self.corpus.streaming:
            self._check_streaming()
        # A value other than the default (a saved recipe holds every key, so being present says nothing).
        fields = TrainingConfig.model_fields
        batching = [key for key in FINETUNE_BATCHING if getattr(self.training, key) != fields[key].default]
        if batching:
            raise ValueError(
                f"training.{batching[0]}: for finetune recipes; pretraining reads the corpus in blocks of "
                "corpus.block_size tokens, which need no padding"
            )
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
