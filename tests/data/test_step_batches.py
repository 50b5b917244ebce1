"""StepBatches under accelerate's own sharding: every example once an epoch, each step the same examples on P
processes."""

from __future__ import annotations

import pytest
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from finetune.data.sampling import ResumableSampler
from finetune.data.step_batches import PADDING, REAL_EXAMPLES, CountingCollator, PaddableDataset, StepBatches


def process_batches(examples: int, batch_size: int, processes: int, accumulation: int, epoch: int = 1):
    """Each process's micro-batches of one epoch, as (indices, real count), after accelerate's sharding."""
    order = ResumableSampler(examples, seed=3)
    shards = []
    for process in range(processes):
        batches = StepBatches(order, batch_size, processes, accumulation)
        loader = DataLoader(
            PaddableDataset(list(range(examples))),
            batch_sampler=batches,
            collate_fn=CountingCollator(lambda items: {"indices": items}),
        )
        loader = prepare_data_loader(loader, num_processes=processes, process_index=process, put_on_device=False)
        loader.set_epoch(epoch)  # as the stage does: accelerate passes it on to the order
        shards.append([(batch["indices"], batch[REAL_EXAMPLES]) for batch in loader])
        assert len(shards[-1]) == len(loader), "the loader's length must be what it yields (it sets the step count)"
    order.set_epoch(epoch)
    return shards, list(order)


@pytest.mark.parametrize("processes", [1, 2, 3])
@pytest.mark.parametrize(("batch_size", "accumulation"), [(8, 1), (4, 2), (1, 3)])
@pytest.mark.parametrize("examples", [1, 2, 7, 33, 48, 49])
def test_each_example_once_and_each_step_as_on_one_process(examples, batch_size, processes, accumulation):
    shards, order = process_batches(examples, batch_size, processes, accumulation)
    # Every process takes part in every micro-batch (DDP's all-reduce needs all of them), none empty.
    assert len({len(shard) for shard in shards}) == 1
    assert all(indices for shard in shards for indices, _ in shard)
    # A batch is all real or a single padding example that counts zero times.
    for shard in shards:
        for indices, real in shard:
            assert (indices == [0] and real == 0) or real == len(indices), (indices, real)
    real_indices = [index for shard in shards for indices, real in shard if real for index in indices]
    assert sorted(real_indices) == list(range(examples)), "an example was left out or came twice"
    # Optimizer step k on P processes holds exactly the examples of step k on 1 process with a P times larger batch.
    global_step = batch_size * processes * accumulation
    micro_batches = len(shards[0])
    for step, start in enumerate(range(0, micro_batches, accumulation)):
        held = sorted(
            index
            for shard in shards
            for indices, real in shard[start : start + accumulation]
            if real
            for index in indices
        )
        assert held == sorted(order[step * global_step : (step + 1) * global_step]), f"step {step}"


def test_one_process_batches_are_the_order_cut_in_batch_size():
    """With one process nothing changes: consecutive batches of batch_size, the last one short."""
    (shard,), order = process_batches(19, 8, processes=1, accumulation=1)
    assert [indices for indices, _ in shard] == [order[0:8], order[8:16], order[16:19]]


def test_a_tail_shorter_than_the_processes_gets_a_padding_batch():
    """33 = 2 x 16 + 1: the last step has one example for two processes; the other runs a zero-weight copy."""
    shards, order = process_batches(33, 8, processes=2, accumulation=1)
    assert [shard[-1] for shard in shards] == [([order[32]], 1), ([0], 0)]
    assert list(StepBatches(order, 8, 2))[-1] == [PADDING]


def test_the_padding_item_is_the_first_example_marked_unreal():
    dataset = PaddableDataset(["first", "second"])
    assert dataset[PADDING] == ("first", False) and dataset[1] == ("second", True) and len(dataset) == 2


def test_a_split_batch_is_its_pieces_each_counted():
    """With `pieces`, a batch comes as one collated batch per piece, each with its own count of real examples."""
    seen = []

    def two_pieces(items: list) -> list[list[int]]:
        seen.append(items)
        return [[2, 0], [1]]

    collator = CountingCollator(lambda items: {"items": items}, pieces=two_pieces)
    pieces = collator([(5, True), (3, True), (7, True)])
    assert seen == [[5, 3, 7]]  # the batch's items, in order
    assert pieces == [{"items": [7, 5], REAL_EXAMPLES: 2}, {"items": [3], REAL_EXAMPLES: 1}]
    padding = CountingCollator(lambda items: {"items": items}, pieces=lambda items: [[0]])
    assert padding([(5, False)]) == [{"items": [5], REAL_EXAMPLES: 0}]  # a padding batch still counts 0 times
