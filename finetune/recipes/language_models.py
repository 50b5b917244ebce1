"""The `model` section of a pretrain recipe: one section per model family (bert, gpt2, awd_lstm, ngram), their
defaults and checks, and the union that picks one by `model.family` (recipes/pretrain.py holds the rest)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_serializer, model_validator

from finetune.recipes.adapters import ADAPTER_HELP, AdapterConfig
from finetune.recipes.base import ECHO, Section

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

    @model_validator(mode="before")
    @classmethod
    def _feed_forward_default(cls, data: Any) -> Any:
        """intermediate's null is 4 x hidden (GPT-2's and BERT's ratio), filled in here so that the saved recipe
        shows the size built and every family builds the same; a continued model's comes from its checkpoint."""
        if isinstance(data, dict) and data.get("intermediate") is None and data.get("checkpoint") is None:
            hidden = data.get("hidden", cls.model_fields["hidden"].default)
            if isinstance(hidden, int) and not isinstance(hidden, bool) and hidden > 0:  # else its own error names it
                data = {**data, "intermediate": 4 * hidden}
        return data

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
    family: Literal["bert"] = Field("bert", description="bert: masked LM")


class CausalLMModelConfig(TransformerModelConfig):
    """A GPT-2-style decoder trained to predict the next token; with memory_length or a sparse attention pattern,
    our own model (models/causal_transformer.py) instead of GPT2LMHeadModel."""

    family: Literal["gpt2"] = Field(description="gpt2: causal transformer")
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
    family: Literal["awd_lstm"] = Field(description="awd_lstm: ULMFiT's causal LSTM")
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
    family: Literal["ngram"] = Field(description="ngram: Kneser-Ney n-gram baseline")
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


def model_family(value: Any) -> str:
    """The `family` key of a model section (bert when absent, the historical default); a family that is not a name (a
    list, a mapping, a number) as its text, which names no family, so that the union reports it as unknown."""
    family = value.get("family", "bert") if isinstance(value, dict) else getattr(value, "family", "bert")
    return family if isinstance(family, str) else ECHO.repr(family)


if TYPE_CHECKING:
    # What the checker sees: the same sections, spelled out (mypy cannot read a Union built at run time).
    LanguageModelConfig = MaskedLMModelConfig | CausalLMModelConfig | AWDLSTMModelConfig | NGramModelConfig
else:
    # A Union of a tuple built at run time: it has no `A | B` spelling.
    LanguageModelConfig = Annotated[
        Union[tuple(Annotated[section, Tag(name)] for name, section in MODEL_SECTIONS.items())],  # noqa: UP007
        Discriminator(model_family),
    ]
