"""A `datasets` corpus read as a stream (corpus.streaming): batches packed on the fly, passes, resume, workers,
a tiny model trained from local JSON Lines and text files, and one-line errors for what does not go together."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.streaming import StreamedBatches, StreamedDocuments
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.data.token_cache import tokenize_documents
from finetune.data.tokenizers import train_byte_level_bpe, train_wordpiece
from finetune.errors import UserError
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.pretrain import run_pretrain
from tests.conftest import interrupted_at_step, make_sentence, write_yaml

runner = CliRunner()
TEXTS = [
    " ".join(make_sentence(random.Random(index), index % 3 == 0) for _ in range(1 + index % 4)) for index in range(120)
]


@pytest.fixture(autouse=True)
def local_datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")  # leave ~/.cache alone


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tokenizers")
    train_wordpiece(TEXTS, vocab_size=200, min_frequency=1).save_pretrained(folder / "bert")
    train_byte_level_bpe(TEXTS, vocab_size=300, min_frequency=1).save_pretrained(folder / "gpt2")
    return {family: folder / family for family in ("bert", "gpt2")}


@pytest.fixture
def rows(tmp_path) -> Path:
    """The texts as JSON Lines, with an empty row and one of only spaces between them (no documents)."""
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps({"text": text, "id": index}) for index, text in enumerate(TEXTS)]
    lines[5:5] = [json.dumps({"text": "", "id": -1}), json.dumps({"text": "   ", "id": -2})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def gpt2_batches(tokenizer, documents, batches: int, **options) -> StreamedBatches:
    return StreamedBatches(
        documents, tokenizer, tokenizer.eos_token_id, block_size=8, batch_size=4, batches=batches, seed=0, **options
    )


def test_the_first_pass_packs_what_the_cached_path_packs_and_the_stream_starts_again(tokenizers, rows):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizers["gpt2"])
    documents = StreamedDocuments.open("json", None, "train", "text", [str(rows)])
    assert list(documents()) == TEXTS  # empty rows are no documents
    packed = PackedBlocks(
        DocumentStream(
            TokenizedDocuments.from_lists(tokenize_documents(tokenizer, TEXTS[10:])), tokenizer.eos_token_id
        ),
        9,
    ).array()
    data = gpt2_batches(tokenizer, documents, batches=3 * len(packed) // 4, held_out=10)
    batches = list(data)
    assert len(batches) == len(data) == 3 * len(packed) // 4
    assert all(torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:]) for batch in batches)
    blocks = np.concatenate(
        [np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1) for batch in batches]
    )
    # Pass after pass, the held-out documents left out: what packing the rest gives, again and again (gpt2 has no
    # masks, so the passes are the same blocks; batches run on across the end of a pass).
    assert np.array_equal(blocks, np.concatenate([packed] * 3)[: len(blocks)])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_stream_continues_with_the_batches_the_run_would_have_read(tokenizers, rows, workers):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizers["gpt2"])
    documents = StreamedDocuments.open("json", None, "train", "text", [str(rows)])

    def read(skip: int) -> list[torch.Tensor]:
        data = gpt2_batches(tokenizer, documents, batches=11)
        data.skip(skip)
        loader = DataLoader(data, batch_size=None, num_workers=workers)
        assert len(loader) == 11 - skip
        return [batch["input_ids"] for batch in loader]

    whole = read(0)
    assert len(whole) == 11 and len({batch.numpy().tobytes() for batch in whole}) == 11
    for skip in (1, 4, 5):
        assert all(torch.equal(a, b) for a, b in zip(read(skip), whole[skip:], strict=True))


def streaming_recipe(tmp_path: Path, family: str, tokenizer: Path, corpus: dict, **training) -> dict:
    model = {"family": family, "layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "dropout": 0.0}
    return {
        "stage": "pretrain",
        "run_dir": str(tmp_path / "run"),
        "seed": 0,
        "model": model,
        "tokenizer": {"path": str(tokenizer)},
        "corpus": {"streaming": True, "block_size": 8, "cache_dir": None, **corpus},
        "training": {"max_steps": 12, "batch_size": 4, "log_every": 2, "device": "cpu", **training},
        "eval_every": 6,
    }


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_tiny_model_trains_on_a_streamed_json_lines_dataset(family, tokenizers, rows, tmp_path):
    data = streaming_recipe(
        tmp_path,
        family,
        tokenizers[family],
        {"dataset": "json", "dataset_files": [str(rows)], "validation_documents": 20},
    )
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [record["step"] for record in records if record["phase"] == "train"] == [2, 4, 6, 8, 10, 12]
    assert [record["step"] for record in records if record["phase"] == "eval"] == [6, 12]
    assert all(np.isfinite(record["loss"]) for record in records if record["phase"] == "train")
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()


def test_a_streamed_text_dataset_validates_on_its_own_split_and_resumes_exactly(tokenizers, tmp_path, monkeypatch):
    (tmp_path / "train.txt").write_text("\n".join(TEXTS[:100]) + "\n", encoding="utf-8")
    (tmp_path / "valid.txt").write_text("\n".join(TEXTS[100:]) + "\n", encoding="utf-8")
    corpus = {
        "dataset": "text",
        "validation_split": "validation",
        "dataset_files": {"train": [str(tmp_path / "train.txt")], "validation": [str(tmp_path / "valid.txt")]},
    }
    full = streaming_recipe(tmp_path / "full", "bert", tokenizers["bert"], corpus, max_steps=40)
    run_pretrain(load_recipe(write_yaml(tmp_path / "full.yaml", full)))  # several passes over 100 documents

    resumed_data = streaming_recipe(tmp_path / "resumed", "bert", tokenizers["bert"], corpus, max_steps=40)
    resumed_data["checkpoint_every"] = 10
    resumed = load_recipe(write_yaml(tmp_path / "resumed.yaml", resumed_data))
    with interrupted_at_step(30, KeyboardInterrupt):
        run_pretrain(resumed)
    run_pretrain(resumed, resume=True)
    full_weights = load_file(tmp_path / "full" / "run" / "checkpoint" / "model.safetensors")
    resumed_weights = load_file(tmp_path / "resumed" / "run" / "checkpoint" / "model.safetensors")
    assert all(torch.equal(full_weights[name], resumed_weights[name]) for name in full_weights)


BAD = {
    "streaming without a dataset": (
        {"train_files": ["CORPUS"], "validation_documents": 5},
        {},
        "corpus: streaming applies to a `datasets` corpus",
    ),
    "no validation text": ({}, {}, "a streamed dataset needs its validation text"),
    "a fraction of a stream": (
        {"validation_fraction": 0.1, "validation_documents": 5},
        {},
        "a stream has no length to take a fraction of",
    ),
    "two validation texts": (
        {"validation_documents": 5, "validation_split": "validation"},
        {},
        "give one validation text, not validation_split and validation_documents",
    ),
    "no max_steps": ({"validation_documents": 5}, {"max_steps": None}, "training.max_steps; give it"),
    "epochs": ({"validation_documents": 5}, {"epochs": 2}, "remove training.epochs"),
    "a wrong text column": (
        {"validation_documents": 5, "text_column": "body"},
        {},
        "no column 'body' (columns: text, id",
    ),
    "a missing file": ({"validation_documents": 5, "dataset_files": ["MISSING"]}, {}, "cannot stream split 'train'"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_what_does_not_go_together_is_one_line(case, tokenizers, rows, tmp_path):
    corpus, training, message = case
    data = streaming_recipe(
        tmp_path, "gpt2", tokenizers["gpt2"], {"dataset": "json", "dataset_files": [str(rows)], **corpus}, **training
    )
    if "train_files" in corpus:
        data["corpus"].pop("dataset"), data["corpus"].pop("dataset_files")
        data["corpus"]["train_files"] = [str(rows)]
    if data["corpus"].get("dataset_files") == ["MISSING"]:
        data["corpus"]["dataset_files"] = [str(tmp_path / "missing.jsonl")]
    data["training"] = {key: value for key, value in data["training"].items() if value is not None}
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    output = result.output.strip()
    assert result.exit_code == 2 and output.startswith("error: ") and "\n" not in output, output
    assert message in output, output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": {"family": "awd_lstm", "embedding_size": 8, "hidden": 12, "layers": 1}}, "awd_lstm reads BPTT rows"),
        ({"tokenizer": {"vocab_size": 200}}, "a tokenizer is not trained on a stream"),
    ],
)
def test_streaming_refuses_what_it_cannot_do(change, message, tokenizers, rows, tmp_path):
    data = streaming_recipe(
        tmp_path,
        "gpt2",
        tokenizers["gpt2"],
        {"dataset": "json", "dataset_files": [str(rows)], "validation_documents": 5},
    )
    data.update(change)
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output


def test_validation_documents_need_a_stream(tmp_path, rows):
    data = {
        "stage": "pretrain",
        "run_dir": str(tmp_path / "run"),
        "corpus": {"dataset": "json", "dataset_files": [str(rows)], "validation_documents": 5},
    }
    with pytest.raises(UserError, match="validation_documents applies to a streamed dataset"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))


def test_a_dataset_read_whole_takes_its_files_and_a_validation_split(tokenizers, tmp_path):
    """Without streaming, dataset_files and validation_split work too (the text is read whole and cached)."""
    (tmp_path / "train.txt").write_text("\n".join(TEXTS[:100]) + "\n", encoding="utf-8")
    (tmp_path / "valid.txt").write_text("\n".join(TEXTS[100:]) + "\n", encoding="utf-8")
    data = streaming_recipe(
        tmp_path,
        "gpt2",
        tokenizers["gpt2"],
        {
            "dataset": "text",
            "validation_split": "validation",
            "streaming": False,
            "cache_dir": str(tmp_path / "cache"),
            "dataset_files": {"train": [str(tmp_path / "train.txt")], "validation": [str(tmp_path / "valid.txt")]},
        },
    )
    from finetune.stages.pretrain_data import read_corpus

    text = read_corpus(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    assert text.documents == TEXTS[:100] and text.validation_documents == TEXTS[100:] and not text.held_out
    result = runner.invoke(app, ["pretrain", str(tmp_path / "recipe.yaml")])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "cache").iterdir())) == 2  # the training and the validation text
