"""model.keep_layers: a smaller model of some of a checkpoint's blocks (DistilBERT's student initialisation) that
saves and loads in transformers as a model of that depth, for every family that has a stack of blocks."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from finetune.errors import InputError
from finetune.models.student import keep_blocks, kept_blocks
from tests.tiny_families import tiny_config, tiny_tokenizer

FAMILIES = ("bert", "roberta", "distilbert", "deberta-v2", "modernbert", "gpt2", "llama", "qwen2")


def tiny_classifier(model_type: str, layers: int = 4):
    tokenizer = tiny_tokenizer(model_type)
    depth = {"distilbert": "n_layers", "gpt2": "n_layer"}.get(model_type, "num_hidden_layers")
    config = tiny_config(model_type, tokenizer, **{depth: layers}, num_labels=3)
    if tokenizer.pad_token is None:  # decoders: pad with their end of text, and pool before it
        tokenizer.pad_token = tokenizer.eos_token
        config.pad_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config).eval(), tokenizer


@pytest.mark.parametrize("family", FAMILIES)
def test_kept_blocks_save_as_a_shallower_model_that_reloads_with_the_same_logits(family, tmp_path):
    model, tokenizer = tiny_classifier(family)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    line = keep_blocks(model, "every_other")
    assert line == "2 of the 4 blocks kept (0, 2)"
    after = model.state_dict()
    # The second block kept is block 2 of the four, its own weights; the embeddings and head are untouched.
    moved = [name for name in after if ".1." in name and name.replace(".1.", ".2.", 1) in before]
    assert moved and all(torch.equal(after[name], before[name.replace(".1.", ".2.", 1)]) for name in moved)
    assert sum(value.numel() for value in after.values()) < sum(value.numel() for value in before.values())
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    inputs = tokenizer(["the film was great .", "so dull"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.allclose(model(**inputs).logits, reloaded(**inputs).logits, atol=1e-6)
    assert len(list(reloaded.base_model.modules())) == len(list(model.base_model.modules()))


def test_a_list_keeps_those_blocks_in_its_order_and_out_of_range_is_refused():
    assert kept_blocks("every_other", 6) == [0, 2, 4]
    assert kept_blocks([5, 0], 6) == [5, 0]
    with pytest.raises(InputError, match=r"^block 6 is out of range: the model has 6 blocks \(0 to 5\)$"):
        kept_blocks([0, 6], 6)
    with pytest.raises(InputError, match=r"keeps all 2 blocks; leave it out"):
        kept_blocks([0, 1], 2)
