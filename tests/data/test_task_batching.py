"""Task batching: length-grouped order (also sharded by accelerate), what an order costs in padding, and padding like
`DataCollatorWithPadding`."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from finetune.data.corpus import read_documents
from finetune.data.examples import TaskExamples
from finetune.data.task_batches import BatchPadding, LengthGroupedSampler, PaddingCollator, batch_padding, length_pieces
from finetune.data.task_encoding import EncodedTask
from finetune.data.tokenizers import train_wordpiece
from tests.conftest import make_sentence, write_corpus

BATCH = 8


def random_lengths(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 60) for _ in range(count)]


def batches_of(sampler: LengthGroupedSampler, batch_size: int = BATCH) -> list[list[int]]:
    return [batch.tolist() for batch in DataLoader(range(len(sampler)), batch_size=batch_size, sampler=sampler)]


@pytest.mark.parametrize("chunk_batches", [1, 2, 4, 50])
@pytest.mark.parametrize("count", [1, 7, 8, 100, 403, 1000])
def test_every_index_once_per_epoch(count, chunk_batches):
    sampler = LengthGroupedSampler(random_lengths(count), BATCH, seed=0, chunk_batches=chunk_batches)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(sampler) == list(range(count)) and len(sampler) == count


def test_order_comes_from_seed_and_epoch_alone():
    lengths = random_lengths(500)
    first, second = LengthGroupedSampler(lengths, BATCH, seed=3), LengthGroupedSampler(lengths, BATCH, seed=3)
    torch.manual_seed(0), np.random.seed(0)
    order = list(first)
    torch.manual_seed(1), np.random.seed(1)  # the global random state plays no part
    assert list(second) == order
    first.set_epoch(1)
    assert list(first) != order  # a new order every epoch
    assert list(LengthGroupedSampler(lengths, BATCH, seed=4)) != order


def test_batches_hold_similar_lengths_and_only_the_last_is_short():
    lengths = random_lengths(1003)
    grouped = batches_of(LengthGroupedSampler(lengths, BATCH, seed=0))
    assert [len(batch) for batch in grouped] == [BATCH] * 125 + [3]
    padded = sum(max(lengths[i] for i in batch) * len(batch) for batch in grouped)
    shuffled = np.random.default_rng(0).permutation(len(lengths))
    random_padded = sum(
        max(lengths[i] for i in shuffled[start : start + BATCH]) * len(shuffled[start : start + BATCH])
        for start in range(0, len(lengths), BATCH)
    )
    assert padded < 0.6 * random_padded
    assert max(max(lengths[i] for i in batch) - min(lengths[i] for i in batch) for batch in grouped) <= 6
    # The batches themselves come in random order, not longest first.
    longest = [max(lengths[i] for i in batch) for batch in grouped[:-1]]
    assert longest != sorted(longest, reverse=True) and longest != sorted(longest)


@pytest.mark.parametrize("chunk_batches", [1, 2, 50])
def test_two_processes_share_out_the_batches_of_one(chunk_batches):
    """Grouped by the global batch, accelerate's shards of 2 x 4 make up the batches of 1 x 8, step by step."""
    lengths = random_lengths(203)
    sampler = LengthGroupedSampler(lengths, BATCH, seed=0, chunk_batches=chunk_batches)
    sampler.set_epoch(2)
    single = batches_of(sampler)
    shards = []
    for process in range(2):
        loader = prepare_data_loader(
            DataLoader(range(len(lengths)), batch_size=BATCH // 2, sampler=sampler),
            num_processes=2,
            process_index=process,
            put_on_device=False,
        )
        loader.set_epoch(2)
        shards.append([batch.tolist() for batch in loader])
    assert sampler.epoch == 2  # accelerate passes the epoch on to the sampler inside its shard
    assert len(shards[0]) == len(shards[1]) == len(single)
    for step, batch in enumerate(single[:-1]):
        assert shards[0][step] + shards[1][step] == batch
    # 203 = 25 x 8 + 3: the short tail goes to process 0, which accelerate tops up from the start of the epoch.
    assert shards[0][-1][:3] == single[-1] and len(single[-1]) == 3


@pytest.mark.parametrize("chunk_batches", [1, 2])
def test_small_chunks_sort_only_within_themselves(chunk_batches):
    """Each batch lies inside one chunk of the epoch's shuffle (chunks of 1: it is exactly that shuffle's batch),
    longest first."""
    lengths = random_lengths(400)
    shuffled = np.random.default_rng((0, 0)).permutation(len(lengths))  # the order the sampler starts from
    chunk = chunk_batches * BATCH
    chunks = [set(shuffled[start : start + chunk].tolist()) for start in range(0, len(lengths), chunk)]
    grouped = batches_of(LengthGroupedSampler(lengths, BATCH, seed=0, chunk_batches=chunk_batches))
    assert all(sum(set(batch) <= part for part in chunks) == 1 for batch in grouped)
    assert all([lengths[i] for i in batch] == sorted((lengths[i] for i in batch), reverse=True) for batch in grouped)
    if chunk_batches == 1:
        assert {frozenset(batch) for batch in grouped} == {frozenset(part) for part in chunks}


def test_fewer_batches_to_a_chunk_pad_more():
    lengths = random_lengths(400)
    costs = [batch_padding(lengths, BATCH, 0, chunk).cost for chunk in (1, 2, 8, 50)]
    assert costs == sorted(costs, reverse=True) and costs[0] > 1.3 * costs[-1]
    # Chunks of one batch pad exactly as much as the plain shuffle they sort inside.
    assert costs[0] == batch_padding(lengths, BATCH, 0, None).cost


def test_a_chunk_of_no_batches_is_refused():
    with pytest.raises(ValueError, match="chunk_batches must be at least 1"):
        LengthGroupedSampler(random_lengths(10), BATCH, seed=0, chunk_batches=0)


def test_batch_padding_counts_padded_positions_and_the_positions_computed():
    """Hand-made: two batches of 2 in the order a sort by length gives them, whatever the seed."""
    # One chunk of both batches sorted longest first: [10, 9] and [2, 1], 20 + 4 = 24 positions, 22 real.
    assert batch_padding([1, 10, 2, 9], 2, seed=0, chunk_batches=2) == BatchPadding(pytest.approx(2 / 24), 24)
    # Equal lengths never pad, however they are batched; a short last batch counts its own examples only.
    assert batch_padding([5] * 5, 2, seed=3, chunk_batches=None) == BatchPadding(0.0, 25)
    # Shuffled: the cost of the order ResumableSampler reads, batch by batch.
    lengths = random_lengths(50)
    order = np.random.default_rng((7, 0)).permutation(50)
    cost = sum(len(order[s : s + BATCH]) * max(lengths[i] for i in order[s : s + BATCH]) for s in range(0, 50, BATCH))
    assert batch_padding(lengths, BATCH, seed=7, chunk_batches=None) == BatchPadding(
        pytest.approx(1 - sum(lengths) / cost), cost
    )
    assert batch_padding([], BATCH, seed=0, chunk_batches=4) == BatchPadding(0.0, 0)


def cut_cost(lengths: list[int], pieces: list, overhead: int) -> int:
    """Positions computed by `pieces` of a batch of `lengths`: each piece's size x its longest, plus `overhead`."""
    return sum(len(piece) * max(lengths[index] for index in piece) + overhead for piece in pieces)


def every_cut(lengths: list[int]) -> list[list[list[int]]]:
    """Every cut of the length-sorted batch into runs (2^(n-1) of them)."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    cuts = []
    for mask in range(2 ** (len(order) - 1)):
        pieces, piece = [], [order[0]]
        for position, index in enumerate(order[1:]):
            if mask >> position & 1:
                pieces.append(piece)
                piece = []
            piece.append(index)
        cuts.append([*pieces, piece])
    return cuts


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("overhead", [0, 5, 30, 1000])
def test_length_pieces_is_the_cheapest_cut(seed, overhead):
    lengths = random_lengths(9, seed)
    pieces = length_pieces(lengths, overhead)
    assert sorted(index for piece in pieces for index in piece) == list(range(9))  # each example once
    longest = [max(lengths[index] for index in piece) for piece in pieces]
    assert longest == sorted(longest, reverse=True)  # longest pieces first, each a run of the sorted batch
    assert all(
        min(lengths[index] for index in piece) >= max(lengths[index] for index in later)
        for number, piece in enumerate(pieces)
        for later in pieces[number + 1 :]
    )
    best = min(cut_cost(lengths, cut, overhead) for cut in every_cut(lengths))
    assert cut_cost(lengths, pieces, overhead) == best


def test_length_pieces_cuts_only_where_padding_outweighs_a_pass():
    assert [len(piece) for piece in length_pieces([3, 3, 3, 3], 0)] == [4]  # nothing to save: one piece
    assert len(length_pieces([90, 5, 5, 5, 5, 5], 1000)) == 1  # a pass costs more than all the padding
    pieces = length_pieces([90, 5, 5, 5, 5, 5], 64)  # one long example padding five short ones to 90: 425 positions
    assert [sorted(piece.tolist()) for piece in pieces] == [[0], [1, 2, 3, 4, 5]]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_wordpiece(
        read_documents([write_corpus(tmp_path_factory.mktemp("corpus"))]), vocab_size=200, min_frequency=1
    )


def encoded(tokenizer, pairs: bool, labels: np.ndarray) -> list[dict]:
    rng = random.Random(0)
    texts = [
        tuple(" ".join(make_sentence(rng, True) for _ in range(rng.randint(1, 3))) for _ in range(1 + pairs))
        for _ in range(len(labels))
    ]
    task = EncodedTask(TaskExamples(texts, labels, [str(i) for i in range(len(labels))]), tokenizer, 40)
    assert len(set(task.lengths)) > 1 and task.lengths == [len(task[i]["input_ids"]) for i in range(len(task))]
    return [task[index] for index in range(len(task))]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize(
    "labels", [np.array([0, 1, 1, 0, 1, 0]), np.array([0.5, 4.0, 2.25, 1.0, 3.0, 0.0], dtype=np.float32)]
)
def test_padding_matches_data_collator_with_padding(tokenizer, padding_side, pairs, labels):
    tokenizer.padding_side = padding_side
    examples = encoded(tokenizer, pairs, labels)
    expected = DataCollatorWithPadding(tokenizer)(examples)
    batch = PaddingCollator(tokenizer)(examples)
    assert sorted(batch) == sorted(expected) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    for key, tensor in expected.items():
        assert batch[key].dtype == tensor.dtype and torch.equal(batch[key], tensor), key
    assert pairs == bool(batch["token_type_ids"].any())  # segment ids of the second sentence are kept
    tokenizer.padding_side = "right"


def test_padding_adds_the_attention_mask_the_model_takes(tokenizer):
    examples = [
        {key: value for key, value in example.items() if key != "attention_mask"}
        for example in encoded(tokenizer, False, np.array([0, 1, 0]))
    ]
    assert torch.equal(
        PaddingCollator(tokenizer)(examples)["attention_mask"],
        DataCollatorWithPadding(tokenizer)(examples)["attention_mask"],
    )


def test_a_note_says_how_many_examples_max_length_cuts(tmp_path):
    """Only examples that reached max_length are tokenised again; the note counts the cut ones and their lengths."""
    from finetune.data.examples import TaskExamples
    from finetune.data.task_encoding import EncodedTask, truncation_note
    from finetune.models.hub import load_tokenizer
    from tests.conftest import save_tiny_masked_lm

    tokenizer = load_tokenizer(str(save_tiny_masked_lm(tmp_path / "bert")))
    texts = ["the film was great ."] * 6 + [" ".join(["the plot was dull ."] * 10)] * 2
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    encoded = EncodedTask(TaskExamples([(text,) for text in texts], None, [str(i) for i in range(8)]), tokenizer, 16)
    assert max(encoded.lengths) == 16
    note = truncation_note(tokenizer, texts, None, encoded.lengths, 16, "dev")
    assert note.startswith("task.max_length 16 cuts 2 of the 8 dev examples (25%) to 16 tokens")
    assert note.endswith(f"longest {max(lengths)}")
    assert truncation_note(tokenizer, texts, None, encoded.lengths, 64, "dev") is None  # nothing reached 64
    pairs = [("the film", "the plot was dull . " * 8)]  # a pair: the longer text is cut, the note counts the pair
    short = EncodedTask(TaskExamples(pairs, None, ["0"]), tokenizer, 12)
    assert "cuts 1 of the 1 training examples" in truncation_note(
        tokenizer, ["the film"], [pairs[0][1]], short.lengths, 12, "training"
    )
