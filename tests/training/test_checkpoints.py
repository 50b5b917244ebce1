"""Checkpoints in Hugging Face format (written atomically) and the sparse masked-LM loss."""

from __future__ import annotations

import pytest
import torch
import yaml
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertForMaskedLM

from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_wordpiece
from finetune.models.masked_lm import SparseMaskedLM, build_masked_lm, masked_lm_loss
from finetune.recipes import MaskedLMModelConfig, load_recipe
from finetune.tasks.specs import IGNORE_INDEX
from finetune.training.checkpoints import HYPERPARAMETERS_FILE, save_checkpoint

SAMPLE_TEXTS = ["the film was really great .", "The Plot was DULL, and the acting clumsy!", "unseen words: zebra"]


@pytest.fixture
def tokenizer(corpus_file):
    return train_wordpiece(read_documents([corpus_file])[:50], vocab_size=120, min_frequency=1)


def tiny_masked_lm(vocab_size: int, seed: int = 0) -> BertForMaskedLM:
    torch.manual_seed(seed)
    return build_masked_lm(
        MaskedLMModelConfig(layers=2, hidden=32, heads=2, intermediate=64, dropout=0.1),
        vocab_size,
        max_positions=32,
        pad_token_id=0,
    )


def assert_same_weights(first, second):
    first_state, second_state = first.state_dict(), second.state_dict()
    assert set(first_state) == set(second_state)
    for name, tensor in first_state.items():
        assert torch.equal(tensor, second_state[name]), name


def test_trained_tokenizer(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ids = tokenizer("the film", "was great")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert ids.count(tokenizer.sep_token_id) == 2
    assert (
        tokenizer.decode(tokenizer("The Film was GREAT")["input_ids"], skip_special_tokens=True) == "the film was great"
    )
    assert len(tokenizer) <= 120


def test_pair_encoding_carries_segment_ids(tokenizer):
    """The template marks the second segment with type id 1 ($B:1 [SEP]:1); BERT needs it for sentence pairs."""
    encoded = tokenizer("the film", "was great")
    assert "token_type_ids" in encoded, f"no segment ids returned (model_input_names={tokenizer.model_input_names})"
    first_length = len(tokenizer("the film")["input_ids"])
    assert encoded["token_type_ids"] == [0] * first_length + [1] * (len(encoded["input_ids"]) - first_length)


def test_save_checkpoint_loads_with_transformers(tokenizer, tmp_path, pretrain_recipe_data, write_recipe):
    model = tiny_masked_lm(len(tokenizer))
    recipe = load_recipe(write_recipe(pretrain_recipe_data))
    directory = save_checkpoint(model, tokenizer, tmp_path / "run" / "checkpoint", recipe)
    assert directory == tmp_path / "run" / "checkpoint"
    assert (directory / "model.safetensors").is_file() and (directory / "config.json").is_file()
    assert not (tmp_path / "run" / "checkpoint.partial").exists()
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["checkpoint"]

    loaded = AutoModelForMaskedLM.from_pretrained(directory)
    assert type(loaded) is BertForMaskedLM
    assert_same_weights(model, loaded)
    loaded_tokenizer = AutoTokenizer.from_pretrained(directory)
    for text in SAMPLE_TEXTS:
        assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert loaded_tokenizer(text, "a pair")["input_ids"] == tokenizer(text, "a pair")["input_ids"]
    assert loaded_tokenizer.mask_token_id == tokenizer.mask_token_id

    saved_recipe = yaml.safe_load((directory / HYPERPARAMETERS_FILE).read_text(encoding="utf-8"))
    assert saved_recipe["stage"] == "pretrain" and saved_recipe["model"]["hidden"] == 32

    # Same outputs, not just the same tensors.
    model.eval(), loaded.eval()
    input_ids = torch.tensor([tokenizer("the film was great")["input_ids"]])
    assert torch.allclose(model(input_ids=input_ids).logits, loaded(input_ids=input_ids).logits, atol=1e-6)


def test_save_checkpoint_without_recipe(tokenizer, tmp_path):
    directory = save_checkpoint(tiny_masked_lm(len(tokenizer)), tokenizer, tmp_path / "checkpoint")
    assert (directory / "model.safetensors").is_file()
    assert not (directory / HYPERPARAMETERS_FILE).exists()


def test_overwriting_a_checkpoint(tokenizer, tmp_path):
    target = tmp_path / "run" / "checkpoint"
    save_checkpoint(tiny_masked_lm(len(tokenizer), seed=0), tokenizer, target)
    (target / "stale-file.txt").write_text("from the first save")
    second = tiny_masked_lm(len(tokenizer), seed=1)
    save_checkpoint(second, tokenizer, target)
    assert_same_weights(second, AutoModelForMaskedLM.from_pretrained(target))
    assert not (target / "stale-file.txt").exists()
    assert sorted(path.name for path in target.parent.iterdir()) == ["checkpoint"]  # no .partial, no .previous


def test_save_checkpoint_clears_a_leftover_partial(tokenizer, tmp_path):
    leftover = tmp_path / "checkpoint.partial"
    leftover.mkdir()
    (leftover / "junk.bin").write_text("killed mid-save")
    directory = save_checkpoint(tiny_masked_lm(len(tokenizer)), tokenizer, tmp_path / "checkpoint")
    assert not leftover.exists() and not (directory / "junk.bin").exists()


def test_build_masked_lm_sizes():
    config = MaskedLMModelConfig(layers=3, hidden=48, heads=4)
    model = build_masked_lm(config, vocab_size=77, max_positions=20, pad_token_id=0)
    assert model.config.num_hidden_layers == 3 and model.config.hidden_size == 48
    assert model.config.num_attention_heads == 4 and model.config.intermediate_size == 4 * 48
    assert model.config.vocab_size == 77 and model.config.max_position_embeddings == 20
    assert model.get_input_embeddings().weight.shape == (77, 48)


def _masked_batch(vocab_size: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (4, 16), generator=generator)
    chosen = torch.rand((4, 16), generator=generator) < 0.25
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    input_ids = torch.where(chosen, torch.full_like(input_ids, 4), input_ids)
    return input_ids, labels


def test_sparse_loss_equals_dense_loss():
    model = tiny_masked_lm(100)
    model.eval()
    input_ids, labels = _masked_batch(100)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 12:] = 0
    with torch.no_grad():
        dense = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        loss, count, correct = masked_lm_loss(model, input_ids, labels, attention_mask)
    assert loss.item() == pytest.approx(dense.loss.item(), abs=1e-5)
    selected = labels != IGNORE_INDEX
    assert count.item() == selected.sum().item() > 0
    assert correct.item() == (dense.logits.argmax(-1)[selected] == labels[selected]).sum().item()


def test_sparse_loss_gradients_match_dense():
    model = tiny_masked_lm(100)
    model.eval()
    input_ids, labels = _masked_batch(100, seed=1)
    model(input_ids=input_ids, labels=labels).loss.backward()
    dense_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    SparseMaskedLM(model)(input_ids, labels)[0].backward()
    sparse_grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert set(dense_grads) == set(sparse_grads)
    for name, grad in dense_grads.items():
        assert torch.allclose(grad, sparse_grads[name], atol=1e-5), name


def test_sparse_loss_without_targets_is_zero_with_a_graph():
    model = tiny_masked_lm(100)
    input_ids = torch.randint(5, 100, (2, 8))
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    model.train()
    loss, count, correct = masked_lm_loss(model, input_ids, labels)
    assert loss.item() == 0.0 and count.item() == 0
    assert correct is None  # accuracy is counted in eval mode only
    loss.backward()  # must not raise: the batch still takes part in the step
    model.eval()
    assert masked_lm_loss(model, input_ids, labels)[2].item() == 0
