"""Tokenizers: byte-level BPE for causal LMs, and one tokenizer shared by every process."""

from __future__ import annotations

import pickle
import random
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from finetune.data import tokenizers
from finetune.data.tokenizers import END_OF_TEXT, PAD, shared_tokenizer, train_byte_level_bpe, train_wordpiece
from tests.conftest import make_sentence

LINES = [make_sentence(random.Random(index), index % 2 == 0) for index in range(80)]
# Text the tokenizer never saw: spacing, control characters, accents, other scripts, an emoji.
UNSEEN = [
    "the film was great .",
    "  two leading spaces, two trailing  ",
    "Tabs\tand\nnewlines\r\n",
    "café naïve Ünïcödé",
    "日本語のテキスト и кириллица",
    "emoji 🎉🙂 and symbols ∑ ≠ ©",
]


@pytest.fixture(scope="module")
def bpe():
    return train_byte_level_bpe(LINES, vocab_size=300, min_frequency=1)


def test_byte_level_bpe_round_trips_any_text(bpe):
    for text in UNSEEN:
        ids = bpe(text)["input_ids"]
        assert bpe.decode(ids) == text
        assert bpe.eos_token_id not in ids  # nothing became the unknown token (<|endoftext|>)
    assert len(bpe) == 300
    # Training learnt merges: a seen sentence takes far fewer tokens than bytes.
    assert len(bpe(LINES[0])["input_ids"]) < len(LINES[0].encode()) * 2 / 3


def test_byte_level_bpe_special_tokens(bpe):
    assert bpe.convert_ids_to_tokens([0, 1]) == [END_OF_TEXT, PAD]
    assert bpe.eos_token == bpe.bos_token == bpe.unk_token == END_OF_TEXT
    assert bpe.pad_token == PAD
    assert bpe.model_input_names == ["input_ids", "attention_mask"]
    # No post-processor adds specials: packing puts the separators in.
    assert bpe("the film")["input_ids"] == bpe("the film", add_special_tokens=False)["input_ids"]
    assert bpe.eos_token_id not in bpe("the film")["input_ids"]


def test_special_tokens_are_never_merged_or_split():
    lines = [f"the film{END_OF_TEXT}the plot{PAD}{PAD} was{END_OF_TEXT}" for _ in range(50)] + LINES
    tokenizer = train_byte_level_bpe(lines, vocab_size=300, min_frequency=1)
    learnt = [token for token in tokenizer.get_vocab() if token not in (END_OF_TEXT, PAD)]
    assert not [token for token in learnt if "endoftext" in token or "|>" in token or "<|" in token]
    ids = tokenizer(f"x{END_OF_TEXT}{END_OF_TEXT}y{PAD}z", add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 2 and ids.count(tokenizer.pad_token_id) == 1
    assert tokenizer.decode(ids) == f"x{END_OF_TEXT}{END_OF_TEXT}y{PAD}z"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "xyz"


def test_byte_level_bpe_lowercase():
    tokenizer = train_byte_level_bpe(LINES, vocab_size=280, min_frequency=1, lowercase=True)
    assert tokenizer("The FILM Was Great")["input_ids"] == tokenizer("the film was great")["input_ids"]
    cased = train_byte_level_bpe(LINES, vocab_size=280, min_frequency=1)
    assert cased("The FILM")["input_ids"] != cased("the film")["input_ids"]


def test_byte_level_bpe_reloads_with_auto_tokenizer(bpe, tmp_path):
    bpe.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.special_tokens_map == bpe.special_tokens_map
    assert (loaded.eos_token_id, loaded.bos_token_id, loaded.unk_token_id, loaded.pad_token_id) == (0, 0, 0, 1)
    assert len(loaded) == len(bpe)
    for text in UNSEEN + [f"a{END_OF_TEXT}b{PAD}"]:
        assert loaded(text)["input_ids"] == bpe(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"]) == text
    padded = loaded(["short", "a longer text"], padding=True)
    assert padded["input_ids"][0][-1] == loaded.pad_token_id and "token_type_ids" not in padded


def _accelerator(rank: int, processes: int):
    return SimpleNamespace(is_main_process=rank == 0, num_processes=processes)


def _send_by_pickle(monkeypatch, sent):
    """Stand in for torch.distributed: the main process's payload arrives pickled, as gloo/NCCL deliver it."""
    monkeypatch.setattr(
        tokenizers, "broadcast_object_list", lambda payload, from_process: pickle.loads(pickle.dumps([sent]))
    )


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_shared_tokenizer_keeps_the_special_tokens(kind, monkeypatch):
    def train():
        if kind == "bpe":
            return train_byte_level_bpe(LINES, vocab_size=280, min_frequency=1)
        return train_wordpiece(LINES, vocab_size=150, min_frequency=1)

    main = shared_tokenizer(_accelerator(0, 1), train)
    _send_by_pickle(monkeypatch, main)
    other = shared_tokenizer(_accelerator(1, 2), lambda: pytest.fail("only the main process trains"))
    assert other is not main
    assert other.special_tokens_map == main.special_tokens_map
    assert other.model_input_names == main.model_input_names
    assert other.get_vocab() == main.get_vocab()
    for text in UNSEEN:
        assert other(text, "a pair")["input_ids"] == main(text, "a pair")["input_ids"]
    if kind == "wordpiece":  # BERT's specials, templates and segment ids, as before
        assert main.special_tokens_map == {
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        }
        encoded = other("the film", "was great")
        assert encoded["input_ids"][0] == other.cls_token_id and encoded["input_ids"].count(other.sep_token_id) == 2
        assert set(encoded["token_type_ids"]) == {0, 1}
    else:
        assert other.eos_token == END_OF_TEXT and other.pad_token == PAD and other.mask_token is None
