"""A task stage's training order follows training.group_by_length and training.group_chunk_batches."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from finetune.data.sampling import ResumableSampler
from finetune.data.task_batches import LengthGroupedSampler
from finetune.kinds.stage import TaskStage
from finetune.recipes.base import TrainingConfig


class Lengths(list):
    """Examples that are their own lengths, as an encoded task's `lengths` gives them."""

    @property
    def lengths(self) -> list[int]:
        return list(self)


def training_order(**training):
    """The order `_training_batches` gives a stage whose recipe has these training keys (batch 4, 2 processes)."""
    stage = SimpleNamespace(
        recipe=SimpleNamespace(seed=3, training=TrainingConfig(batch_size=4, **training)),
        accelerator=SimpleNamespace(num_processes=2),
    )
    lengths = Lengths(np.random.default_rng(0).integers(1, 40, size=100).tolist())
    loader = TaskStage._training_batches(stage, lengths, lambda items: items)
    assert loader.batch_sampler.sampler is stage.order  # the order the loader reads (and a resume skips in)
    return stage.order, lengths


def test_the_default_is_todays_grouping_in_chunks_of_50_batches_of_the_whole_step():
    order, lengths = training_order()
    assert isinstance(order, LengthGroupedSampler) and order.chunk_batches == 50 and order.batch_size == 8
    assert list(order) == list(LengthGroupedSampler(lengths, 8, 3))  # the order before the key existed


@pytest.mark.parametrize("chunk_batches", [1, 2, 8])
def test_group_chunk_batches_reaches_the_sampler(chunk_batches):
    order, lengths = training_order(group_chunk_batches=chunk_batches)
    assert order.chunk_batches == chunk_batches
    assert list(order) == list(LengthGroupedSampler(lengths, 8, 3, chunk_batches))


def test_without_grouping_the_chunk_plays_no_part():
    order, _ = training_order(group_by_length=False, group_chunk_batches=2)
    assert type(order) is ResumableSampler
