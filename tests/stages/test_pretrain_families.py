"""`finetune pretrain` for the three model families: checkpoints, metrics, periodic checkpoints and `--resume`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER
from typer.testing import CliRunner

import finetune.models.awd_lstm  # noqa: F401  (registers awd_lstm with the Auto classes)
from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.token_arrays import TokenizedDocuments
from finetune.errors import UserError
from finetune.models.language_models import uses_causal_transformer
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.pretrain import run_pretrain
from finetune.training.checkpoints import TRAINING_STATE_DIR
from tests.conftest import REPO_ROOT, interrupted_at_step, pretrain_recipe, write_yaml

MODELS = {
    "bert": {"family": "bert", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "dropout": 0.1},
    "gpt2": {"family": "gpt2", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "dropout": 0.1},
    "awd_lstm": {"family": "awd_lstm", "embedding_size": 16, "hidden": 24, "layers": 2},
}
AUTO_CLASS = {
    "bert": AutoModelForMaskedLM,
    "gpt2": AutoModelForCausalLM,
    "awd_lstm": AutoModelForCausalLM,
    "ngram": AutoModelForCausalLM,
}
ACCURACY = {"bert": "masked_accuracy", "gpt2": "next_token_accuracy", "awd_lstm": "next_token_accuracy"}

runner = CliRunner()


def family_recipe(family: str, corpus: Path, run_dir: Path, tokenizer: Path | None = None, **extra) -> dict:
    """A tiny pretrain recipe for `family`: 12 steps, a periodic checkpoint every 4, evaluations every 6."""
    data = pretrain_recipe(corpus, run_dir)
    data["model"] = dict(MODELS[family])
    data["training"].update({"epochs": 2, "max_steps": 12, "log_every": 1})
    data["checkpoint_every"] = 4
    data["eval_every"] = 6
    if tokenizer is not None:
        data["tokenizer"] = {"path": str(tokenizer)}
    data.update(extra)
    return data


@pytest.mark.parametrize("family", list(MODELS))
def test_family_trains_and_its_checkpoint_loads_with_transformers(family, tmp_path, corpus_file):
    path = write_yaml(tmp_path / "recipe.yaml", family_recipe(family, corpus_file, tmp_path / "run"))
    result = runner.invoke(app, ["pretrain", str(path)])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    records = read_metrics(run / "metrics.jsonl")
    evaluations = [record for record in records if record["phase"] == "eval"]
    # Every 6 steps and at each epoch end (the epoch length depends on the family's tokenizer).
    train = [record for record in records if record["phase"] == "train"]
    epoch_ends = {
        max(record["step"] for record in train if record["epoch"] == epoch) for epoch in (0, train[-1]["epoch"])
    }
    assert [record["step"] for record in evaluations] == sorted({6} | epoch_ends) and 12 in epoch_ends
    assert all(0 <= record[ACCURACY[family]] <= 1 and record["validation_loss"] > 0 for record in evaluations)
    # The final checkpoint is a plain Hugging Face folder that transformers' Auto classes load.
    model = AUTO_CLASS[family].from_pretrained(run / "checkpoint").eval()
    tokenizer = AutoTokenizer.from_pretrained(run / "checkpoint")
    ids = tokenizer(["the film was great ."], return_tensors="pt", add_special_tokens=family == "bert")["input_ids"]
    ids = ids[:, :12]  # within the 16 positions of the tiny transformers
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))
    # Periodic checkpoints: the newest two of steps 4, 8, 12, each with the state to resume from.
    periodic = sorted(path.name for path in (run / "checkpoints").iterdir())
    assert periodic == ["step-00000008", "step-00000012"]
    progress = json.loads((run / "checkpoints" / "step-00000008" / TRAINING_STATE_DIR / "progress.json").read_text())
    assert progress["step"] == 8 and progress["epoch"] == 0 and progress["batches_in_epoch"] == 8
    assert AUTO_CLASS[family].from_pretrained(run / "checkpoints" / "step-00000008") is not None


class Interrupted(Exception):
    """Stands for the run being killed right after a periodic checkpoint."""


@pytest.mark.parametrize("family", list(MODELS))
def test_resume_continues_exactly_where_the_interrupted_run_stopped(
    family, tmp_path, corpus_file, tokenizers, monkeypatch
):
    """Uninterrupted vs interrupted at step 8 (mid-epoch 2) and resumed: the same weights and metrics, bit for bit."""
    # Two whole epochs of about 9 steps: the interruption falls inside the second epoch.
    extra = {"training": {"epochs": 2, "batch_size": 8, "lr": 1e-3, "log_every": 2, "device": "cpu"}}
    full = load_recipe(
        write_yaml(
            tmp_path / "full.yaml", family_recipe(family, corpus_file, tmp_path / "full", tokenizers[family], **extra)
        )
    )
    run_pretrain(full)

    interrupted_data = family_recipe(family, corpus_file, tmp_path / "resumed", tokenizers[family], **extra)
    interrupted = load_recipe(write_yaml(tmp_path / "resumed.yaml", interrupted_data))
    interrupt_at = 4 * (len_of_epoch(tmp_path / "full") // 4 + 1)  # the first checkpoint inside epoch 2
    with interrupted_at_step(interrupt_at, Interrupted):
        run_pretrain(interrupted)
    assert not (tmp_path / "resumed" / "checkpoint").exists()
    run_pretrain(interrupted, resume=True)

    full_weights = load_file(tmp_path / "full" / "checkpoint" / "model.safetensors")
    resumed_weights = load_file(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    assert full_weights.keys() == resumed_weights.keys()
    for name in full_weights:
        assert torch.equal(full_weights[name], resumed_weights[name]), name
    assert comparable_metrics(tmp_path / "full") == comparable_metrics(tmp_path / "resumed")


def len_of_epoch(run_dir: Path) -> int:
    """Optimizer steps in the first epoch of a finished run, from its metrics."""
    return max(
        record["step"]
        for record in read_metrics(run_dir / "metrics.jsonl")
        if record["phase"] == "eval" and record["epoch"] == 0
    )


def comparable_metrics(run_dir: Path) -> list[dict]:
    """The run's metrics without wall-clock throughput (the only field that may differ between runs)."""
    return [
        {key: value for key, value in record.items() if not key.endswith("_per_s")}
        for record in read_metrics(run_dir / "metrics.jsonl")
    ]


def test_resume_refuses_a_changed_recipe(tmp_path, corpus_file):
    data = family_recipe("gpt2", corpus_file, tmp_path / "run")
    run_pretrain(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    data["training"]["lr"] = 5e-3
    changed = load_recipe(write_yaml(tmp_path / "changed.yaml", data))
    with pytest.raises(UserError, match=r"--resume: the recipe differs .* in: training\.lr"):
        run_pretrain(changed, resume=True)


def test_resume_without_a_run_or_a_checkpoint_is_a_one_line_error(tmp_path, corpus_file):
    data = family_recipe("gpt2", corpus_file, tmp_path / "run", checkpoint_every=None)
    path = write_yaml(tmp_path / "recipe.yaml", data)
    result = runner.invoke(app, ["pretrain", str(path), "--resume"])
    assert result.exit_code == 2 and "holds no run to resume" in result.output
    assert runner.invoke(app, ["pretrain", str(path)]).exit_code == 0
    result = runner.invoke(app, ["pretrain", str(path), "--resume"])
    assert result.exit_code == 2 and "holds a finished run: nothing to resume" in result.output, result.output
    assert result.output.count("\n") == 1


def test_awd_lstm_continued_with_a_new_vocabulary(tmp_path, corpus_file):
    """ULMFiT's stage 2: an AWD-LSTM continued on new text with a tokenizer trained there (rows remapped)."""
    first = family_recipe("awd_lstm", corpus_file, tmp_path / "general", checkpoint_every=None)
    first["tokenizer"] = {"vocab_size": 400, "min_frequency": 1}  # byte-level BPE: 258 pieces before any merge
    run_pretrain(load_recipe(write_yaml(tmp_path / "general.yaml", first)))
    target = tmp_path / "target.txt"
    target.write_text(
        "\n".join(
            f"the soundtrack was {word} and moving ." for word in ["haunting", "soaring", "grating", "tinny"] * 30
        )
        + "\n",
        encoding="utf-8",
    )
    second = family_recipe("awd_lstm", target, tmp_path / "target", checkpoint_every=None)
    second["model"] = {"family": "awd_lstm", "checkpoint": str(tmp_path / "general" / "checkpoint")}
    second["tokenizer"] = {"new_vocabulary": True, "vocab_size": 300, "min_frequency": 1}
    run_pretrain(load_recipe(write_yaml(tmp_path / "target.yaml", second)))
    general = AutoTokenizer.from_pretrained(tmp_path / "general" / "checkpoint")
    continued = AutoTokenizer.from_pretrained(tmp_path / "target" / "checkpoint")
    assert len(continued) > 258 and "Ġsoundtrack" in continued.get_vocab()  # merges learnt from the new text
    assert "Ġsoundtrack" not in general.get_vocab()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "target" / "checkpoint")
    assert model.config.vocab_size == len(continued)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize(
    "path", sorted((REPO_ROOT / "recipes" / "pretrain").glob("*.yaml")), ids=lambda path: path.stem
)
def test_shipped_pretrain_recipe_runs_on_the_projects_own_data(path, tmp_path, monkeypatch):
    """Each shipped family recipe, unchanged but for its data and length, trains on data/quickstart."""
    monkeypatch.chdir(REPO_ROOT)
    recipe = load_recipe(
        path,
        [
            f"run_dir={tmp_path / 'run'}",
            "corpus.train_files=[data/quickstart/corpus/train.txt]",
            "corpus.validation_files=[data/quickstart/corpus/valid.txt]",
            "corpus.cache_dir=null",
            "tokenizer.vocab_size=1000",
            "training.max_steps=2",
            "training.batch_size=4",  # two small steps: that the recipe runs, not what it learns
            "eval_every=null",
            "checkpoint_every=2",
        ],
    )
    checkpoint = run_pretrain(recipe)
    family = recipe.model.family
    model = AUTO_CLASS[family].from_pretrained(checkpoint)
    # gpt2 recipes with Transformer-XL memory or sparse attention build our own model (models/causal_transformer.py).
    assert model.config.model_type == (
        "finetune_causal_transformer" if uses_causal_transformer(recipe.model) else family
    )
    final = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "eval"][-1]
    if family == "ngram":  # counted in one pass: no steps, no periodic checkpoints, one validation
        assert final["step"] == 0 and math.isfinite(final["validation_loss"])
        return
    assert [path.name for path in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-00000002"]
    assert final["step"] == 2 and math.isfinite(final["validation_loss"])


def test_ulmfit_flow_awd_lstm_language_model_then_classifier_then_eval(tmp_path, corpus_file, task_dir):
    """An AWD-LSTM pretrained here fine-tunes into ULMFiT's classifier, which `finetune eval` scores."""
    from tests.conftest import eval_recipe, finetune_recipe

    lm = family_recipe("awd_lstm", corpus_file, tmp_path / "lm", checkpoint_every=None)
    assert runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "lm.yaml", lm))]).exit_code == 0
    classifier = finetune_recipe(tmp_path / "lm" / "checkpoint", task_dir, tmp_path / "classifier")
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "classifier.yaml", classifier))])
    assert result.exit_code == 0, result.output
    records = read_metrics(tmp_path / "classifier" / "metrics.jsonl")
    # embedding, 2 LSTM layers, head: one more group trainable each epoch
    assert [r["trainable_groups"] for r in records if r["phase"] == "unfreeze"] == [1, 2]
    assert {r["total_groups"] for r in records if r["phase"] == "unfreeze"} == {4}
    evaluation = eval_recipe(task_dir, tmp_path / "eval", {"ulmfit": str(tmp_path / "classifier" / "checkpoint")})
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", evaluation))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert 0 <= report["results"]["ulmfit"]["accuracy"] <= 1


def test_language_model_fine_tuning_on_a_tasks_own_text(tmp_path, corpus_file, task_dir):
    """ULMFiT's stage 2 reads the task's text columns (train and the unlabeled test split) as its corpus."""
    from finetune.stages.pretrain_data import read_corpus
    from tests.conftest import custom_task_section

    data = family_recipe("gpt2", corpus_file, tmp_path / "run", checkpoint_every=None)
    data["corpus"] = {
        "task": custom_task_section(task_dir),
        "task_splits": ["train", "test"],
        "block_size": 8,
        "validation_fraction": 0.2,
        "cache_dir": None,
    }
    recipe = load_recipe(write_yaml(tmp_path / "recipe.yaml", data))
    text = read_corpus(recipe)
    train, validation = ([text.documents[index] for index in part] for part in text.split())
    expected = [line.split("\t")[0] for line in (task_dir / "train.tsv").read_text().splitlines()[1:]]
    expected += [line.split("\t")[1] for line in (task_dir / "test.tsv").read_text().splitlines()[1:]]
    assert sorted(train + validation) == sorted(expected) and len(validation) == 10  # 20% of 50
    run_pretrain(recipe)
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()


def write_play(path: Path) -> Path:
    """A play: a speaker line, indented verse, a blank line between speeches."""
    speeches = [
        f"{speaker}.\n  {line} the film was great,\n  and {line} the plot was dull.\n"
        for speaker, line in zip(["KING", "HAMLET", "GHOST"] * 8, ["so", "very", "truly", "quite"] * 6)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(speeches), encoding="utf-8")
    return path


@pytest.mark.parametrize("family, document", [("gpt2", "line"), ("gpt2", "paragraph"), ("awd_lstm", "file")])
def test_running_text_reaches_the_model_with_its_line_breaks(family, document, tmp_path):
    """corpus.document: a causal LM trained on a play's paragraphs or whole file reads its line breaks as tokens
    (its training ids decode to the text: paragraphs of stripped lines, the file as written); on lines, none."""
    play, other = write_play(tmp_path / "play.txt"), write_play(tmp_path / "valid" / "play.txt")
    data = pretrain_recipe(play, tmp_path / "run")
    data["model"] = dict(MODELS[family])
    data["tokenizer"] = {"vocab_size": 300, "min_frequency": 1}
    data["corpus"].update(
        document=document, validation_files=[str(other)], block_size=8, cache_dir=str(tmp_path / "cache")
    )
    data["training"].update(max_steps=2, batch_size=4)
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "checkpoint")
    entry = next(
        entry
        for entry in (tmp_path / "cache").iterdir()
        if json.loads((entry / "meta.json").read_text())["files"][0]["path"] == str(play.resolve())
    )
    tokens = TokenizedDocuments.load(entry)
    texts = [tokenizer.decode(tokens.document(index)) for index in range(len(tokens))]
    assert texts == read_documents([play], document)
    assert len(texts) == {"line": 72, "paragraph": 24, "file": 1}[document]
    first = {
        "line": "KING.",
        "paragraph": "KING.\nso the film was great,\nand so the plot was dull.",
        "file": "KING.\n  so the film was great,\n  and so the plot was dull.\n\nHAMLET.\n  very the film",
    }
    assert texts[0].startswith(first[document]) and ("\n" in "".join(texts)) == (document != "line")
    # An LSTM has no position table: its tokenizer claims no maximum length (transformers warns past one).
    assert tokenizer.model_max_length == (VERY_LARGE_INTEGER if family == "awd_lstm" else 8)


def test_text_too_short_once_tokenised_is_refused_with_its_files_and_numbers(tmp_path, corpus_file):
    """Its 6 KB could hold 300 blocks (a token per byte at most); its tokens cannot: refused before training."""
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    data["training"]["batch_size"] = 300
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2, result.output
    error = result.output.strip().splitlines()[-1]
    given = re.fullmatch(
        r"error: the training text \((.*) without the held-out documents\) gives ([\d,]+) tokens, a "
        r"separator after each document included, fewer than the 4,500 needed for 300 blocks of 15 "
        r"tokens of text \(training.batch_size 300, corpus.block_size 16\)",
        error,
    )
    assert given and given[1] == str(corpus_file) and int(given[2].replace(",", "")) < 4500, error
    assert not (tmp_path / "run").exists()
