"""The token cache of text files: memory-mapped on a restart, the same blocks and streams as before the cache was
mapped (against the former in-memory pipeline), reused without reading the text, invalidated when a file changes."""

from __future__ import annotations

import os
import pickle
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from finetune import console as console_module
from finetune.console import parallel_tokenizing
from finetune.data import corpus, token_cache
from finetune.data.causal import BPTTBatches
from finetune.data.corpus import read_documents, split_documents
from finetune.data.pretraining_text import PretrainingText
from finetune.data.token_arrays import DocumentStream, PackedBlocks, TokenizedDocuments
from finetune.data.token_cache import SAMPLE_SIZE, tokenize_files
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.errors import UserError
from tests.conftest import FILLERS, NEGATIVE, POSITIVE, SUBJECTS

SEPARATOR, START = 0, 1
WORDS = " ".join(SUBJECTS + POSITIVE + NEGATIVE + FILLERS).split()


def write_text(path: Path, lines: int = 300, seed: int = 0) -> Path:
    """Lines of 1-40 words, with empty and invisible lines between them (which are no documents)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(lines):
        rows.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))))
        if rng.random() < 0.1:
            rows.append(rng.choice(["", "   ", "\u200b"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return train_byte_level_bpe([" ".join(WORDS)] * 20, vocab_size=300, min_frequency=1)


@pytest.fixture
def text_file(tmp_path) -> Path:
    return write_text(tmp_path / "corpus" / "train.txt")


# The pipeline before the cache was mapped, as it was: documents as strings, split, each part tokenised into
# lists, the stream built with np.insert, blocks reshaped from it, BPTT rows from a gathered permutation.


def former_stream(id_lists: list[list[int]]) -> np.ndarray:
    documents = TokenizedDocuments.from_lists(id_lists)
    return np.insert(documents.ids, documents.offsets[1:], SEPARATOR).astype(np.int64)


def former_blocks(id_lists: list[list[int]], block_size: int, start_id: int | None) -> np.ndarray:
    stream = former_stream(id_lists)
    body = block_size if start_id is None else block_size - 1
    count = len(stream) // body
    blocks = np.empty((count, block_size), dtype=np.int64)
    blocks[:, block_size - body :] = stream[: count * body].reshape(count, body)
    if start_id is not None:
        blocks[:, 0] = start_id
    return blocks


def former_bptt_rows(id_lists: list[list[int]], batch_size: int, seed: int, epoch: int) -> np.ndarray:
    order = np.random.default_rng((seed, epoch)).permutation(len(id_lists))
    stream = former_stream([id_lists[index] for index in order])
    row_length = len(stream) // batch_size
    return stream[: batch_size * row_length].reshape(batch_size, row_length)


def former_parts(path: Path, tokenizer, fraction: float, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    train, validation = split_documents(read_documents([path]), fraction, seed)
    return ([tokenizer(text, add_special_tokens=False)["input_ids"] for text in part] for part in (train, validation))


def test_a_restart_maps_the_cache_and_reads_what_the_former_pipeline_read(tokenizer, text_file, tmp_path):
    text = PretrainingText(train_files=[text_file], validation_fraction=0.1, seed=3)
    fresh = text.tokenize(tokenizer, tmp_path / "cache", show_progress=False)
    restarted = PretrainingText(train_files=[text_file], validation_fraction=0.1, seed=3).tokenize(
        tokenizer, tmp_path / "cache", show_progress=False
    )
    uncached = text.tokenize(tokenizer, None, show_progress=False)
    for part in restarted:
        assert isinstance(part.ids, np.memmap) and isinstance(part.offsets, np.memmap)
    expected_train, expected_validation = former_parts(text_file, tokenizer, 0.1, 3)
    for train, validation in (fresh, restarted, uncached):
        assert [train.document(index).tolist() for index in range(len(train))] == expected_train
        assert [validation.document(index).tolist() for index in range(len(validation))] == expected_validation
        for block_size, start_id in ((16, START), (17, None), (5, None)):  # bert, gpt2 (block + 1), a short block
            blocks = PackedBlocks(DocumentStream(train, SEPARATOR), block_size, start_id)
            expected = former_blocks(expected_train, block_size, start_id)
            assert np.array_equal(blocks.array(), expected)
            assert all(np.array_equal(blocks[index], expected[index]) for index in (0, 7, len(blocks) - 1, -1))
        for epoch in (0, 1, 2):
            batches = BPTTBatches(train, SEPARATOR, batch_size=4, bptt=6, seed=5)
            batches.set_epoch(epoch)
            rows = former_bptt_rows(expected_train, 4, seed=5, epoch=epoch)
            assert np.array_equal(batches.rows(), rows)
            for index in (0, 3, len(batches) - 1):
                assert np.array_equal(batches[index]["input_ids"].numpy(), rows[:, index * 6 : index * 6 + 6])
                assert np.array_equal(batches[index]["labels"].numpy(), rows[:, index * 6 + 1 : index * 6 + 7])


def count_encoded(monkeypatch) -> list[int]:
    """The number of texts of every batch encoding from now on."""
    encoded = []
    encode = token_cache.encode
    monkeypatch.setattr(
        token_cache, "encode", lambda tokenizer, texts: encoded.append(len(texts)) or encode(tokenizer, texts)
    )
    return encoded


def test_a_cache_hit_reads_no_text_and_tokenises_only_the_check_sample(tokenizer, text_file, tmp_path, monkeypatch):
    first = tokenize_files(tokenizer, [text_file], tmp_path, show_progress=False)
    assert len(first) > SAMPLE_SIZE

    def streamed(paths, *arguments):
        raise AssertionError("the text was read again")

    monkeypatch.setattr(token_cache, "file_pieces", streamed)
    encoded = count_encoded(monkeypatch)
    again = tokenize_files(tokenizer, [text_file], tmp_path, show_progress=False)
    assert sum(encoded) <= SAMPLE_SIZE  # the documents read back by their byte positions
    assert np.array_equal(again.ids, first.ids) and np.array_equal(again.offsets, first.offsets)
    assert (tmp_path / f"tokens-{token_cache.files_cache_key(tokenizer, [text_file])}" / "meta.json").is_file()


def test_a_changed_file_is_tokenised_again(tokenizer, text_file, tmp_path, monkeypatch):
    tokenize_files(tokenizer, [text_file], tmp_path, show_progress=False)
    documents = len(read_documents([text_file]))
    encoded = count_encoded(monkeypatch)
    with text_file.open("a", encoding="utf-8") as handle:
        handle.write("the film was dull .\n")  # size and time change
    changed = tokenize_files(tokenizer, [text_file], tmp_path, show_progress=False)
    assert sum(encoded) == documents + 1 and len(changed) == documents + 1
    assert (
        changed.document(len(changed) - 1).tolist()
        == tokenizer("the film was dull .", add_special_tokens=False)["input_ids"]
    )
    encoded.clear()
    os.utime(text_file, ns=(text_file.stat().st_atime_ns, text_file.stat().st_mtime_ns + 10**9))  # `touch`
    tokenize_files(tokenizer, [text_file], tmp_path, show_progress=False)
    assert sum(encoded) == documents + 1
    encoded.clear()
    renamed = text_file.rename(text_file.with_name("moved.txt"))
    tokenize_files(tokenizer, [renamed], tmp_path, show_progress=False)
    assert sum(encoded) == documents + 1
    encoded.clear()
    other = train_byte_level_bpe([" ".join(WORDS)] * 20, vocab_size=280, min_frequency=1)
    tokenize_files(other, [renamed], tmp_path, show_progress=False)
    assert sum(encoded) == documents + 1
    assert len([entry for entry in tmp_path.iterdir() if entry.name.startswith("tokens-")]) == 5
    assert not [entry for entry in tmp_path.iterdir() if entry.name.startswith(".")]  # no temporary left


def test_a_change_that_keeps_size_and_time_is_caught_by_the_sample(tokenizer, tmp_path, monkeypatch):
    path = tmp_path / "small.txt"
    path.write_text("the film was dull .\nthe plot was great .\n", encoding="utf-8")
    tokenize_files(tokenizer, [path], tmp_path / "cache", show_progress=False)
    stat = path.stat()
    path.write_text("the film was dull .\nthe cast was great .\n", encoding="utf-8")  # same length
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    encoded = count_encoded(monkeypatch)
    with pytest.warns(UserWarning, match="does not match the text: document 1 tokenizes differently"):
        tokenized = tokenize_files(tokenizer, [path], tmp_path / "cache", show_progress=False)
    assert tokenized.document(1).tolist() == tokenizer("the cast was great .", add_special_tokens=False)["input_ids"]
    assert sum(encoded) == 2 + 2  # the sample, then the text again
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the entry was replaced: the next run maps it without a warning
        tokenize_files(tokenizer, [path], tmp_path / "cache", show_progress=False)


def test_files_are_streamed_and_bad_ones_named_in_one_line(tokenizer, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\u200b\n", encoding="utf-8")
    with pytest.raises(UserError, match=f"{empty}: no text"):
        tokenize_files(tokenizer, [empty], tmp_path / "cache", show_progress=False)
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"fine\nbroken \xff\n")
    with pytest.raises(UserError, match=f"{broken} line 2: not valid UTF-8"):
        tokenize_files(tokenizer, [broken], tmp_path / "cache", show_progress=False)
    assert not list((tmp_path / "cache").iterdir())  # nothing cached, no temporary left


def test_two_files_keep_their_documents_positions_and_order(tokenizer, tmp_path):
    first, second = write_text(tmp_path / "a.txt", 40, seed=1), write_text(tmp_path / "b.txt", 30, seed=2)
    tokenized = tokenize_files(tokenizer, [first, second], tmp_path / "cache", show_progress=False)
    documents = read_documents([first, second])
    assert [tokenized.document(index).tolist() for index in range(len(tokenized))] == [
        tokenizer(text, add_special_tokens=False)["input_ids"] for text in documents
    ]
    entry = next((tmp_path / "cache").iterdir())
    positions = np.load(entry / "positions.npy")
    joined = first.read_bytes() + second.read_bytes()
    assert [corpus.document_text(joined[position:].split(b"\n", 1)[0].decode()) for position in positions] == documents


def test_mapped_documents_pickle_as_their_folder(tokenizer, text_file, tmp_path):
    tokenized = tokenize_files(tokenizer, [text_file], tmp_path, show_progress=False).select(np.array([3, 1]))
    payload = pickle.dumps(tokenized)
    assert len(payload) < 2000  # the folder's name and the selection, not the ids
    restored = pickle.loads(payload)
    assert isinstance(restored.ids, np.memmap) and restored.order.tolist() == [3, 1]
    assert [restored.document(index).tolist() for index in range(2)] == [
        tokenized.document(index).tolist() for index in range(2)
    ]


def test_the_ids_file_is_a_plain_npy_file(tokenizer, text_file, tmp_path):
    tokenized = tokenize_files(tokenizer, [text_file], tmp_path / "cache", show_progress=False)
    entry = next((tmp_path / "cache").iterdir())
    ids = np.load(entry / "ids.npy")  # read whole, without a map: the rewritten header is a valid one
    assert ids.dtype == np.int32 and np.array_equal(ids, tokenized.ids)


def test_tokenising_uses_the_libraries_threads_only_while_it_runs(monkeypatch):
    monkeypatch.setattr(console_module, "_parallelism_turned_off", True)  # as quiet_library_chatter leaves it
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    with parallel_tokenizing():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"  # forked DataLoader workers see it off
    monkeypatch.setattr(console_module, "_parallelism_turned_off", False)  # the user's own choice
    with parallel_tokenizing():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


@pytest.mark.parametrize("family", ["bert", "awd_lstm"])
def test_a_restarted_run_trains_on_the_same_batches_without_reading_the_text(
    family, tokenizer, text_file, tmp_path, monkeypatch
):
    from finetune.data.tokenizers import train_wordpiece
    from finetune.recipes import PretrainRecipe
    from finetune.stages import pretrain

    folder = tmp_path / "tokenizer"
    if family == "bert":
        train_wordpiece([" ".join(WORDS)] * 20, vocab_size=200, min_frequency=1).save_pretrained(folder)
    else:
        tokenizer.save_pretrained(folder)
    model = (
        {"family": "bert", "layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "dropout": 0.0}
        if family == "bert"
        else {"family": "awd_lstm", "embedding_size": 8, "hidden": 12, "layers": 1}
    )
    recipe = PretrainRecipe.model_validate(
        {
            "stage": "pretrain",
            "run_dir": str(tmp_path / "run"),
            "overwrite": True,
            "seed": 1,
            "model": model,
            "tokenizer": {"path": str(folder)},
            "corpus": {
                "train_files": [str(text_file)],
                "validation_fraction": 0.1,
                "block_size": 8,
                "cache_dir": str(tmp_path / "cache"),
            },
            "training": {"epochs": 2, "max_steps": 30, "batch_size": 4, "log_every": 10, "device": "cpu"},
        }
    )
    batches: list[tuple[bool, bytes]] = []
    loss_module = pretrain.loss_module

    def record(module, arguments):  # (input ids, labels) of every training and validation batch
        batches.append((module.training, arguments[0].numpy().tobytes() + arguments[1].numpy().tobytes()))

    def recording(config, language_model):
        module = loss_module(config, language_model)
        module.register_forward_pre_hook(record)
        return module

    monkeypatch.setattr(pretrain, "loss_module", recording)
    pretrain.run_pretrain(recipe)
    first, batches[:] = list(batches), []
    monkeypatch.setattr(token_cache, "file_pieces", lambda *arguments: pytest.fail("the text was read again"))
    pretrain.run_pretrain(recipe)
    assert batches == first and sum(training for training, _ in first) == 30


# Paragraphs and whole files (corpus.document): cached in pieces, read back and checked piece by piece


def write_play(path: Path, speeches: int = 30, seed: int = 0) -> Path:
    """Speeches of a speaker line and 1-6 indented or plain lines, blank lines between them."""
    rng = random.Random(seed)
    rows = []
    for _ in range(speeches):
        rows.append(rng.choice(["KING.", "HAMLET.", "GHOST."]))
        rows += [
            ("  " if rng.random() < 0.3 else "") + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
            for _ in range(rng.randint(1, 6))
        ]
        rows.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("document", ["paragraph", "file"])
def test_paragraph_and_file_entries_are_mapped_read_back_and_checked(document, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(token_cache, "PIECE_BYTES", 60)  # pieces of a line or two
    paths = [write_play(tmp_path / "a.txt", seed=1), write_play(tmp_path / "b.txt", 8, seed=2)]
    whole = read_documents(paths, document)
    expected = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in whole]
    fresh = tokenize_files(tokenizer, paths, tmp_path / "cache", show_progress=False, document=document)
    uncached = tokenize_files(tokenizer, paths, None, show_progress=False, document=document)
    lines = tokenize_files(tokenizer, paths, tmp_path / "cache", show_progress=False)
    assert len(lines) > len(fresh) == len(whole)
    entries = sorted((tmp_path / "cache").iterdir())
    assert len(entries) == 2  # lines and paragraphs (or files) of the same files are cached apart
    assert (tmp_path / "cache" / f"tokens-{token_cache.files_cache_key(tokenizer, paths)}").is_dir()  # lines as before
    entry = next(entry for entry in entries if (entry / "pieces.npy").exists())
    pieces = np.load(entry / "pieces.npy")
    assert len(pieces) - 1 > len(whole) + 10

    encoded = count_encoded(monkeypatch)
    monkeypatch.setattr(token_cache, "file_pieces", lambda *arguments: pytest.fail("the text was read again"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = tokenize_files(tokenizer, paths, tmp_path / "cache", show_progress=False, document=document)
    assert isinstance(mapped.ids, np.memmap)
    assert encoded[0] == 4 and sum(encoded[1:]) <= SAMPLE_SIZE  # the line-break probe, the pieces read back
    for tokenized in (fresh, uncached, mapped):
        assert [tokenized.document(index).tolist() for index in range(len(tokenized))] == expected
    restored = pickle.loads(pickle.dumps(mapped.select(np.array([1, 0]))))  # a worker maps whole documents
    assert restored.document(0).tolist() == expected[1]

    # The last line written backwards, size and time kept: the last piece is always in the sample.
    second = paths[1]
    stat, rows = second.stat(), second.read_text(encoding="utf-8").split("\n")  # [..., last line, "", ""]
    rows[-3] = rows[-3][::-1]
    second.write_text("\n".join(rows), encoding="utf-8")
    os.utime(second, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.undo()
    monkeypatch.setattr(token_cache, "PIECE_BYTES", 60)
    with pytest.warns(UserWarning, match="does not match the text: piece .* tokenizes differently"):
        again = tokenize_files(tokenizer, paths, tmp_path / "cache", show_progress=False, document=document)
    assert again.document(len(again) - 1).tolist() != expected[-1]


def test_a_tokenizer_that_does_not_split_at_line_breaks_gets_whole_documents(tmp_path):
    from tokenizers import pre_tokenizers

    prefixed = train_byte_level_bpe([" ".join(WORDS)] * 20, vocab_size=300, min_frequency=1)
    prefixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # a space before all
    assert token_cache.cuts_cleanly(train_byte_level_bpe([" ".join(WORDS)] * 20, vocab_size=300, min_frequency=1))
    assert not token_cache.cuts_cleanly(prefixed)
    paths = [write_play(tmp_path / "play.txt")]
    tokenized = tokenize_files(prefixed, paths, tmp_path / "cache", show_progress=False, document="file")
    assert (
        tokenized.document(0).tolist()
        == prefixed(read_documents(paths, "file")[0], add_special_tokens=False)["input_ids"]
    )
    assert len(np.load(next((tmp_path / "cache").iterdir()) / "pieces.npy")) == 2  # one piece: the whole file
