"""A task stage's training order follows training.group_by_length and training.group_chunk_batches; its batches
are cut into pieces of similar length with training.split_by_length, where the kind's batches can be."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from finetune.data.sampling import ResumableSampler
from finetune.data.step_batches import REAL_EXAMPLES
from finetune.data.task_batches import LengthGroupedSampler
from finetune.kinds.fine_tuning import TaskFineTuning
from finetune.kinds.head_training import HeadTrainingJob
from finetune.recipes.base import TrainingConfig
from finetune.training.budget import StepPlan


class Examples(list):
    """Encoded examples (token rows) with their `lengths`, as an encoded task gives them."""

    @property
    def lengths(self) -> list[int]:
        return [len(example["input_ids"]) for example in self]


def training_loader(splits: bool = True, note: str | None = None, skips_padding: bool = False, **training):
    """The stage and loader `_training_batches` gives a stage whose recipe has these training keys (batch 4,
    2 processes), over 100 examples of random length whose kind can (`splits`) or cannot be split, on a model that
    computes its real tokens only (`skips_padding`) or pads."""
    stage = SimpleNamespace(
        skips_padding=skips_padding,
        plan=StepPlan(epochs=1, passes=1, reason="one epoch"),  # each row once an epoch
        recipe=SimpleNamespace(seed=3, training=TrainingConfig(batch_size=4, **training)),
        accelerator=SimpleNamespace(num_processes=2),
        tokenizer=SimpleNamespace(model_input_names=["input_ids"]),
        spec=SimpleNamespace(kind="choices"),
        splits_by_length=lambda train_data: splits,
        batching_note=lambda grouped: note if grouped else None,
    )
    stage.step_examples = lambda: HeadTrainingJob.step_examples(
        stage
    )  # the job's own: batch x processes x accumulation
    lengths = np.random.default_rng(0).integers(1, 400, size=100).tolist()
    examples = Examples({"input_ids": [7] * length} for length in lengths)
    loader = TaskFineTuning._training_batches(
        stage, examples, lambda items: {"rows": [item["input_ids"] for item in items]}
    )
    assert loader.batch_sampler.sampler is stage.order  # the order the loader reads (and a resume skips in)
    return stage, loader, lengths


def training_order(**training):
    """The order `_training_batches` gives a stage whose recipe has these training keys."""
    stage, _, lengths = training_loader(**training)
    return stage.order, lengths


def test_by_default_a_model_that_pads_gets_grouping_in_chunks_of_50_batches_of_the_whole_step():
    order, lengths = training_order()
    assert isinstance(order, LengthGroupedSampler) and order.chunk_batches == 50 and order.batch_size == 8
    assert list(order) == list(LengthGroupedSampler(lengths, 8, 3))  # the order before the key existed


def test_by_default_a_model_that_skips_padding_gets_shuffled_batches_unless_grouping_is_asked():
    assert type(training_order(skips_padding=True)[0]) is ResumableSampler
    assert isinstance(training_order(skips_padding=True, group_by_length=True)[0], LengthGroupedSampler)


@pytest.mark.parametrize("chunk_batches", [1, 2, 8])
def test_group_chunk_batches_reaches_the_sampler(chunk_batches):
    order, lengths = training_order(group_chunk_batches=chunk_batches)
    assert order.chunk_batches == chunk_batches
    assert list(order) == list(LengthGroupedSampler(lengths, 8, 3, chunk_batches))


def test_without_grouping_the_chunk_plays_no_part():
    order, _ = training_order(group_by_length=False, group_chunk_batches=2)
    assert type(order) is ResumableSampler


def test_split_by_length_cuts_each_batch_into_pieces_of_its_own_examples():
    split = list(training_loader(group_by_length=False, split_by_length=True)[1])
    whole = list(training_loader(group_by_length=False)[1])
    assert len(split) == len(whole)  # the same micro-batches (the step count and a resume's position stand)
    for pieces, batch in zip(split, whole, strict=True):
        assert isinstance(pieces, list) and isinstance(batch, dict)
        rows = [row for piece in pieces for row in piece["rows"]]
        assert sorted(map(len, rows)) == sorted(len(row) for row in batch["rows"])
        assert sum(piece[REAL_EXAMPLES] for piece in pieces) == batch[REAL_EXAMPLES]
    assert max(len(pieces) for pieces in split) > 1, "no batch was cut: the test would prove nothing"


def test_a_kind_that_cannot_split_says_so_and_keeps_whole_batches(capsys):
    _, loader, _ = training_loader(splits=False, split_by_length=True)
    assert all(isinstance(batch, dict) for batch in loader)
    assert "training.split_by_length: choices batches stay whole" in capsys.readouterr().err


def test_a_model_that_skips_padding_keeps_whole_batches_and_says_why(capsys):
    _, loader, _ = training_loader(skips_padding=True, group_by_length=False, split_by_length=True)
    assert all(isinstance(batch, dict) for batch in loader)
    printed = capsys.readouterr().err
    assert "batches stay whole (the model computes their real tokens only" in printed
    assert "batches of 4, shuffled; the model computes their real tokens only (training.skip_padding)" in printed


@pytest.mark.parametrize(
    ("training", "line"),
    [
        ({}, "batches of 4, grouped by length (chunks of 50 batches)"),
        ({"group_by_length": False}, "batches of 4, shuffled"),
        (
            {"group_by_length": False, "split_by_length": True},
            "batches of 4, shuffled, each cut into pieces of similar",
        ),
    ],
)
def test_the_run_says_how_it_batches(capsys, training, line):
    training_loader(**training)
    printed = capsys.readouterr().err
    assert line in printed and ("cut into pieces" in printed) == training.get("split_by_length", False)


def test_the_kinds_note_on_batching_is_printed_for_the_batching_it_gets(capsys):
    training_loader(note="grouped batches: what they cost this kind")
    assert "grouped batches: what they cost this kind" in capsys.readouterr().err
    training_loader(note="grouped batches: what they cost this kind", skips_padding=True)  # shuffled by default
    assert "grouped batches" not in capsys.readouterr().err
