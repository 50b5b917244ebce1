"""BERT classifiers and taggers train and predict without padding (models/packed_bert.py): the same logits, losses
and gradients as Hugging Face's forward, and the same dropout sites."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    RobertaConfig,
)

from finetune.models.mean_pooling import mean_pooling_classifier
from finetune.models.packed_bert import packed_logits, train_without_padding

CONFIG = dict(
    vocab_size=60,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=32,
    max_position_embeddings=32,
    num_labels=3,
    hidden_dropout_prob=0.3,
    attention_probs_dropout_prob=0.3,
)


def padded_pairs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded pairs of different lengths (one row unpadded), segment ids 0 then 1, pad id 0."""
    generator = torch.Generator().manual_seed(seed)
    lengths, width = [12, 5, 9, 1], 12
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(1, 60, (length,), generator=generator)
        token_type_ids[row, length // 2 : length] = 1
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "token_type_ids": token_type_ids}


def bert_classifier() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(**CONFIG)).eval()


def test_the_cls_classifier_gives_hugging_faces_logits_on_padded_pairs():
    model, batch = bert_classifier(), padded_pairs()
    with torch.inference_mode():
        expected = model(**batch).logits
        packed = packed_logits(model, **batch)
    assert packed is not None
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-5)
    # What stands at the padded positions never matters: other pad ids, the same logits.
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 7)
    with torch.inference_mode():
        torch.testing.assert_close(packed_logits(model, **batch), packed, atol=1e-6, rtol=1e-6)


def test_without_segment_ids_every_token_is_segment_zero():
    model, batch = bert_classifier(), padded_pairs(1)
    del batch["token_type_ids"]
    with torch.inference_mode():
        torch.testing.assert_close(packed_logits(model, **batch), model(**batch).logits, atol=1e-5, rtol=1e-5)


def test_the_mean_pooling_classifier_averages_the_real_tokens_as_its_forward_does():
    torch.manual_seed(0)
    config = BertConfig(**CONFIG)
    model = mean_pooling_classifier(
        config, None, None, id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2}
    ).eval()
    batch = padded_pairs(2)
    with torch.inference_mode():
        packed = packed_logits(model, **batch)
        torch.testing.assert_close(packed, model(**batch).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "case", ["activation checkpointing", "left padding", "scalar mix", "other family", "no mask", "extra input"]
)
def test_what_it_does_not_compute_exactly_is_left_to_the_models_own_forward(case):
    model, batch = bert_classifier(), padded_pairs()
    if case == "activation checkpointing":  # trains to save memory: the route would keep every activation
        model.activation_checkpointing_enable()
        model.train()
    elif case == "left padding":
        batch = {name: value.flip(1) for name, value in batch.items()}
    elif case == "scalar mix":
        model = mean_pooling_classifier(BertConfig(**CONFIG), None, None, scalar_mix=True).eval()
    elif case == "other family":
        model = GPT2ForSequenceClassification(GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2)).eval()
        del batch["token_type_ids"]
    elif case == "no mask":
        del batch["attention_mask"]
    else:
        batch["position_ids"] = torch.arange(12).expand(4, 12)
    with torch.inference_mode():
        assert packed_logits(model, **batch) is None


def record_the_route(monkeypatch, module) -> list[bool]:
    """Each call of `module`'s packed_logits from now on: whether it took the packed route (True) or declined."""
    taken = []

    def recording(*arguments, **inputs):
        logits = packed_logits(*arguments, **inputs)
        taken.append(logits is not None)
        return logits

    monkeypatch.setattr(module, "packed_logits", recording)
    return taken


def test_prediction_takes_the_packed_route_and_keeps_the_logits(monkeypatch):
    from accelerate import Accelerator

    from finetune.inference import predict

    model, batches = bert_classifier(), [padded_pairs(3), padded_pairs(4)]
    taken = record_the_route(monkeypatch, predict)
    logits = predict.predict_logits(Accelerator(cpu=True), model, batches)
    assert taken == [True, True]
    with torch.inference_mode():
        expected = torch.cat([model(**batch).logits for batch in batches]).numpy()
    assert logits.shape == (8, 3)
    assert abs(logits - expected).max() < 1e-5


WITHOUT_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "classifier_dropout": 0.0}


def twin_models(head: str, **config) -> tuple:
    """Two copies of one model in training mode, the second given the forward without padding; its labels for
    `padded_pairs`."""
    torch.manual_seed(0)
    settings = {**CONFIG, **config}
    if head == "tokens":
        model = BertForTokenClassification(BertConfig(**settings))
        labels = torch.randint(0, 3, (4, 12)).masked_fill(padded_pairs()["attention_mask"] == 0, -100)
    elif head == "mean":
        labels_config = {"id2label": {0: "a", 1: "b", 2: "c"}, "label2id": {"a": 0, "b": 1, "c": 2}}
        model = mean_pooling_classifier(BertConfig(**settings), None, settings["classifier_dropout"], **labels_config)
        labels = torch.tensor([0, 2, 1, 1])
    else:
        problem = {"regression": (1, torch.randn(4)), "multilabel": (3, torch.randint(0, 2, (4, 3)).float())}
        labels_count, labels = problem.get(head, (3, torch.tensor([0, 2, 1, 1])))
        settings["num_labels"] = labels_count
        if head == "multilabel":
            settings["problem_type"] = "multi_label_classification"
        model = BertForSequenceClassification(BertConfig(**settings))
    twin = type(model)(model.config)
    twin.load_state_dict(model.state_dict())
    assert train_without_padding(twin)
    return model.train(), twin.train(), labels


@pytest.mark.parametrize("head", ["cls", "mean", "tokens", "regression", "multilabel"])
def test_training_without_padding_gives_hugging_faces_loss_and_gradients(head):
    model, twin, labels = twin_models(head, **WITHOUT_DROPOUT)
    taken = []
    batch = padded_pairs()
    for each in (model, twin):
        output = each(**batch, labels=labels)
        output.loss.backward()
        taken.append(output)
    real = batch["attention_mask"].bool()
    logits = [output.logits[real] if head == "tokens" else output.logits for output in taken]  # tags: real tokens
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(taken[1].loss, taken[0].loss, atol=1e-6, rtol=1e-5)
    gradients = [{name: weight.grad for name, weight in each.named_parameters()} for each in (model, twin)]
    assert sum(grad is not None for grad in gradients[0].values()) > 10
    for name, grad in gradients[0].items():
        if grad is None:  # a weight the forward never reads (the pooler of a tagger)
            assert gradients[1][name] is None, name
        else:
            torch.testing.assert_close(gradients[1][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "site",
    [
        {"hidden_dropout_prob": 0.5},
        {"hidden_dropout_prob": 0.5, "num_hidden_layers": 0},  # the embeddings' alone
        {"attention_probs_dropout_prob": 0.5},
        {"classifier_dropout": 0.5},
    ],
)
def test_each_of_the_models_dropout_sites_drops_in_training_and_none_in_evaluation(site):
    """One site's dropout on, the others off: two training forwards differ, two evaluation ones give Hugging Face's."""
    _, twin, _ = twin_models("cls", **{**WITHOUT_DROPOUT, **site})
    batch = padded_pairs()
    first, second = twin(**batch).logits, twin(**batch).logits
    assert not torch.allclose(first, second), f"{site}: nothing was dropped"
    with torch.inference_mode():
        evaluated = twin.eval()(**batch).logits
        torch.testing.assert_close(evaluated, type(twin).forward(twin, **batch).logits, atol=1e-5, rtol=1e-5)


def test_what_the_route_does_not_cover_takes_the_models_own_forward_in_training():
    model, twin, labels = twin_models("cls", **WITHOUT_DROPOUT)
    batch = {name: value.flip(1) for name, value in padded_pairs().items()}  # left padding
    torch.testing.assert_close(twin(**batch, labels=labels).loss, model(**batch, labels=labels).loss)
    gpt2 = GPT2ForSequenceClassification(GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2))
    # Models it never computes get no forward of its own, so the run does not claim to skip their padding.
    roberta = RobertaConfig(**{**CONFIG, "max_position_embeddings": 40})
    never = [
        gpt2,
        mean_pooling_classifier(BertConfig(**CONFIG), None, None, scalar_mix=True),
        mean_pooling_classifier(roberta, None, None),  # other position ids
    ]
    for other in never:
        assert not train_without_padding(other) and "forward" not in vars(other), type(other).__name__


def test_a_copy_of_a_model_without_padding_computes_with_its_own_weights():
    import copy

    _, twin, _ = twin_models("cls", **WITHOUT_DROPOUT)
    copied = copy.deepcopy(twin)
    with torch.no_grad():
        copied.classifier.bias.add_(1.0)
    batch = padded_pairs()
    difference = copied(**batch).logits - twin(**batch).logits
    torch.testing.assert_close(difference, torch.ones_like(difference))


def test_tag_prediction_takes_the_packed_route_and_keeps_each_sentences_logits(monkeypatch):
    from finetune.kinds.tokens import training

    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig(**CONFIG)).eval()
    batches = [padded_pairs(5), padded_pairs(6)]
    taken = record_the_route(monkeypatch, training)
    logits, _ = training.sentence_logits(model, batches, torch.device("cpu"))
    assert taken == [True, True]
    with torch.inference_mode():
        expected = [
            row[: int(length)]
            for batch in batches
            for row, length in zip(model(**batch).logits, batch["attention_mask"].sum(dim=1), strict=True)
        ]
    assert [len(row) for row in logits] == [12, 5, 9, 1] * 2
    for row, reference in zip(logits, expected, strict=True):
        assert abs(row - reference.numpy()).max() < 1e-5


def test_with_dropout_the_logits_are_distributed_as_hugging_faces():
    """Every site at 0.3: over 300 draws each, the mean of each logit agrees with Hugging Face's forward within 4.5
    standard errors, and its spread within 25% (a site dropped twice, or left unscaled, moves both)."""
    model, twin, _ = twin_models("cls", classifier_dropout=0.3)  # CONFIG: 0.3 at every other site
    batch = padded_pairs()
    with torch.no_grad():
        draws = [torch.stack([each(**batch).logits for _ in range(300)]) for each in (model, twin)]
    (mean, spread), (twin_mean, twin_spread) = ((each.mean(0), each.std(0)) for each in draws)
    assert float(spread.min()) > 1e-3, "no dropout noise: the comparison would prove nothing"
    standard_error = (spread.square() / 300 + twin_spread.square() / 300).sqrt()
    assert bool(((twin_mean - mean).abs() < 4.5 * standard_error).all()), (twin_mean - mean) / standard_error
    assert bool(((twin_spread / spread - 1).abs() < 0.25).all()), twin_spread / spread


def test_a_model_whose_linear_layers_torch_quantized_runs_its_own_forward():
    """torch's dynamic int8 replaces nn.Linear by modules whose weight is a method: the route leaves them alone."""
    from transformers import BertConfig, BertForSequenceClassification

    from finetune.models.packed_bert import covers

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = BertForSequenceClassification(config).eval()
    assert covers(model)
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    assert not covers(quantized)
