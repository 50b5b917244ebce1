"""Corpus: documents from text files or a dataset, train/validation split, flat cached token ids, packing."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

from finetune.data import token_cache
from finetune.data.corpus import (
    TokenizedDocuments,
    document_stream,
    file_pieces,
    pack_blocks,
    read_dataset_documents,
    read_documents,
    split_documents,
)
from finetune.data.token_cache import encode, tokenize_corpus, tokenize_documents
from finetune.data.tokenizers import train_byte_level_bpe, train_wordpiece
from finetune.errors import UserError
from tests.conftest import make_sentence

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
    blocks = pack_blocks(documents, block_size, SEP, start_id=CLS)
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
    blocks = pack_blocks(documents, 4, SEP, start_id=CLS)  # stream: 11 12 S 13 S 14 15 16 S  -> 3 bodies of 3
    assert blocks.tolist() == [[CLS, 11, 12, SEP], [CLS, 13, SEP, 14], [CLS, 15, 16, SEP]]


def test_pack_blocks_drops_the_tail():
    documents = [[11, 12], [13], [14, 15, 16, 17]]  # 10 stream tokens -> 3 bodies of 3, 1 token dropped
    blocks = pack_blocks(documents, 4, SEP, start_id=CLS)
    assert blocks.tolist() == [[CLS, 11, 12, SEP], [CLS, 13, SEP, 14], [CLS, 15, 16, 17]]


def test_pack_blocks_too_little_text():
    with pytest.raises(UserError, match="the validation text has 3 tokens, fewer than one block of 8"):
        pack_blocks([[11, 12]], 8, SEP, start_id=CLS, name="the validation text")
    with pytest.raises(UserError, match="the corpus has 3 tokens, fewer than one block of 4"):
        pack_blocks(TokenizedDocuments.from_lists([[11, 12]]), 4, SEP)


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


def test_lines_of_invisible_characters_are_empty(tmp_path):
    """Zero-width spaces and joiners, byte-order marks, controls: BERT's normaliser deletes them, nothing shows."""
    path = tmp_path / "zero-width.txt"
    path.write_text("\u200b\u200c\ufeff\n\u200b \u200d\nword\u200bjoined\n\ufeffbom first\n\x07\n", encoding="utf-8")
    assert read_documents([path]) == ["word\u200bjoined", "\ufeffbom first"]
    path.write_text("\u200b\u200c\ufeff\n" * 5, encoding="utf-8")
    with pytest.raises(UserError, match=f"{path}: no text .*invisible"):
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
    _, other_validation = split_documents(documents, 0.1, seed=1)
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


# Packing without a start token (causal LMs) and from flat arrays


def test_pack_blocks_without_start_token():
    documents = [[11, 12], [13], [14, 15, 16]]  # stream: 11 12 S 13 S 14 15 16 S
    assert pack_blocks(documents, 3, SEP).tolist() == [[11, 12, SEP], [13, SEP, 14], [15, 16, SEP]]
    # 9 tokens make 2 blocks of 4; the last token is dropped, and no block gains a start token.
    assert pack_blocks(documents, 4, SEP).tolist() == [[11, 12, SEP, 13], [SEP, 14, 15, 16]]


@pytest.mark.parametrize("start_id", [None, CLS])
@pytest.mark.parametrize("block_size", [8, 13])
def test_pack_blocks_flat_documents_match_lists(block_size, start_id):
    documents = _documents()
    blocks = pack_blocks(TokenizedDocuments.from_lists(documents), block_size, SEP, start_id=start_id)
    assert blocks.dtype == np.int64
    assert blocks.tolist() == pack_blocks(documents, block_size, SEP, start_id=start_id).tolist()
    body = blocks if start_id is None else blocks[:, 1:]
    if start_id is not None:
        assert (blocks[:, 0] == CLS).all()
    # The separator sits exactly at each document end that the kept blocks reach, and nowhere else.
    ends = np.cumsum([len(ids) + 1 for ids in documents]) - 1
    kept = body.size
    assert np.flatnonzero(body.reshape(-1) == SEP).tolist() == ends[ends < kept].tolist()
    assert len(_stream(documents)) - kept < body.shape[1]


# Flat token ids


def test_tokenized_documents_round_trip(tmp_path):
    lists = [[5, 6, 7], [], [8], [9, 10]]
    documents = TokenizedDocuments.from_lists(lists)
    assert len(documents) == 4
    assert documents.ids.dtype == np.int32 and documents.offsets.dtype == np.int64
    assert documents.offsets.tolist() == [0, 3, 3, 4, 6]
    assert [documents.document(index).tolist() for index in range(4)] == lists
    assert documents.lengths.tolist() == [3, 0, 1, 2]
    documents.save(tmp_path / "tokens")
    loaded = TokenizedDocuments.load(tmp_path / "tokens")
    assert isinstance(loaded.ids, np.memmap) and isinstance(loaded.offsets, np.memmap)  # mapped, not read
    assert loaded.ids.tolist() == documents.ids.tolist() and loaded.offsets.tolist() == documents.offsets.tolist()
    both = TokenizedDocuments.concatenate([documents, TokenizedDocuments.from_lists([[1], [2, 3]])])
    assert [both.document(index).tolist() for index in range(len(both))] == lists + [[1], [2, 3]]
    assert len(TokenizedDocuments.concatenate([])) == 0


def test_tokenized_documents_rejects_inconsistent_offsets():
    with pytest.raises(ValueError):
        TokenizedDocuments(np.arange(5), np.array([0, 3, 4]))  # the offsets stop before the last id
    with pytest.raises(ValueError):
        TokenizedDocuments(np.arange(5), np.array([0, 4, 3, 5]))  # a negative length


def test_document_stream_in_order():
    lists = [[5, 6, 7], [], [8], [9, 10]]
    documents = TokenizedDocuments.from_lists(lists)
    assert document_stream(documents, SEP).tolist() == _stream(lists)
    order = np.array([3, 1, 0, 2])
    assert document_stream(documents, SEP, order).tolist() == _stream([lists[index] for index in order])
    assert document_stream(documents, SEP, np.array([], dtype=np.int64)).tolist() == []


def test_document_stream_random_orders():
    lists = _documents()
    documents = TokenizedDocuments.from_lists(lists)
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(len(lists))
        assert document_stream(documents, SEP, order).tolist() == _stream([lists[index] for index in order])


# tokenize_corpus and its cache

LINES = [make_sentence(random.Random(index), index % 2 == 0) for index in range(60)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_byte_level_bpe(LINES, vocab_size=300, min_frequency=1)


class CountingTokenizer:
    """A tokenizer that counts its batch encodings (calls, or the backend's batches), to prove a cache hit does
    not tokenize."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0
        self.backend_tokenizer = CountingBackend(self)

    def __getattr__(self, name):  # the rest (special ids, ...) is the wrapped tokenizer's
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer(*args, **kwargs)


class CountingBackend:
    """The wrapped tokenizer's backend, counting its batch encodings into the CountingTokenizer."""

    def __init__(self, owner: CountingTokenizer):
        self.owner = owner

    def __getattr__(self, name):
        return getattr(self.owner.tokenizer.backend_tokenizer, name)

    def encode_batch_fast(self, *args, **kwargs):
        self.owner.calls += 1
        return self.owner.tokenizer.backend_tokenizer.encode_batch_fast(*args, **kwargs)


def _as_lists(documents: TokenizedDocuments) -> list[list[int]]:
    return [documents.document(index).tolist() for index in range(len(documents))]


def test_tokenize_corpus_matches_per_document_ids(tokenizer):
    tokenized = tokenize_corpus(tokenizer, LINES, None, "test", batch_size=7)  # 9 batches, the last partial
    assert len(tokenized) == len(LINES)
    assert _as_lists(tokenized) == [tokenizer(line, add_special_tokens=False)["input_ids"] for line in LINES]
    assert _as_lists(tokenized) == tokenize_documents(tokenizer, LINES, batch_size=11)


def test_tokenize_corpus_cache_hit(tokenizer, tmp_path, capsys):
    counting = CountingTokenizer(tokenizer)
    first = tokenize_corpus(counting, LINES, tmp_path, "training text", batch_size=25)
    assert counting.calls == 3
    assert len(list(tmp_path.iterdir())) == 1  # the cache file, no temporary left behind
    capsys.readouterr()
    second = tokenize_corpus(counting, list(LINES), tmp_path, "training text", batch_size=25)
    assert counting.calls == 3  # loaded, not tokenized
    assert _as_lists(second) == _as_lists(first)
    assert "training text" in capsys.readouterr().err


def test_tokenize_corpus_cache_misses_on_changed_text_or_tokenizer(tokenizer, tmp_path):
    counting = CountingTokenizer(tokenizer)
    tokenize_corpus(counting, LINES, tmp_path, "test")
    changed = LINES[:-1] + [LINES[-1] + " again"]
    tokenize_corpus(counting, changed, tmp_path, "test")
    assert counting.calls == 2
    # Moving text between documents changes the documents even though the characters are the same.
    tokenize_corpus(counting, [LINES[0] + LINES[1]] + LINES[2:], tmp_path, "test")
    assert counting.calls == 3
    other = CountingTokenizer(train_byte_level_bpe(LINES, vocab_size=280, min_frequency=1))
    tokenized = tokenize_corpus(other, LINES, tmp_path, "test")
    assert other.calls == 1
    assert _as_lists(tokenized) == tokenize_documents(other.tokenizer, LINES)
    assert len(list(tmp_path.iterdir())) == 4


def test_tokenize_corpus_recovers_from_a_corrupt_cache(tokenizer, tmp_path):
    expected = _as_lists(tokenize_corpus(tokenizer, LINES, tmp_path, "test"))
    (entry,) = tmp_path.iterdir()
    ids_file = entry / "ids.npy"
    ids_file.write_bytes(ids_file.read_bytes()[:100])  # as a disk filling up mid-write would leave it
    counting = CountingTokenizer(tokenizer)
    with pytest.warns(UserWarning, match="unreadable token cache"):
        assert _as_lists(tokenize_corpus(counting, LINES, tmp_path, "test")) == expected
    assert counting.calls == 1
    # Rewritten: the next call loads it without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _as_lists(tokenize_corpus(counting, LINES, tmp_path, "test")) == expected
    assert counting.calls == 1


def test_tokenize_corpus_cache_of_another_corpus_is_not_trusted(tokenizer, tmp_path):
    """A valid file with the wrong number of documents under this key is treated as corrupt."""
    key = token_cache.corpus_cache_key(tokenizer, LINES)
    TokenizedDocuments.from_lists([[1, 2]]).save(tmp_path / f"tokens-{key}")
    with pytest.warns(UserWarning, match="1 documents instead of 60"):
        assert len(tokenize_corpus(tokenizer, LINES, tmp_path, "test")) == len(LINES)


def test_cache_write_is_atomic(tokenizer, tmp_path, monkeypatch):
    add = token_cache.TokenWriter.add

    def interrupted_add(writer, *arguments):
        add(writer, *arguments)  # half the ids written
        raise KeyboardInterrupt  # a run killed in the middle of writing

    monkeypatch.setattr(token_cache.TokenWriter, "add", interrupted_add)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(tokenizer, LINES, tmp_path, "test")
    assert list(tmp_path.iterdir()) == []  # neither a cache file nor a temporary one
    monkeypatch.undo()
    counting = CountingTokenizer(tokenizer)
    tokenize_corpus(counting, LINES, tmp_path, "test")
    assert counting.calls == 1 and len(list(tmp_path.iterdir())) == 1


def test_text_of_unknown_characters_is_refused(tmp_path, monkeypatch):
    """Every token [UNK]: masking never picks one, so BERT would train at loss 0."""
    tokenizer = train_wordpiece(LINES, vocab_size=200, min_frequency=1)
    documents = ["一二三 四五", "六七"]
    for cache_dir in (None, tmp_path):
        with pytest.raises(UserError) as info:
            tokenize_corpus(tokenizer, documents, cache_dir, "test", name="the training text")
        assert str(info.value).startswith(
            "the training text gives no known tokens: its 2 documents tokenize to only [UNK]"
        )
        assert "一二三 四五" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing cached
    # A cache written without the check (an earlier version) is refused as well.
    monkeypatch.setattr(token_cache, "check_known_tokens", lambda *arguments: None)
    tokenize_corpus(tokenizer, documents, tmp_path, "test")
    monkeypatch.undo()
    with pytest.raises(UserError, match="no known tokens"):
        tokenize_corpus(tokenizer, documents, tmp_path, "test")


def test_a_tokenizer_trained_on_zero_width_text_knows_no_token():
    """WordPiece normalises the characters away and learns only its special tokens; byte-level BPE keeps the bytes."""
    wordpiece = train_wordpiece(["\u200b\u200c\ufeff"] * 20, vocab_size=200, min_frequency=1)
    with pytest.raises(UserError, match="the corpus gives no known tokens"):
        tokenize_corpus(wordpiece, LINES)
    bpe = train_byte_level_bpe(["\u200b\u200c\ufeff"] * 20, vocab_size=300, min_frequency=1)
    assert len(tokenize_corpus(bpe, LINES).ids) > 0


def test_wordpiece_corpus_packs_into_bert_blocks():
    tokenizer = train_wordpiece(LINES, vocab_size=200, min_frequency=1)
    blocks = pack_blocks(tokenize_corpus(tokenizer, LINES), 16, tokenizer.sep_token_id, start_id=tokenizer.cls_token_id)
    assert (blocks[:, 0] == tokenizer.cls_token_id).all() and tokenizer.cls_token_id not in blocks[:, 1:]
    assert (blocks == tokenizer.sep_token_id).sum() >= len(blocks)  # sentences of ~7 tokens: one [SEP] a block


# A `datasets` dataset as the corpus


@pytest.fixture
def jsonl_dataset(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")  # leave ~/.cache alone
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"text": " = Title = \\n", "id": 1}\n{"text": "", "id": 2}\n{"text": "a line .", "id": 3}\n', encoding="utf-8"
    )
    return str(path)


def test_read_dataset_documents(jsonl_dataset):
    assert read_dataset_documents("json", None, "train", "text", data_files=jsonl_dataset) == ["= Title =", "a line ."]


def test_read_dataset_documents_missing_column(jsonl_dataset):
    with pytest.raises(UserError) as info:
        read_dataset_documents("json", None, "train", "body", data_files=jsonl_dataset)
    message = str(info.value)
    assert "dataset json" in message and "'body'" in message and "text, id" in message and "\n" not in message


def test_read_dataset_documents_unloadable(jsonl_dataset, tmp_path):
    with pytest.raises(UserError, match=r"dataset json.*'validation'"):
        read_dataset_documents("json", None, "validation", "text", data_files=jsonl_dataset)
    with pytest.raises(UserError, match=r"missing.jsonl"):
        read_dataset_documents("json", None, "train", "text", data_files=str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="dataset surely-not-a-dataset-xyz"):  # the suite runs with HF_HUB_OFFLINE=1
        read_dataset_documents("surely-not-a-dataset-xyz")


# Documents of text files: lines, paragraphs, whole files (corpus.document)

PLAY = (
    "KING.\r\nSpeak, speak.  \r\n  I am thy father's spirit,\n\n \u200b\n\nHAMLET.\n\tAlas, poor ghost!\n"
    "\n\n\nKING.\nMark me.\n\n"
)


def test_paragraphs_are_lines_up_to_a_blank_line_with_their_line_breaks(tmp_path):
    path = tmp_path / "play.txt"
    path.write_text(PLAY, encoding="utf-8", newline="")
    (tmp_path / "more.txt").write_text("no blank line at the end\nof this one", encoding="utf-8")
    assert read_documents([path, tmp_path / "more.txt"], "paragraph") == [
        "KING.\nSpeak, speak.\nI am thy father's spirit,",
        "HAMLET.\nAlas, poor ghost!",
        "KING.\nMark me.",
        "no blank line at the end\nof this one",
    ]  # a file's end ends a paragraph; a line of U+200B is blank


def test_a_file_is_one_document_as_written(tmp_path):
    play, blank = tmp_path / "play.txt", tmp_path / "blank.txt"
    play.write_text(PLAY, encoding="utf-8", newline="")
    blank.write_text("\n \u200b\n\n", encoding="utf-8")  # nothing shows: no document
    assert read_documents([blank, play, blank], "file") == [
        (
            "KING.\nSpeak, speak.  \n  I am thy father's spirit,\n\n \u200b\n\nHAMLET.\n\tAlas, poor ghost!\n\n\n\n"
            "KING.\nMark me."
        )
    ]
    with pytest.raises(UserError, match=f"{blank}: no text"):
        read_documents([blank], "file")


@pytest.mark.parametrize("document", ["paragraph", "file"])
def test_pieces_of_a_document_give_the_tokens_of_the_whole(document, tmp_path):
    """Cut before line breaks that follow a non-space, a long paragraph or file is tokenised in pieces (so it
    streams) into exactly the ids of the whole text, with byte-level BPE and WordPiece alike; training a
    tokenizer on the pieces learns what training on the whole texts learns."""
    rng = random.Random(0)
    speeches = [
        "\n".join(
            ("    " if rng.random() < 0.3 else "")
            + make_sentence(rng, rng.random() < 0.5)
            + (" " if rng.random() < 0.2 else "")
            for _ in range(rng.randint(1, 9))
        )
        for _ in range(60)
    ]
    path = tmp_path / "play.txt"
    path.write_text("\n\n".join(speeches) + "\n", encoding="utf-8")
    whole = [piece.text for piece in file_pieces([path], document, piece_bytes=None)]
    pieces = list(file_pieces([path], document, piece_bytes=40))
    assert len(pieces) > 2 * len(whole) and sum(piece.first for piece in pieces) == len(whole)
    assert read_documents([path], document) == whole
    bpe, wordpiece = (train(whole, 300, min_frequency=1) for train in (train_byte_level_bpe, train_wordpiece))
    assert train_byte_level_bpe([piece.text for piece in pieces], 300, min_frequency=1).get_vocab() == bpe.get_vocab()
    for tokenizer in (bpe, wordpiece):
        joined: list[list[int]] = []
        for piece, ids in zip(pieces, encode(tokenizer, [piece.text for piece in pieces])):
            joined += [[]] if piece.first else []
            joined[-1] += ids
        assert joined == encode(tokenizer, whole)
    newline = bpe.convert_tokens_to_ids("Ċ")  # byte-level BPE sees the line breaks; WordPiece reads them as spaces
    assert newline in encode(bpe, whole[:1])[0]
    assert encode(wordpiece, [whole[0]]) == encode(wordpiece, [whole[0].replace("\n", " ")])
