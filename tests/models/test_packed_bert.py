"""BERT classifiers predict without padding (models/packed_bert.py): the same logits as Hugging Face's forward."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2ForSequenceClassification

from finetune.models.mean_pooling import mean_pooling_classifier
from finetune.models.packed_bert import packed_logits

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


@pytest.mark.parametrize("case", ["training", "left padding", "scalar mix", "other family", "no mask", "extra input"])
def test_what_it_does_not_compute_exactly_is_left_to_the_models_own_forward(case):
    model, batch = bert_classifier(), padded_pairs()
    if case == "training":
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


def test_prediction_takes_the_packed_route_and_keeps_the_logits(monkeypatch):
    from accelerate import Accelerator

    from finetune.inference import predict

    model, batches = bert_classifier(), [padded_pairs(3), padded_pairs(4)]
    taken = []

    def recording(*arguments, **inputs):
        logits = packed_logits(*arguments, **inputs)
        taken.append(logits is not None)
        return logits

    monkeypatch.setattr(predict, "packed_logits", recording)
    logits = predict.predict_logits(Accelerator(cpu=True), model, batches)
    assert taken == [True, True]
    with torch.inference_mode():
        expected = torch.cat([model(**batch).logits for batch in batches]).numpy()
    assert logits.shape == (8, 3)
    assert abs(logits - expected).max() < 1e-5
