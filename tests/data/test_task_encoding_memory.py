"""A large task file is not held several times over: the token ids sit in flat arrays (RaggedColumn), a few bytes a
token, and what encoding needs beyond them is one chunk's worth, whatever the file's size (bench/large_csv_memory.py
measures the process's peak on files of hundreds of MB)."""

from __future__ import annotations

import pickle
import random
import tracemalloc
from pathlib import Path

import numpy as np

from finetune.data.examples import PackedRows, PackedStrings
from finetune.data.task_encoding import EncodedTask, RaggedColumn
from finetune.data.task_files import read_labelled_split
from finetune.data.tokenizers import train_wordpiece
from finetune.tasks.specs import TaskSpec
from tests.conftest import make_sentence


def test_a_ragged_column_reads_back_its_rows_and_slices_in_the_smallest_type():
    column = RaggedColumn()
    column.extend([[101, 7, 102], [101, 102]])
    column.extend([[101, 40_000, 5, 102]])
    column.finish()
    assert len(column) == 3 and column.lengths.tolist() == [3, 2, 4]
    assert column[1] == [101, 102] and column[2] == [101, 40_000, 5, 102]
    assert column[0:2] == [[101, 7, 102], [101, 102]]
    assert column.flat.dtype == np.uint16  # ids past uint8: the widest chunk's type (a vocabulary under 65,536)
    wide = RaggedColumn()
    wide.extend([[101, 128_000], [-1]])  # Llama 3's vocabulary; a negative value
    wide.finish()
    assert wide.flat.dtype == np.int32 and wide[:] == [[101, 128_000], [-1]]


def test_a_column_of_one_value_stores_none_until_another_comes():
    mask = RaggedColumn()
    mask.extend([[1, 1, 1], [1]])
    mask.extend([[1, 1]])
    mask.finish()
    assert mask.constant == 1 and mask.nbytes == mask.offsets.nbytes  # the lengths alone
    assert mask[0] == [1, 1, 1] and mask[2] == [1, 1] and mask.flat.tolist() == [1] * 6
    restored = pickle.loads(pickle.dumps(mask))  # as a data-loader worker receives it
    assert restored[:] == [[1, 1, 1], [1], [1, 1]] and len(pickle.dumps(mask)) < 1_000
    segments = RaggedColumn()  # a pair's segment ids: 0s in a first chunk of single texts, then 1s
    segments.extend([[0, 0], [0]])
    segments.extend([[0, 1, 1]])
    segments.finish()
    assert segments.constant is None and segments[:] == [[0, 0], [0], [0, 1, 1]]
    assert segments.flat.dtype == np.uint8 and segments.nbytes == 6 + segments.offsets.nbytes
    empty = RaggedColumn()
    empty.finish()
    assert len(empty) == 0 and empty.lengths.tolist() == []


def write_csv(path: Path, rows: int) -> Path:
    rng = random.Random(0)
    lines = ["sentence,label"]
    for _ in range(rows):
        positive = rng.random() < 0.5
        text = " ".join(make_sentence(rng, positive) for _ in range(rng.randint(1, 6)))
        lines.append(f"{text},{int(positive)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_encoding_holds_a_few_bytes_a_token_and_needs_one_chunk_beyond_them(tmp_path):
    csv = write_csv(tmp_path / "train.csv", 2_000)  # ~200 kB
    size = csv.stat().st_size
    tokenizer = train_wordpiece([make_sentence(random.Random(1), True) for _ in range(50)], 200, min_frequency=1)
    spec = TaskSpec(
        name="large",
        text_columns=("sentence",),
        label_column="label",
        labels=("0", "1"),
        metrics=("accuracy",),
        files={"train": "train.csv"},
    )
    read_labelled_split(spec, tmp_path, "train")  # once before measuring: the modules' first-use caches
    tracemalloc.start()
    try:
        examples = read_labelled_split(spec, tmp_path, "train")
        texts_held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The texts packed (one UTF-8 buffer, 8 bytes an offset): 1.4x the file's size at this test's ~100-byte rows
    # (1.2x at 250), where lists of str took ~2.3x.
    assert isinstance(examples.texts, PackedRows) and texts_held < 1.5 * size, texts_held / size
    tracemalloc.start()
    try:
        encoded = EncodedTask(examples, tokenizer, 64, chunk=100)  # 20 chunks: the chunk's share is small
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tokens = sum(encoded.lengths)
    assert len(encoded) == 2_000 and tokens > size / 8  # every example encoded, a token per few bytes of text
    # ids (uint16 under 65,536 pieces); the attention mask and the segment ids of single texts are one value each:
    # 2 bytes a token, and the rows' offsets. As lists of Python ints the same encoding held ~9x the file's size.
    assert sum(column.nbytes for column in encoded.encodings.values()) <= 2 * tokens + 3 * 8 * (2_000 + 1)
    assert held < 0.8 * size, held / size
    assert peak < 2 * size, peak / size  # the held arrays plus one chunk's tokenizer output (its share: small files)
    assert encoded[3]["input_ids"][0] == tokenizer.cls_token_id and encoded[3]["labels"] in (0, 1)


def test_packed_texts_read_back_as_the_lists_they_stand_for():
    strings = PackedStrings(["café", "", "a \ud800 lone surrogate (JSON allows one)", "z"])
    assert len(strings) == 4 and strings[0] == "café" and strings[1] == "" and strings[-1] == "z"
    assert strings[2] == "a \ud800 lone surrogate (JSON allows one)" and strings[1:3] == ["", strings[2]]
    assert strings == ["café", "", strings[2], "z"] and strings != ["café"] and strings.take([3, 0]) == ["z", "café"]
    try:
        strings[4]
    except IndexError:
        pass
    else:
        raise AssertionError("a row past the end must raise IndexError")
    rows = PackedRows([("q1", "s1"), ("q2", "s2")])
    assert rows[1] == ("q2", "s2") and rows == [("q1", "s1"), ("q2", "s2")] and rows.columns[1] == ["s1", "s2"]
    assert list(zip(*rows)) == [("q1", "q2"), ("s1", "s2")] and rows.take([1]) == [("q2", "s2")]
    assert not PackedRows() and len(PackedRows()) == 0
    try:
        rows.append(("only one",))
    except ValueError as error:
        assert "1 texts among rows of 2" in str(error)
    else:
        raise AssertionError("a row of another width must be refused")
