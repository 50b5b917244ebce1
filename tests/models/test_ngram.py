"""The n-gram baseline (model.family ngram): modified Kneser-Ney against hand computations, its Hugging Face
checkpoint, and `finetune pretrain` counting it and scoring it in the neural families' units."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.pretraining_text import pretraining_text
from finetune.inference.language_model_validation import validation_metrics
from finetune.models.language_models import loss_module, train_tokenizer
from finetune.models.ngram import (
    FALLBACK_DISCOUNTS,
    NGramForCausalLM,
    estimate_kneser_ney,
    modified_kneser_ney_discounts,
)
from finetune.recipes import TokenizerConfig, load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.pretrain_data import language_model_data
from finetune.training.loop import make_accelerator
from tests.conftest import eval_recipe, finetune_recipe, pretrain_recipe, write_corpus, write_task, write_yaml

runner = CliRunner()


def probabilities_after(model: NGramForCausalLM, context: list[int]) -> list[float]:
    """p(w | context) for every w of the vocabulary, each read as a target (not from the dense distribution)."""
    rows = torch.tensor([context + [word] for word in range(model.config.vocab_size)])
    return model.target_log_probabilities(rows)[:, -1].exp().tolist()


# ---------------------------------------------------------------------------------------------
# Modified Kneser-Ney, by hand
# ---------------------------------------------------------------------------------------------


def test_discounts_are_chen_and_goodmans_closed_form():
    # Count-of-counts n1..n4 = 4, 2, 1, 1 (the 5 counts no discount reads).
    counts = np.array([1, 1, 1, 1, 2, 2, 3, 4, 5])
    # Y = n1 / (n1 + 2 n2) = 4 / 8 = 1/2
    # D1 = 1 - 2 Y n2 / n1 = 1 - 2 * 1/2 * 2/4 = 1/2
    # D2 = 2 - 3 Y n3 / n2 = 2 - 3 * 1/2 * 1/2 = 5/4
    # D3+ = 3 - 4 Y n4 / n3 = 3 - 4 * 1/2 * 1/1 = 1
    assert modified_kneser_ney_discounts(counts) == pytest.approx((0.5, 1.25, 1.0))
    # No count of 3 (n3 = 0): the closed form divides by zero, so KenLM's fallback.
    assert modified_kneser_ney_discounts(np.array([1, 1, 2, 4])) == FALLBACK_DISCOUNTS
    # n1..n4 = 1, 1, 4, 1: D2 = 2 - 3 * 1/3 * 4/1 = -2 leaves (0, 2]: the fallback too.
    assert modified_kneser_ney_discounts(np.array([1, 2, 3, 3, 3, 3, 4])) == FALLBACK_DISCOUNTS


def test_trigram_probabilities_match_a_hand_computation():
    """Corpus 0 1 0 1 0 2, vocabulary {0, 1, 2, 3} (3 never occurs), order 3. Every order's count-of-counts lacks
    n2 or n3, so every order uses the fallback discounts D1 = 1/2, D2 = 1, D3+ = 3/2.

    Unigrams, continuation counts N1+(. w) from the bigram types 01, 10, 02: 0: 1, 1: 1, 2: 1 (total 3).
      p1(w) = (1 - 1/2)/3 + gamma1/4 with gamma1 = 3 * (1/2) / 3 = 1/2: p1(0..2) = 1/6 + 1/8 = 7/24, p1(3) = 1/8.
    Bigrams, continuation counts from the trigram types 010, 101, 102: 01: 1 (from 1), 10: 1 (from 0), 02: 1 (from 1).
      context 0: 01 and 02, total 2, gamma2(0) = (1/2 + 1/2)/2 = 1/2; alpha(1|0) = alpha(2|0) = (1 - 1/2)/2 = 1/4.
      p2(.|0) = (0 + 7/48, 1/4 + 7/48, 1/4 + 7/48, 0 + 1/16) = (7, 19, 19, 3) / 48.
      context 1: 10 only, total 1, gamma2(1) = 1/2: p2(.|1) = (1/2 + 7/48, 7/48, 7/48, 1/16) = (31, 7, 7, 3) / 48.
    Trigrams, raw counts: 010: 2, 101: 1, 102: 1.
      context 1 0: 101 and 102, total 2, gamma3 = (1/2 + 1/2)/2 = 1/2; alpha(1|1 0) = alpha(2|1 0) = 1/4.
      p3(.|1 0) = (1/2 * 7/48, 1/4 + 19/96, 1/4 + 19/96, 1/2 * 3/48) = (7, 43, 43, 3) / 96.
      context 0 1: 010 only (count 2: D2 = 1), total 2, alpha(0|0 1) = 1/2, gamma3 = 1/2 over p2(.|1).
      p3(.|0 1) = (1/2 + 31/96, 7/96, 7/96, 3/96) = (79, 7, 7, 3) / 96.
    A context never seen passes the order below through: p(.|2 3) = p2(.|3) = p1; p(.|3 0) = p2(.|0).
    """
    model = NGramForCausalLM.from_tables(estimate_kneser_ney(np.array([0, 1, 0, 1, 0, 2]), 4, 3), 4, 6)
    assert model.config.discounts == [list(FALLBACK_DISCOUNTS)] * 3
    expected = {
        (1, 0): [Fraction(n, 96) for n in (7, 43, 43, 3)],
        (0, 1): [Fraction(n, 96) for n in (79, 7, 7, 3)],
        (2, 3): [Fraction(n, 24) for n in (7, 7, 7, 3)],
        (3, 0): [Fraction(n, 48) for n in (7, 19, 19, 3)],
        (0,): [Fraction(n, 48) for n in (7, 19, 19, 3)],  # the start of a row: only one token of context
    }
    for context, probabilities in expected.items():
        assert probabilities_after(model, list(context)) == pytest.approx([float(p) for p in probabilities]), context
    # The dense distribution (forward's logits) says the same.
    logits = model(torch.tensor([[0, 1, 0]])).logits[0, -1]
    assert logits.exp().tolist() == pytest.approx([float(p) for p in expected[(1, 0)]], abs=1e-6)


def test_order_one_is_a_smoothed_unigram():
    """Raw counts 0: 1, 1: 1, 2: 2, 3: 3, 4: 4, 5: 0 over 11 tokens, vocabulary 6: n1..n4 = 2, 1, 1, 1, so the
    closed form: Y = 2/4, D1 = 1 - 2 * 1/2 * 1/2 = 1/2, D2 = 2 - 3 * 1/2 * 1 = 1/2, D3+ = 3 - 4 * 1/2 * 1 = 1.
    gamma = (2 * 1/2 + 1 * 1/2 + 2 * 1) / 11 = 7/22, spread as 7/22 / 6 = 7/132 over the vocabulary:
    p = ((1 - 1/2)/11, same, (2 - 1/2)/11, (3 - 1)/11, (4 - 1)/11, 0) + 7/132 = (13, 13, 25, 31, 43, 7) / 132."""
    stream = np.array([4, 3, 2, 4, 0, 3, 4, 1, 2, 3, 4])
    model = NGramForCausalLM.count(stream, vocab_size=6, order=1)
    assert model.config.discounts == [pytest.approx([0.5, 0.5, 1.0])]
    unigram = [n / 132 for n in (13, 13, 25, 31, 43, 7)]
    for context in ([4], [0, 1], [5, 5, 5], [2, 3, 4]):  # the context changes nothing
        assert probabilities_after(model, context) == pytest.approx(unigram)


def test_probabilities_sum_to_one_for_seen_and_unseen_contexts():
    rng = np.random.default_rng(0)
    vocab_size = 40
    stream = rng.zipf(1.5, size=3000).clip(max=vocab_size - 3)  # ids 0, 38 and 39 never occur
    model = NGramForCausalLM.count(stream, vocab_size, order=4)
    seen = [stream[10:13].tolist(), stream[500:503].tolist(), stream[7:9].tolist()]
    unseen = [[39, 38, 39], [stream[0], 39, stream[1]], [38]]  # never counted, or a counted word after a new one
    for context in seen + unseen:
        targets = probabilities_after(model, context)
        dense = model(torch.tensor([context])).logits[0, -1].exp()
        assert math.fsum(targets) == pytest.approx(1.0, abs=1e-6), context
        assert dense.sum().item() == pytest.approx(1.0, abs=1e-5)
        assert dense.tolist() == pytest.approx(targets, rel=1e-5, abs=1e-8)
    # The predictions are the most probable words of the dense distributions (with ties, the lowest id), and
    # forward's loss is the mean nats per token.
    rows = torch.from_numpy(np.concatenate([stream[:57], [39, 38, 0]]).reshape(3, 20))
    logits = model(rows).logits
    predictions = model.next_token_predictions(rows)
    assert torch.allclose(logits.gather(2, predictions.unsqueeze(2)).squeeze(2), logits.max(dim=2).values, atol=1e-6)
    assert (predictions == logits.argmax(dim=-1)).float().mean() > 0.9
    assert model(rows, labels=rows).loss.item() == pytest.approx(model.nats_per_token(rows), rel=1e-5)


def test_a_trigram_model_beats_the_uniform_baseline_on_repetitive_text():
    rng = np.random.default_rng(1)
    phrases = [[5, 9, 2, 7], [5, 9, 3], [8, 1, 1, 4, 6]]
    text = np.concatenate([phrases[index] for index in rng.integers(0, 3, size=600)])
    train, held_out = text[:2000], torch.from_numpy(text[2000:])
    vocab_size = 50
    trigram = NGramForCausalLM.count(train, vocab_size, order=3)
    unigram = NGramForCausalLM.count(train, vocab_size, order=1)
    assert trigram.nats_per_token(held_out) < 0.5 < unigram.nats_per_token(held_out) < math.log(vocab_size)


def test_a_saved_model_reloads_with_identical_scores(tmp_path):
    rng = np.random.default_rng(2)
    stream = rng.integers(0, 30, size=2000) % rng.integers(1, 30, size=2000)  # skewed towards small ids
    model = NGramForCausalLM.count(stream, vocab_size=32, order=3, eos_token_id=0)
    model.save_pretrained(tmp_path / "ngram")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ngram")
    assert isinstance(reloaded, NGramForCausalLM) and reloaded.config.table_sizes == model.config.table_sizes
    rows = torch.from_numpy(rng.integers(0, 32, size=(4, 25)))
    assert torch.equal(reloaded.target_log_probabilities(rows), model.target_log_probabilities(rows))
    assert torch.equal(reloaded(rows).logits, model(rows).logits)


# ---------------------------------------------------------------------------------------------
# `finetune pretrain` with model.family ngram
# ---------------------------------------------------------------------------------------------


def ngram_recipe(tmp_path: Path, corpus: Path, **model) -> dict:
    """A tiny ngram pretrain recipe with its own validation file (the last 30 generated lines)."""
    lines = corpus.read_text(encoding="utf-8").splitlines()
    corpus.write_text("\n".join(lines[:-30]) + "\n", encoding="utf-8")
    validation = corpus.with_name("valid.txt")
    validation.write_text("\n".join(lines[-30:]) + "\n", encoding="utf-8")
    data = pretrain_recipe(corpus, tmp_path / "run")
    data["model"] = {"family": "ngram", **model}
    data["corpus"].update(validation_files=[str(validation)])
    data["corpus"].pop("validation_fraction")
    return data


def test_pretrain_counts_scores_and_saves_a_checkpoint_that_reloads(tmp_path, corpus_file):
    recipe_file = write_yaml(tmp_path / "recipe.yaml", ngram_recipe(tmp_path, corpus_file, order=3))
    result = runner.invoke(app, ["pretrain", str(recipe_file)])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    [record] = read_metrics(run / "metrics.jsonl")  # one validation, with the keys of the neural families'
    assert set(record) == {"phase", "step", "epoch", "validation_loss", "validation_perplexity", "next_token_accuracy"}
    assert record["phase"] == "eval" and record["step"] == 0
    assert record["validation_perplexity"] == pytest.approx(math.exp(record["validation_loss"]))
    assert 0 < record["next_token_accuracy"] <= 1 and 0 < record["validation_loss"] < math.log(200)
    assert (run / "checkpoint" / "README.md").is_file() and (run / "timing.json").is_file()
    # The checkpoint reloads with the Auto classes and scores the same validation blocks identically.
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoint")
    tokenizer = AutoTokenizer.from_pretrained(run / "checkpoint")
    assert isinstance(model, NGramForCausalLM) and model.config.order == 3
    assert model.config.vocab_size == len(tokenizer)
    recipe = load_recipe(recipe_file)
    accelerator = make_accelerator(recipe.training)
    train_tokens, validation_tokens = pretraining_text(recipe.corpus, recipe.seed).tokenize(tokenizer, None, False)
    assert model.config.training_tokens == train_tokens.token_count + len(train_tokens)  # a separator after each
    _, validation = language_model_data(recipe, tokenizer, train_tokens, validation_tokens, accelerator)
    loader = torch.utils.data.DataLoader(validation, batch_size=recipe.training.batch_size)
    metrics = validation_metrics(accelerator, loss_module(recipe.model, model), loader, "next_token_accuracy")
    assert metrics == {key: record[key] for key in metrics}
    ids = tokenizer(["the film was great ."], return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


@pytest.fixture(scope="module")
def ngram_checkpoint(tmp_path_factory) -> Path:
    """A tiny counted trigram model with its byte-level BPE tokenizer, saved as a checkpoint folder."""
    folder = tmp_path_factory.mktemp("ngram")
    documents = read_documents([write_corpus(folder / "corpus")])
    tokenizer = train_tokenizer("gpt2", documents, TokenizerConfig(vocab_size=200, min_frequency=1, lowercase=False))
    stream = np.array([token for document in documents for token in tokenizer(document)["input_ids"]])
    model = NGramForCausalLM.count(stream, len(tokenizer), order=3, eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(folder / "checkpoint")
    tokenizer.save_pretrained(folder / "checkpoint")
    return folder / "checkpoint"


def streamed(data: dict, tmp_path: Path, checkpoint: Path) -> None:
    """A `datasets` corpus read as a stream (nothing is read: the recipe is refused first)."""
    data["corpus"] = {
        "dataset": "json",
        "dataset_files": [str(tmp_path / "rows.jsonl")],
        "streaming": True,
        "validation_documents": 5,
    }


REFUSALS = {
    "continuing a checkpoint": (
        lambda data, tmp, checkpoint: data["model"].update(checkpoint=str(checkpoint)),
        ["pretrain"],
        ("model.checkpoint", "counted from scratch"),
    ),
    "a streamed corpus": (streamed, ["pretrain"], ("corpus.streaming", "ngram counts the whole corpus")),
    "masking": (
        lambda data, tmp, checkpoint: data.update(masking={"probability": 0.2}),
        ["pretrain"],
        ("masking applies to masked LMs",),
    ),
    "a backward corpus": (
        lambda data, tmp, checkpoint: data["corpus"].update(reverse=True),
        ["pretrain"],
        ("corpus.reverse", "counts forwards"),
    ),
    "an order past 6": (lambda data, tmp, checkpoint: data["model"].update(order=7), ["pretrain"], ("model.order",)),
    "--resume": (None, ["pretrain", "--resume"], ("--resume", "one pass")),
    "lr-find": (None, ["lr-find"], ("lr-find", "no learning rate")),
    "profile": (None, ["profile"], ("model.family ngram", "profile")),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_what_an_ngram_run_cannot_do_is_one_line_and_exit_code_2(case, tmp_path, corpus_file, ngram_checkpoint):
    change, command, named = case
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    data["model"] = {"family": "ngram"}
    if change is not None:
        change(data, tmp_path, ngram_checkpoint)
    recipe = write_yaml(tmp_path / "recipe.yaml", data)
    result = runner.invoke(app, [command[0], str(recipe), *command[1:]])
    assert_one_error_line(result, named)
    assert not (tmp_path / "run").exists() and not (tmp_path / "run-lr-find").exists()


@pytest.mark.parametrize("stage", ["finetune", "eval"])
def test_an_ngram_checkpoint_is_refused_as_a_classifier(stage, tmp_path, ngram_checkpoint):
    task = write_task(tmp_path / "task")
    data = (
        finetune_recipe(ngram_checkpoint, task, tmp_path / "run")
        if stage == "finetune"
        else eval_recipe(task, tmp_path / "run", {"baseline": str(ngram_checkpoint)})
    )
    result = runner.invoke(app, [stage, str(write_yaml(tmp_path / "recipe.yaml", data))])
    key = "model.checkpoint" if stage == "finetune" else "models.baseline"
    assert_one_error_line(result, (key, "'ngram' model", "no sequence-classification head"))


def assert_one_error_line(result, named: tuple[str, ...]) -> None:
    output = result.output.strip()
    assert result.exit_code == 2, f"exit code {result.exit_code}: {result.output[-2000:]}"
    assert output.startswith("error: ") and "\n" not in output, f"not one error line: {output[:2000]!r}"
    for fragment in named:
        assert fragment in output, f"{fragment!r} not named in {output!r}"
