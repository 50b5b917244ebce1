"""What each language-model family is (the table and the rules in models/families.py, which makes one object of each
class here): its data layout, tokenizer, model building and continuing, loss module, layer groups and positions.
Each class says only where it differs from the one it extends; LanguageModelFamily is GPT-2's ways."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn
from transformers import AutoConfig, BertForMaskedLM, GPT2LMHeadModel, PreTrainedModel

from finetune.data.tokenizers import train_byte_level_bpe, train_wordpiece
from finetune.errors import CheckpointError, InputError
from finetune.models.auto_lm import (
    AutoMaskedLM,
    AutoNextTokenLM,
    ContinuedThroughAutoClass,
    causal_lm_refusal,
    masked_lm_refusal,
    usable_positions,
)
from finetune.models.awd_lstm import AWD_LSTM_TYPE, AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.backbones import Groups, layer_groups
from finetune.models.causal_lm import (
    MemoryNextTokenLM,
    NextTokenLM,
    RecurrentNextTokenLM,
    build_causal_lm,
    load_causal_lm,
)
from finetune.models.causal_transformer import (
    CAUSAL_TRANSFORMER_TYPE,
    CausalTransformerForCausalLM,
    build_causal_transformer,
)
from finetune.models.hub import load_pretrained, refuse_other_model_type, resolve_checkpoint
from finetune.models.loading import load_model
from finetune.models.masked_lm import SparseMaskedLM, build_masked_lm, load_masked_lm
from finetune.models.ngram import NGRAM_TYPE, NGramForCausalLM, NGramNextTokenLM


class LanguageModelFamily:
    """A causal family read as next-token blocks with a byte-level BPE tokenizer (GPT-2's ways); the others say
    where they differ."""

    name: str  # the registry's key
    recipe_family: str  # the recipe's model.family that selects it
    model_type: str  # config.json's model_type of the models it builds
    model_class: type[PreTrainedModel]  # the Hugging Face class, built from a checkpoint's config by `finetune profile`
    description: str  # what `finetune profile` calls it
    masked = False  # masked blocks (bert) rather than next-token blocks
    counted = False  # counted from the corpus (ngram), not trained: no sizes, no optimizer, no training loop
    recurrent = False  # LSTM layers (no attention): BPTT batches, whole documents when fine-tuned, no position table
    has_position_table = True  # a learned table of max_positions positions, which bounds block_size
    accuracy_name = "next_token_accuracy"  # what validation calls the share of labelled tokens predicted right
    pipeline_tag = "text-generation"  # the hub's pipeline for its model card
    auto_class = "AutoModelForCausalLM"  # the Auto class its model card loads it with
    registering_import = ""  # the import that registers a family of ours with transformers' Auto classes
    card_tags: tuple[str, ...] = ()  # model-card tags beside its name
    classifier_card_tags: tuple[str, ...] = ()  # the same, on the card of a classifier fine-tuned from it
    classifier_registering_import = ""  # the import that registers its classifier, where it is ours
    tokenizer_kind = "byte-level BPE"
    special_tokens: tuple[str, ...] = ("eos_token",)  # what its data layout reads of a tokenizer
    layer_blocks = slice(1, -1)  # which of its layer groups are layers (not embeddings, not the head): FLOP counting

    def __repr__(self) -> str:
        return f"<family {self.name}>"

    # ----- data -----

    def reads_bptt_batches(self, model_config) -> bool:
        """Whether the model carries a state from batch to batch (the AWD-LSTM's, Transformer-XL's memory), so reads
        the corpus as BPTT batches in order, row i of each continuing row i of the one before."""
        return self.recurrent

    def separator_id(self, tokenizer) -> int:
        """The token packed after every document: the end-of-text token for causal LMs."""
        return tokenizer.eos_token_id

    def block_start_id(self, tokenizer) -> int | None:
        """The token every block starts with ([CLS] for BERT); None: a block is text alone."""
        return None

    def block_text_tokens(self, block_size: int) -> int:
        """Tokens of text one block (or BPTT row) of `block_size` reads: inputs and the next token of the last."""
        return block_size + 1

    def decoded_fraction(self, recipe) -> float:
        """The share of a block's positions its language-model head decodes (FLOP counting): every one."""
        return 1.0

    # ----- tokenizer -----

    def train_tokenizer(self, documents: Iterable[str], tokenizer_config):
        """A byte-level BPE tokenizer trained on `documents`, as GPT-2's."""
        return train_byte_level_bpe(
            documents, tokenizer_config.vocab_size, tokenizer_config.lowercase, tokenizer_config.min_frequency
        )

    def check_tokenizer(self, tokenizer, source: str) -> None:
        """An existing tokenizer must have the special tokens the family's data layout uses (a CheckpointError: the
        caller names the key that gave `source`)."""
        missing = [name for name in self.special_tokens if getattr(tokenizer, name) is None]
        if missing:
            raise CheckpointError(
                f"the tokenizer of {source} has no {', '.join(missing)}, which {self.recipe_family} pretraining needs",
                value=missing,
            )

    # ----- model -----

    def max_positions(self, model_config, block_size: int, continued: PreTrainedModel | None = None) -> int | None:
        """The longest block the model a pretraining run trains reads: a continued checkpoint's position table
        (`continued`, the model loaded), else the recipe's max_positions, else corpus.block_size; None for a model
        without one (it reads any length)."""
        if not self.has_position_table:
            return None
        if continued is not None:
            return usable_positions(continued)  # GPT2Config maps max_position_embeddings to n_positions
        return getattr(model_config, "max_positions", None) or block_size

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        """A randomly initialised model of the recipe's sizes (`tokenizer`: its length and special token ids)."""
        raise NotImplementedError

    def load(self, model_config) -> PreTrainedModel:
        """model.checkpoint, to continue pretraining it (ULMFiT's second stage); dropout keys given in the recipe
        replace the checkpoint's, the others keep its values."""
        raise InputError(f"the {self.recipe_family} family continues no checkpoint", value=self.recipe_family)

    def check_checkpoint(self, config, checkpoint: str) -> None:
        """A checkpoint this family continues: one of its own model type, else one line naming the type (the refusal
        names model.family as what decides it: the caller names the checkpoint's key)."""
        refuse_other_model_type(
            config,
            self.model_type,
            checkpoint,
            f"model.family {self.recipe_family} continues {self.model_type} checkpoints",
        )

    def from_config(self, config) -> PreTrainedModel:
        """The model of a checkpoint's config, freshly initialised (nothing read: `finetune profile`)."""
        return self.model_class._from_config(config)

    def loss_module(self, model_config, model: nn.Module) -> nn.Module:
        """The model wrapped so that its forward is `(input_ids, labels) -> (mean loss, labelled tokens, correct
        predictions or None)`: the training loop and validation never branch on the family."""
        assert isinstance(model, GPT2LMHeadModel)  # what the family builds and loads
        return NextTokenLM(model)

    def layer_groups(self, model: PreTrainedModel) -> Groups:
        """The layer groups that discriminative learning rates of language-model training step down from the top:
        a transformer's backbone order (models/backbones.py)."""
        return layer_groups(model)

    def owns(self, config) -> bool:
        """Whether a loaded config is of this family's model type (a classifier's or encoder's too)."""
        return config.model_type == self.model_type

    def shown_name(self, model_config, config) -> str:
        """What a profile and a model card call the model: the recipe's model.family (`config`: the model's)."""
        return model_config.family


class BertFamily(LanguageModelFamily):
    """BERT's masked LM: [CLS], text, [SEP] blocks with masked tokens, a WordPiece tokenizer."""

    name = recipe_family = model_type = "bert"
    model_class = BertForMaskedLM
    description = "masked language model"
    masked = True
    accuracy_name = "masked_accuracy"
    pipeline_tag = "fill-mask"
    auto_class = "AutoModelForMaskedLM"
    tokenizer_kind = "WordPiece"
    special_tokens = ("mask_token", "cls_token", "sep_token")

    def separator_id(self, tokenizer) -> int:
        return tokenizer.sep_token_id

    def block_start_id(self, tokenizer) -> int | None:
        return tokenizer.cls_token_id

    def block_text_tokens(self, block_size: int) -> int:
        return block_size - 1  # [CLS] takes the first position

    def decoded_fraction(self, recipe) -> float:
        return recipe.masking.probability  # the sparse masked LM decodes only the masked positions

    def train_tokenizer(self, documents: Iterable[str], tokenizer_config):
        """A WordPiece tokenizer trained on `documents`, as BERT's."""
        return train_wordpiece(
            documents, tokenizer_config.vocab_size, tokenizer_config.lowercase, tokenizer_config.min_frequency
        )

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        assert max_positions is not None  # a family with a position table: max_positions() gives its size
        return build_masked_lm(model_config, len(tokenizer), max_positions, tokenizer.pad_token_id)

    def load(self, model_config) -> PreTrainedModel:
        given = model_config.model_fields_set
        return load_masked_lm(model_config.checkpoint, model_config.dropout if "dropout" in given else None)

    def loss_module(self, model_config, model: nn.Module) -> nn.Module:
        assert isinstance(model, BertForMaskedLM)  # what the family builds and loads
        return SparseMaskedLM(model)


class GPT2Family(LanguageModelFamily):
    """GPT-2: next-token blocks, GPT2LMHeadModel."""

    name = recipe_family = model_type = "gpt2"
    model_class: type[PreTrainedModel] = GPT2LMHeadModel  # CausalTransformerFamily's is another
    description = "causal language model"

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        assert max_positions is not None  # a family with a position table: max_positions() gives its size
        return build_causal_lm(model_config, len(tokenizer), max_positions, tokenizer)

    def load(self, model_config) -> PreTrainedModel:
        given = model_config.model_fields_set
        return load_causal_lm(model_config.checkpoint, model_config.dropout if "dropout" in given else None)


class CausalTransformerFamily(GPT2Family):
    """Our own GPT-2 (models/causal_transformer.py), what a gpt2 section with memory_length (Transformer-XL: BPTT
    batches) or a sparse attention pattern builds; never continued (the recipe refuses a checkpoint beside them)."""

    name = "causal_transformer"
    model_type = CAUSAL_TRANSFORMER_TYPE
    model_class = CausalTransformerForCausalLM
    registering_import = (
        "import finetune.models.causal_transformer  # registers the model (Transformer-XL memory, "
        "sparse attention) with the Auto classes\n"
    )

    def reads_bptt_batches(self, model_config) -> bool:
        return getattr(model_config, "memory_length", 0) > 0

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        assert max_positions is not None  # a family with a position table: max_positions() gives its size
        return build_causal_transformer(model_config, len(tokenizer), max_positions, tokenizer)

    def loss_module(self, model_config, model: nn.Module) -> nn.Module:
        assert isinstance(model, CausalTransformerForCausalLM)  # what the family builds
        return MemoryNextTokenLM(model)


class AWDLSTMFamily(LanguageModelFamily):
    """ULMFiT's AWD-LSTM: BPTT batches, five dropouts, AR/TAR in the training loss, the embedding's group on top."""

    name = recipe_family = model_type = AWD_LSTM_TYPE
    model_class = AWDLSTMForCausalLM
    description = "AWD-LSTM language model"
    recurrent = True
    has_position_table = False
    registering_import = "import finetune.models.awd_lstm  # registers the AWD-LSTM with the Auto classes\n"
    card_tags = ("ulmfit",)
    classifier_card_tags = ("ulmfit", "awd-lstm")
    classifier_registering_import = (
        "import finetune.models.awd_lstm_classifier  # registers the AWD-LSTM with the Auto classes\n"
    )
    layer_blocks = slice(0, -1)  # the LSTM layers: the embedding sits on top, with the decoder (layer_groups)
    DROPOUTS = ("output_dropout", "hidden_dropout", "input_dropout", "embedding_dropout", "weight_dropout")

    def dropouts(self, model_config) -> dict[str, float]:
        """The five AWD-LSTM dropouts of a recipe, named as in AWDLSTMConfig."""
        return {name: getattr(model_config, name) for name in self.DROPOUTS}

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        dropouts: dict[str, Any] = self.dropouts(model_config)  # keyword arguments of AWDLSTMConfig, floats
        config = AWDLSTMConfig(
            vocab_size=len(tokenizer),
            embedding_size=model_config.embedding_size,
            hidden_size=model_config.hidden,
            num_layers=model_config.layers,
            cell=model_config.cell,
            pad_token_id=tokenizer.pad_token_id,
            embedding_init_range=model_config.embedding_init_range,
            **dropouts,
        )
        return AWDLSTMForCausalLM._from_config(config)

    def load(self, model_config) -> PreTrainedModel:
        given = model_config.model_fields_set
        dropouts = {name: value for name, value in self.dropouts(model_config).items() if name in given}
        source = resolve_checkpoint(model_config.checkpoint)
        config = load_pretrained(AutoConfig.from_pretrained, source)
        self.check_checkpoint(config, model_config.checkpoint)
        for name, value in dropouts.items():
            setattr(config, name, value)
        return load_model(AWDLSTMForCausalLM, source, config=config)

    def loss_module(self, model_config, model: nn.Module) -> nn.Module:
        assert isinstance(model, AWDLSTMForCausalLM)  # what the family builds and loads
        return RecurrentNextTokenLM(
            model, model_config.activation_regularization, model_config.temporal_activation_regularization
        )

    def layer_groups(self, model: PreTrainedModel) -> Groups:
        """As ULMFiT/fastai split an AWD-LSTM for language modelling: the LSTM layers bottom to top, then the
        embedding together with the decoder it is tied to, on top.

        The embedding is both the first and the last layer of a tied LM; on top it learns at the full LR, which
        ULMFiT's stage 2 needs: the rows of the target vocabulary's new tokens start at the mean row, and at the
        bottom group's LR (lr / 2.6^3) they barely moved (bench/README.md, ULMFiT). The classifier's groups keep the
        embedding at the bottom (models/backbones.py), as fastai's do.
        """
        embedding, *layers, head = layer_groups(model)
        return layers + [embedding + head]


class NGramFamily(LanguageModelFamily):
    """The Kneser-Ney n-gram baseline: counted on the token stream in one pass, validated on gpt2's blocks."""

    name = recipe_family = model_type = NGRAM_TYPE
    model_class = NGramForCausalLM
    description = "n-gram language model"
    counted = True
    has_position_table = False
    registering_import = "import finetune.models.ngram  # registers the n-gram model with the Auto classes\n"

    def build(self, model_config, tokenizer, max_positions: int | None) -> PreTrainedModel:
        # the stages refuse it first (profile, lr-find): there is nothing to size or to train
        raise InputError(
            f"an {self.recipe_family} model is counted from the corpus by `finetune pretrain`, not built",
            value=self.recipe_family,
        )

    def loss_module(self, model_config, model: nn.Module) -> nn.Module:
        assert isinstance(model, NGramForCausalLM)  # what the pretrain stage counts
        return NGramNextTokenLM(model)


class AutoMaskedLMFamily(ContinuedThroughAutoClass, BertFamily):
    """BERT's masked objective and data layout for roberta, xlm-roberta, deberta-v2, modernbert, distilbert,
    albert, mpnet, an electra generator or any other encoder with a masked-LM head in transformers."""

    name = "auto_masked_lm"
    refusal = staticmethod(masked_lm_refusal)
    loss_class = AutoMaskedLM


class AutoCausalLMFamily(ContinuedThroughAutoClass, GPT2Family):
    """GPT-2's next-token objective and data layout for llama, mistral, qwen2, gemma, phi, opt, gpt_neox or any
    other decoder with a causal-LM head in transformers."""

    name = "auto_causal_lm"
    refusal = staticmethod(causal_lm_refusal)
    loss_class = AutoNextTokenLM
