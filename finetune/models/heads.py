"""Task heads on Hugging Face backbones: load a checkpoint as a sequence classifier or regressor."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from finetune.console import console
from finetune.data.long_documents import DEFAULT_TRANSFORMER_MAX_LENGTH
from finetune.data.reverse import reads_backwards
from finetune.errors import CheckpointError, InputError
from finetune.models.awd_lstm import remap_vocabulary_rows
from finetune.models.families import AWD_LSTM, CAUSAL_TRANSFORMER, WHOLE_DOCUMENT_TYPES
from finetune.models.hub import (
    auto_class_lacks_family,
    is_classifier,
    load_pretrained,
    load_tokenizer,
    resolve_checkpoint,
)
from finetune.models.loading import load_model
from finetune.models.mean_pooling import MeanPoolingConfig, mean_pooling_classifier
from finetune.models.mean_pooling import backbone_config as encoder_config
from finetune.models.task_heads import no_head_refusal
from finetune.tasks.specs import TaskSpec

# config.json: a calibrated classifier's logits are divided by this (fitted and applied by inference/calibration.py)
TEMPERATURE_KEY = "calibration_temperature"

# The classifier is built from a backbone section (finetune/recipes: `checkpoint`, `backward_checkpoint`, AR/TAR
# weights) and a `pooling`; where in a recipe those sit (model.*, classifier.model.* in ulmfit) is the stage's to say.


class ClassifierOptionError(InputError):
    """An option of the classifier (`option`: a backbone section field, or "pooling") that the checkpoint's family
    has no use for: the stage names its recipe key (kinds/classifier_keys.py)."""

    def __init__(self, option: str, reason: str):
        super().__init__(reason)
        self.option = option


class BackwardEncoderError(CheckpointError):
    """The backward language model (`backward_checkpoint`) cannot be read, or cannot sit beside the forward one."""


@contextlib.contextmanager
def _about_the_backward_encoder():
    """Inside, a CheckpointError is about the backward checkpoint: it becomes a BackwardEncoderError, so that the
    stage names the right key."""
    try:
        yield
    except BackwardEncoderError:
        raise
    except CheckpointError as error:
        raise BackwardEncoderError(error.reason, error.source, error.line, error.value) from error


def label_config(spec: TaskSpec) -> dict:
    """The config entries that store the task's label mapping with the checkpoint; the problem_type (the kind's)
    picks transformers' loss: cross-entropy, MSE for a score, binary cross-entropy for a label set (a sigmoid each)."""
    if spec.is_regression:
        return {"num_labels": 1, "problem_type": spec.problem_type, "id2label": {0: "score"}, "label2id": {"score": 0}}
    assert spec.labels is not None  # a classifier's spec has its classes (finetune/kinds/K/recipe.py)
    return {
        "num_labels": spec.num_labels,
        "problem_type": spec.problem_type,
        "id2label": dict(enumerate(spec.labels)),
        "label2id": {label: index for index, label in enumerate(spec.labels)},
    }


def activation_regularization(backbone_config, stored, pooling: str) -> dict[str, float]:
    """The classifier config's AR/TAR weights set by the recipe; only AWD-LSTM's concat-pooling head has them."""
    keys = {
        "activation_regularization": "classifier_activation_regularization",
        "temporal_activation_regularization": "classifier_temporal_activation_regularization",
    }
    given = {key: getattr(backbone_config, key) for key in keys if getattr(backbone_config, key) is not None}
    if given and (not AWD_LSTM.owns(stored) or pooling == "mean"):
        why = (
            f"{backbone_config.checkpoint} is a '{stored.model_type}' model"
            if not AWD_LSTM.owns(stored)
            else "this recipe sets pooling: mean"
        )
        raise ClassifierOptionError(
            next(iter(given)), f"only the AWD-LSTM classifier (pooling: model or scalar_mix) has AR/TAR; {why}"
        )
    return {keys[key]: value for key, value in given.items()}


def puts_new_mean_pooling_head(stored, pooling: str) -> bool:
    """Whether `pooling` asks for a new mean-pooling head on the checkpoint's encoder: mean or scalar_mix, except on a
    mean-pooling classifier (a warm start keeps its head) and scalar_mix on an AWD-LSTM (it mixes under its own
    concat-pooling head; mean on it is refused where the new head would be built)."""
    if pooling == "model" or isinstance(stored, MeanPoolingConfig):
        return False
    return not (pooling == "scalar_mix" and AWD_LSTM.owns(stored))


def scalar_mix_switch(stored, pooling: str) -> dict[str, bool]:
    """The config entry that gives the checkpoint's own kind of head a scalar mix of every layer or none, as `pooling`
    says; nothing for pooling: model (the checkpoint's head as it is). A warm start adding a mix starts it fresh."""
    if pooling == "model":
        return {}
    key = "classifier_scalar_mix" if AWD_LSTM.owns(stored) else "scalar_mix"  # AWD-LSTM: classifier_* keys
    return {key: pooling == "scalar_mix"}


def refuse_language_model_only(stored, checkpoint: str) -> None:
    """Our causal transformer (Transformer-XL memory, sparse attention) has no classifier yet: one line, rather than
    a crash mid-training (scalar_mix), a head nobody tested (mean) or transformers' traceback (eval, predict)."""
    if CAUSAL_TRANSFORMER.owns(stored):
        raise CheckpointError(
            f"{checkpoint} is a language model with Transformer-XL memory or sparse "
            f"attention ('{CAUSAL_TRANSFORMER.model_type}'); fine-tuning a classifier on it is not "
            "supported yet (pretrain a plain gpt2, or bert or awd_lstm, to fine-tune)",
            value=stored.model_type,
        )


# What a backward encoder must share with the forward one to sit beside it in one classifier (one config builds both).
BIDIRECTIONAL_SHAPE_KEYS = ("embedding_size", "hidden_size", "num_layers", "cell")


def bidirectional_switch(backbone_config, stored, trust_remote_code: bool = False) -> dict[str, bool]:
    """{"classifier_bidirectional": True} when the recipe gives model.backward_checkpoint (ELMo's biLM on the
    AWD-LSTM) and it fits the forward model `stored`, else {}; every refusal is one line (a BackwardEncoderError).

    The reasons name the recipe keys of the two checkpoints as their advice (which to give where): the sentences
    compare the two, so the stage could not add them around a fact.
    """
    name = backbone_config.backward_checkpoint
    if name is None:
        return {}
    forward = backbone_config.checkpoint
    if not AWD_LSTM.owns(stored):
        raise BackwardEncoderError(
            "only AWD-LSTM classifiers read a backward language model beside the forward one; "
            f"model.checkpoint {forward} is a '{stored.model_type}' model",
            value=name,
        )
    if getattr(stored, "classifier_bidirectional", False):
        raise BackwardEncoderError(
            f"model.checkpoint {forward} is a bidirectional classifier already (it holds its "
            "backward encoder); remove model.backward_checkpoint to continue it",
            value=name,
        )
    if reads_backwards(stored):
        raise BackwardEncoderError(
            f"model.checkpoint {forward} reads text backwards; give the forward language "
            "model as model.checkpoint and the backward one (corpus.reverse: true) as "
            "model.backward_checkpoint",
            value=name,
        )
    with _about_the_backward_encoder():
        backward = load_pretrained(
            AutoConfig.from_pretrained, resolve_checkpoint(name), trust_remote_code=trust_remote_code
        )
    if not AWD_LSTM.owns(backward) or not reads_backwards(backward):
        kind = "a forward AWD-LSTM" if AWD_LSTM.owns(backward) else f"a '{backward.model_type}' model"
        raise BackwardEncoderError(
            f"{name} is {kind}; it must be an AWD-LSTM language model pretrained with corpus.reverse: true", value=name
        )
    for size in BIDIRECTIONAL_SHAPE_KEYS:
        if getattr(backward, size) != getattr(stored, size):
            raise BackwardEncoderError(
                f"{name} has {size} {getattr(backward, size)}, model.checkpoint {forward} "
                f"{getattr(stored, size)}: the two directions must have the same sizes",
                value=getattr(backward, size),
            )
    return {"classifier_bidirectional": True}


def load_backward_encoder(model, backbone_config, trust_remote_code: bool = False) -> None:
    """Copy model.backward_checkpoint's encoder into `model.awd_lstm_backward`, its embedding rows put in the order
    of the forward model's tokenizer (which the classifier reads with): a token both vocabularies hold keeps its
    trained row, one only the forward vocabulary has starts at the mean row (as ULMFiT's target-domain stage)."""
    name = backbone_config.backward_checkpoint
    with _about_the_backward_encoder():
        backward = load_model(AutoModel, resolve_checkpoint(name), trust_remote_code=trust_remote_code)
    forward_vocab = load_tokenizer(backbone_config.checkpoint, trust_remote_code=trust_remote_code).get_vocab()
    with _about_the_backward_encoder():
        backward_vocab = load_tokenizer(name, trust_remote_code=trust_remote_code).get_vocab()
    weights = backward.state_dict()
    if backward_vocab != forward_vocab:
        weights["embedding.weight"] = remap_vocabulary_rows(weights["embedding.weight"], backward_vocab, forward_vocab)
        shared = len(forward_vocab.keys() & backward_vocab.keys())
        console.print(
            f"model.backward_checkpoint: its vocabulary differs from model.checkpoint's; {shared:,} of "
            f"{len(forward_vocab):,} tokens keep their trained backward embedding, the others start at its "
            "mean"
        )
    model.awd_lstm_backward.load_state_dict(weights)


@contextlib.contextmanager
def _backward_encoder_loaded_next(bidirectional: bool) -> Iterator[None]:
    """The forward language model holds no backward encoder: transformers' load report would list every
    `awd_lstm_backward.*` weight as missing and newly initialised, and `load_backward_encoder` copies them in right
    after. Inside, the report leaves them out, so that what it lists is true."""
    if not bidirectional:
        yield
        return
    from finetune.models.awd_lstm_classifier import AWDLSTMForSequenceClassification as classifier

    own = "_keys_to_ignore_on_load_missing" in vars(classifier)
    before = classifier._keys_to_ignore_on_load_missing
    classifier._keys_to_ignore_on_load_missing = [*(before or []), r"^awd_lstm_backward\."]
    try:
        yield
    finally:
        if own:
            classifier._keys_to_ignore_on_load_missing = before
        else:
            del classifier._keys_to_ignore_on_load_missing


def load_classifier(backbone_config, spec: TaskSpec, classifier_dropout: float | None, pooling: str = "model"):
    """A sequence-classification model for `spec` on the backbone, pretrained or freshly initialised.

    A backbone that is itself a fine-tuned classifier is a warm start (e.g. an MNLI model for RTE):
    its head is kept when its labels are the task's, and replaced by a fresh one when they differ.
    `pooling`: "model" keeps the checkpoint's own kind of head; "mean" puts a new mean-pooling head on its encoder;
    "scalar_mix" does too, reading a learned mix of every layer (the AWD-LSTM's own head reads such a mix instead).
    Refusals are CheckpointErrors (model.checkpoint's facts), BackwardEncoderErrors and ClassifierOptionErrors, which
    the stage names by recipe key (kinds/classifier_keys.py).
    """
    source, trusted = resolve_checkpoint(backbone_config.checkpoint), backbone_config.trust_remote_code
    stored = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trusted)
    refuse_language_model_only(stored, backbone_config.checkpoint)
    regularization = activation_regularization(backbone_config, stored, pooling)
    if puts_new_mean_pooling_head(stored, pooling):
        return new_mean_pooling_classifier(backbone_config, source, stored, spec, classifier_dropout, pooling)
    replace_head = is_classifier(stored) and stored_labels(stored) != label_config(spec)["id2label"]
    dropout = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
    config = load_pretrained(
        AutoConfig.from_pretrained, source, trust_remote_code=trusted, **dropout, **regularization, **label_config(spec)
    )
    bidirectional = bidirectional_switch(backbone_config, stored, trusted)
    # Set after loading: from_pretrained drops a key the config class does not declare (the AWD-LSTM's is not).
    config.update(scalar_mix_switch(stored, pooling) | bidirectional)
    refuse_family_without_a_head(backbone_config.checkpoint, config)
    if backbone_config.init == "random":
        return AutoModelForSequenceClassification.from_config(config, trust_remote_code=trusted)
    # A new label count changes the output layer's shape; any other tensor must fit as stored.
    label_counts = (len(stored_labels(stored)), config.num_labels) if replace_head else None
    with _backward_encoder_loaded_next(bool(bidirectional)):
        model = load_model(
            AutoModelForSequenceClassification,
            source,
            trust_remote_code=trusted,
            label_counts=label_counts,
            config=config,
        )
    if bidirectional:
        load_backward_encoder(model, backbone_config, trusted)
    if replace_head:
        reinitialise_output_layer(model, config.num_labels)
        console.print(
            f"warm start from {backbone_config.checkpoint}: its head for labels "
            f"{list(stored_labels(stored).values())} is replaced by a new one for {spec.name}"
        )
    return model


def refuse_family_without_a_head(checkpoint: str, config) -> None:
    """A family without a sequence-classification class (an n-gram model), refused in one line before asking
    transformers (whose refusal is a ValueError told apart from others only by its wording)."""
    ships_its_own = "AutoModelForSequenceClassification" in (getattr(config, "auto_map", None) or {})
    if not ships_its_own and auto_class_lacks_family(AutoModelForSequenceClassification, config.model_type):
        raise no_head_refusal(
            checkpoint,
            config,
            "sequence-classification head",
            "classify with an encoder (bert, roberta, ...), a decoder (gpt2, llama, qwen2, ...) or the awd_lstm",
        )


def classifier_skeleton(backbone_config, stored, spec: TaskSpec, pooling: str = "model"):
    """The classifier `load_classifier` builds on a checkpoint whose config is `stored`, with fresh weights and no
    file read: what `finetune profile` counts (built under `torch.device("meta")`, it takes no memory). `stored`
    may also be the config of a language model not trained yet (a later stage of `finetune ulmfit`). Dropout rates
    change no shape and stay as stored; the refusals are a real run's."""
    refuse_language_model_only(stored, backbone_config.checkpoint)
    activation_regularization(backbone_config, stored, pooling)
    fresh = backbone_config.model_copy(update={"init": "random"})
    if puts_new_mean_pooling_head(stored, pooling):
        return new_mean_pooling_classifier(fresh, backbone_config.checkpoint, stored, spec, None, pooling)
    config = copy.deepcopy(stored)
    bidirectional = {"classifier_bidirectional": True} if backbone_config.backward_checkpoint else {}
    config.update(label_config(spec) | scalar_mix_switch(stored, pooling) | bidirectional)
    refuse_family_without_a_head(backbone_config.checkpoint, config)
    return AutoModelForSequenceClassification.from_config(config, trust_remote_code=backbone_config.trust_remote_code)


def new_mean_pooling_classifier(
    backbone_config, source: str, stored, spec: TaskSpec, classifier_dropout: float | None, pooling: str = "mean"
):
    """A fresh mean-pooling head (`pooling` mean or scalar_mix) on the checkpoint's encoder (its own head, if it has
    one, is left behind)."""
    if AWD_LSTM.owns(stored):
        raise ClassifierOptionError(
            "pooling",
            "mean is for transformer encoders; an AWD-LSTM classifier pools with "
            "ULMFiT's concat pooling (last, max and mean) already: leave pooling at model (or "
            "scalar_mix, to pool a learned mix of every layer)",
        )
    if stored.model_type not in CONFIG_MAPPING:  # a family shipped as code: the head cannot rebuild its config
        raise ClassifierOptionError(
            "pooling", f"{pooling} needs a model family transformers itself knows, not '{stored.model_type}'"
        )
    encoder = (
        None
        if backbone_config.init == "random"
        else load_model(AutoModel, source, trust_remote_code=backbone_config.trust_remote_code)
    )
    return mean_pooling_classifier(
        stored, encoder, classifier_dropout, scalar_mix=pooling == "scalar_mix", **label_config(spec)
    )


def stored_labels(config) -> dict[int, str]:
    """The label mapping saved in a config, with integer keys."""
    return {int(index): label for index, label in config.id2label.items()}


def reinitialise_output_layer(model, num_labels: int) -> None:
    """Fresh weights for the head's last linear layer (the one producing the logits), as a new head gets.

    Loading with `ignore_mismatched_sizes` renews it when the label count changed; with the same count
    but other labels the old weights would load and mean the wrong classes.
    """
    outputs = [
        module for module in model.modules() if isinstance(module, nn.Linear) and module.out_features == num_labels
    ]
    if not outputs:
        raise CheckpointError(
            f"cannot find the output layer ({num_labels} outputs) of {type(model).__name__} to replace",
            value=type(model).__name__,
        )
    for parameter in outputs[-1].parameters():
        # transformers' initialisers skip tensors marked as loaded
        parameter._is_hf_initialized = False  # type: ignore[attr-defined]  # a flag transformers sets on tensors
    model._init_weights(outputs[-1])


# RoBERTa-style embeddings number positions from pad_token_id + 1: the first pad_token_id + 1 rows are never used.
POSITION_OFFSET_FAMILIES = {"roberta", "xlm-roberta"}


def fitted_max_length(requested: int | None, model) -> int | None:
    """`task.max_length`, shortened to the positions the model has (a checkpoint pretrained on short blocks).

    None (left out): the whole example for an AWD-LSTM (it reads any length, BPT3C), else 128 tokens (or the
    model's positions, when fewer).
    """
    config = encoder_config(model.config)
    if requested is None and config.model_type in WHOLE_DOCUMENT_TYPES:
        return None
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and config.model_type in POSITION_OFFSET_FAMILIES:
        limit -= config.pad_token_id + 1
    if requested is None:
        return min(DEFAULT_TRANSFORMER_MAX_LENGTH, limit) if limit is not None else DEFAULT_TRANSFORMER_MAX_LENGTH
    if limit is not None and requested > limit:
        console.print(f"task.max_length {requested} exceeds the model's {limit} positions: truncating to {limit}")
        return limit
    return requested


# What `save_pretrained` records in config.json's "architectures" for a model with a language-model head and no
# classifier: evaluating one would read a classifier head initialised at random.
LANGUAGE_MODEL_CLASS_ENDINGS = ("ForCausalLM", "ForMaskedLM", "LMHeadModel", "ForPreTraining")


def refuse_head_less(config, checkpoint: str) -> None:
    """A language model (a pretraining run's checkpoint) given where a fine-tuned classifier is needed: one line."""
    architectures = getattr(config, "architectures", None) or []
    if architectures and all(name.endswith(LANGUAGE_MODEL_CLASS_ENDINGS) for name in architectures):
        raise CheckpointError(
            f"{checkpoint} is a language model ({', '.join(architectures)}), not a fine-tuned "
            "classifier: fine-tune it on the task first (finetune finetune, model.checkpoint: that "
            "folder)",
            value=checkpoint,
        )


def load_finetuned(name: str, spec: TaskSpec, *, trust_remote_code: bool = False):
    """A fine-tuned checkpoint whose stored label mapping must match the task's labels, in order; refusals are
    CheckpointErrors, named by the caller (`recipe_key`)."""
    source = resolve_checkpoint(name)
    config = load_pretrained(AutoConfig.from_pretrained, source, trust_remote_code=trust_remote_code)
    refuse_language_model_only(config, name)
    refuse_family_without_a_head(name, config)
    model = load_model(AutoModelForSequenceClassification, source, trust_remote_code=trust_remote_code, config=config)
    refuse_head_less(config, name)  # after loading: a damaged weights file is named first
    expected = label_config(spec)["id2label"]
    stored = stored_labels(model.config)
    if stored != expected:
        raise CheckpointError(f"{name} predicts labels {stored}, but task '{spec.name}' has {expected}", value=stored)
    return model
