"""Causal-LM data: next-token blocks, ULMFiT's BPTT streams, the resumable order, and the carried LSTM state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune.data.causal import BPTTBatches, NextTokenBlocks
from finetune.data.corpus import TokenizedDocuments, pack_blocks
from finetune.data.sampling import ResumableSampler
from finetune.errors import UserError
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.causal_lm import RecurrentNextTokenLM

SEPARATOR = 0


def documents(count: int = 30, seed: int = 0) -> TokenizedDocuments:
    """Documents of 3-9 tokens with ids that say where they come from: 100 * (document + 1) + position."""
    rng = np.random.default_rng(seed)
    return TokenizedDocuments.from_lists(
        [[100 * (index + 1) + position for position in range(rng.integers(3, 10))] for index in range(count)]
    )


def test_next_token_blocks_label_each_position_with_the_following_token():
    blocks = pack_blocks(documents(), 9, SEPARATOR)  # block_size + 1 tokens: 8 inputs, 8 labels
    item = NextTokenBlocks(blocks)[2]
    assert item["input_ids"].shape == item["labels"].shape == (8,)
    assert torch.equal(item["input_ids"][1:], item["labels"][:-1])
    assert item["labels"][-1] == blocks[2][-1]


def test_bptt_rows_continue_from_batch_to_batch_and_labels_are_the_next_tokens():
    data = BPTTBatches(documents(), SEPARATOR, batch_size=4, bptt=5, seed=0, shuffle=False)
    stream = np.insert(documents().ids, documents().offsets[1:], SEPARATOR)
    rows = stream[: 4 * data.row_length].reshape(4, data.row_length)
    assert len(data) == (data.row_length - 1) // 5
    for index in range(len(data)):
        batch = data[index]
        assert batch["input_ids"].shape == (4, 5)
        assert np.array_equal(batch["input_ids"].numpy(), rows[:, index * 5 : index * 5 + 5])
        assert np.array_equal(batch["labels"].numpy(), rows[:, index * 5 + 1 : index * 5 + 6])
    with pytest.raises(IndexError):
        data[len(data)]


def test_bptt_epochs_shuffle_documents_but_keep_every_token():
    first, second = (BPTTBatches(documents(), SEPARATOR, 2, 4, seed=3) for _ in range(2))
    second.set_epoch(1)
    assert not np.array_equal(first.rows(), second.rows())
    # Same documents in another order: only the tokens of the cut-off tail (< one row's worth) may differ.
    tail = len(documents().ids) + len(documents()) - first.rows().size
    differing = set(first.rows().ravel().tolist()) ^ set(second.rows().ravel().tolist())
    assert len(differing) <= 2 * tail
    assert np.array_equal(first.rows(), BPTTBatches(documents(), SEPARATOR, 2, 4, seed=3).rows())  # seeded


def test_bptt_processes_read_disjoint_rows_that_together_are_the_single_process_batch():
    whole = BPTTBatches(documents(), SEPARATOR, batch_size=4, bptt=3, seed=0)
    parts = [
        BPTTBatches(documents(), SEPARATOR, batch_size=2, bptt=3, seed=0, process_index=rank, num_processes=2)
        for rank in range(2)
    ]
    assert np.array_equal(np.concatenate([part.rows() for part in parts]), whole.rows())


def test_bptt_too_short_a_text_names_it():
    with pytest.raises(UserError, match=r"the validation text has .* tokens, too few for 64 rows"):
        BPTTBatches(documents(3), SEPARATOR, batch_size=64, bptt=70, seed=0, name="the validation text")
    assert BPTTBatches.rows_that_fit(documents(3), 5, 1, wanted=64) == (len(documents(3).ids) + 3) // 6


def test_resumable_sampler_is_seeded_per_epoch_and_skips_from_the_epoch_start():
    sampler = ResumableSampler(10, seed=1)
    epoch_0 = list(sampler)
    sampler.set_epoch(1)
    epoch_1 = list(sampler)
    assert sorted(epoch_0) == sorted(epoch_1) == list(range(10)) and epoch_0 != epoch_1
    sampler.skip(4)
    assert list(sampler) == epoch_1[4:] and len(sampler) == 6
    sampler.set_epoch(1)  # the same epoch again (accelerate does this at each iteration): the skip stays
    assert list(sampler) == epoch_1[4:]
    sampler.set_epoch(2)
    assert len(list(sampler)) == 10
    assert list(ResumableSampler(5, seed=1, shuffle=False)) == [0, 1, 2, 3, 4]


def tiny_lstm() -> RecurrentNextTokenLM:
    torch.manual_seed(0)
    config = AWDLSTMConfig(vocab_size=20, embedding_size=8, hidden_size=12, num_layers=2, pad_token_id=1)
    return RecurrentNextTokenLM(AWDLSTMForCausalLM(config)).eval()


def test_recurrent_wrapper_carries_the_state_and_validation_does_not_disturb_it():
    model = tiny_lstm()
    stream = torch.randint(2, 20, (2, 13))
    whole_loss, _, _ = model(stream[:, :12], stream[:, 1:13])
    model.state = None
    first, _, _ = model(stream[:, :6], stream[:, 1:7])
    carried = model.state
    second, _, _ = model(stream[:, 6:12], stream[:, 7:13])
    # Reading in two halves with the carried state is reading the whole: truncated BPTT loses no context.
    assert torch.allclose((first + second) / 2, whole_loss, atol=1e-6)
    assert all(not tensor.requires_grad for pair in carried for tensor in pair)
    before = model.state
    with model.fresh_state():
        assert model.state is None
        model(stream[:, :6], stream[:, 1:7])
    assert model.state is before
    saved = model.carried_state()
    assert sorted(saved) == ["cell_0", "cell_1", "hidden_0", "hidden_1"]
    model.state = None
    model.restore_carried_state(saved)
    assert all(torch.equal(a, b) for pair_a, pair_b in zip(model.state, before) for a, b in zip(pair_a, pair_b))
