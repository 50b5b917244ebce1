"""Corpus: documents from text files, train/validation split, packing into [CLS]-led blocks."""

from __future__ import annotations

import numpy as np
import pytest

from finetune.data.corpus import pack_blocks, read_documents, split_documents, tokenize_documents
from finetune.errors import UserError

CLS, SEP = 2, 3


def _documents():
    rng = np.random.default_rng(0)
    return [list(rng.integers(10, 100, size=int(rng.integers(1, 12)))) for _ in range(30)]


def _stream(documents):
    stream = []
    for ids in documents:
        stream += list(ids) + [SEP]
    return stream


@pytest.mark.parametrize("block_size", [8, 9, 16, 33])
def test_pack_blocks(block_size):
    documents = _documents()
    stream = _stream(documents)
    blocks = pack_blocks(documents, block_size, CLS, SEP)
    body = block_size - 1
    assert blocks.shape == (len(stream) // body, block_size)
    assert blocks.dtype == np.int64
    assert (blocks[:, 0] == CLS).all()
    # The bodies, concatenated, are the document stream (with [SEP] after every document) minus the tail.
    assert blocks[:, 1:].reshape(-1).tolist() == stream[: len(blocks) * body]
    assert len(stream) - len(blocks) * body < body  # only an incomplete tail is dropped
    assert CLS not in blocks[:, 1:]


def test_pack_blocks_sep_after_every_document():
    documents = [[11, 12], [13], [14, 15, 16]]
    blocks = pack_blocks(documents, 4, CLS, SEP)  # stream: 11 12 S 13 S 14 15 16 S  -> 3 bodies of 3
    assert blocks.tolist() == [[CLS, 11, 12, SEP], [CLS, 13, SEP, 14], [CLS, 15, 16, SEP]]


def test_pack_blocks_drops_the_tail():
    documents = [[11, 12], [13], [14, 15, 16, 17]]  # 10 stream tokens -> 3 bodies of 3, 1 token dropped
    blocks = pack_blocks(documents, 4, CLS, SEP)
    assert blocks.tolist() == [[CLS, 11, 12, SEP], [CLS, 13, SEP, 14], [CLS, 15, 16, 17]]


def test_pack_blocks_too_little_text():
    with pytest.raises(UserError, match="fewer than one block"):
        pack_blocks([[11, 12]], 8, CLS, SEP)


def test_read_documents_skips_empty_lines(tmp_path):
    first = tmp_path / "a.txt"
    first.write_text("one two\n\n   \nthree\r\n", encoding="utf-8")
    second = tmp_path / "b.txt"
    second.write_text("  four  \nfive", encoding="utf-8")
    assert read_documents([first, second]) == ["one two", "three", "four", "five"]


def test_read_documents_keeps_unicode(tmp_path):
    path = tmp_path / "u.txt"
    path.write_text("café naïve\n日本語\n", encoding="utf-8")
    assert read_documents([path]) == ["café naïve", "日本語"]


def test_read_documents_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nalso fine\nbroken \xff\xfe here\n")
    with pytest.raises(UserError) as info:
        read_documents([path])
    message = str(info.value)
    assert str(path) in message and "line 3" in message and "UTF-8" in message


def test_read_documents_all_empty(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="no text"):
        read_documents([path])


def test_split_documents_deterministic_and_disjoint():
    documents = [f"document {index}" for index in range(100)]
    train, validation = split_documents(documents, 0.1, seed=0)
    assert (train, validation) == split_documents(documents, 0.1, seed=0)
    assert len(validation) == 10 and len(train) == 90
    assert not set(train) & set(validation)
    assert set(train) | set(validation) == set(documents)
    # Order within each part follows the corpus.
    assert train == sorted(train, key=documents.index) and validation == sorted(validation, key=documents.index)
    other_train, other_validation = split_documents(documents, 0.1, seed=1)
    assert other_validation != validation


def test_split_documents_holds_out_at_least_one():
    train, validation = split_documents(["a", "b", "c"], 0.01, seed=0)
    assert len(validation) == 1 and len(train) == 2


def test_split_documents_single_document():
    with pytest.raises(UserError, match="validation_files"):
        split_documents(["only one"], 0.1, seed=0)


def test_tokenize_documents_batches(corpus_file):
    from finetune.data.tokenizers import train_wordpiece

    documents = read_documents([corpus_file])
    tokenizer = train_wordpiece(documents, vocab_size=200, min_frequency=1)
    ids = tokenize_documents(tokenizer, documents, batch_size=7)
    assert len(ids) == len(documents)
    assert ids == [tokenizer(document, add_special_tokens=False)["input_ids"] for document in documents]
    assert all(tokenizer.cls_token_id not in doc and tokenizer.sep_token_id not in doc for doc in ids)
