"""A large task file is not held several times over: the token ids sit in flat arrays (RaggedColumn), a few bytes a
token, and what encoding needs beyond them is one chunk's worth, whatever the file's size (bench/large_csv_memory.py
measures the process's peak on files of hundreds of MB)."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import numpy as np

from finetune.data.task_encoding import EncodedTask, RaggedColumn
from finetune.data.task_files import read_labelled_split
from finetune.data.tokenizers import train_wordpiece
from finetune.glue.specs import TaskSpec
from tests.conftest import make_sentence


def test_a_ragged_column_reads_back_its_rows_and_slices_in_the_smallest_type():
    column = RaggedColumn()
    column.extend([[101, 7, 102], [101, 102]])
    column.extend([[101, 40_000, 5, 102]])
    column.finish()
    assert len(column) == 3 and column.lengths.tolist() == [3, 2, 4]
    assert column[1] == [101, 102] and column[2] == [101, 40_000, 5, 102]
    assert column[0:2] == [[101, 7, 102], [101, 102]]
    assert column.flat.dtype == np.int32  # ids past int8: the widest chunk's type
    mask = RaggedColumn()
    mask.extend([[1, 1, 1], [1]])
    mask.finish()
    assert mask.flat.dtype == np.int8 and mask[0] == [1, 1, 1]
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
    examples = read_labelled_split(spec, tmp_path, "train")
    tracemalloc.start()
    try:
        encoded = EncodedTask(examples, tokenizer, 64, chunk=100)  # 20 chunks: the chunk's share is small
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tokens = sum(encoded.lengths)
    assert len(encoded) == 2_000 and tokens > size / 8  # every example encoded, a token per few bytes of text
    # ids (int32) + attention mask and segment ids (int8): 6 bytes a token, and the rows' offsets. As lists of
    # Python ints the same encoding held ~9x the file's size here.
    assert sum(column.flat.nbytes for column in encoded.encodings.values()) <= 6 * tokens
    assert held < 1.5 * size, held / size
    assert peak < 2.5 * size, peak / size  # the held arrays plus one chunk's tokenizer output
    assert encoded[3]["input_ids"][0] == tokenizer.cls_token_id and encoded[3]["labels"] in (0, 1)
