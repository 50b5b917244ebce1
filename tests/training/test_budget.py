"""The step budget: a run with few rows reads them several times an epoch, up to training.min_steps optimizer
steps; given epochs or max_steps win; the sampler reads each pass in its own order."""

from __future__ import annotations

import numpy as np

from finetune.data.sampling import ResumableSampler
from finetune.data.task_batches import LengthGroupedSampler
from finetune.training.budget import FEW_ROWS_EPOCHS, few_steps_note, plan_steps


def test_few_rows_are_read_several_times_an_epoch_up_to_the_minimum():
    plan = plan_steps(rows=32, step_examples=32, epochs=None, max_steps=None, min_steps=200)
    assert (plan.epochs, plan.passes) == (FEW_ROWS_EPOCHS, 40)  # 5 epochs x 40 passes x 1 step = 200 steps
    assert "fewer than training.min_steps 200" in plan.reason


def test_a_budget_that_needs_fewer_passes_than_epochs_runs_one_pass_an_epoch():
    plan = plan_steps(rows=2000, step_examples=32, epochs=None, max_steps=None, min_steps=200)
    assert (plan.epochs, plan.passes) == (4, 1)  # 63 steps a pass: 4 passes reach 200


def test_many_rows_train_one_epoch():
    plan = plan_steps(rows=67_349, step_examples=32, epochs=None, max_steps=None, min_steps=200)
    assert (plan.epochs, plan.passes) == (1, 1)


def test_given_epochs_or_max_steps_or_no_minimum_are_what_the_run_takes():
    plans = [plan_steps(32, 32, 3, None, 200), plan_steps(32, 32, None, 7, 200), plan_steps(32, 32, None, None, None)]
    assert [(plan.epochs, plan.passes) for plan in plans] == [(3, 1), (1, 1), (1, 1)]


def test_a_short_run_is_told_so():
    note = few_steps_note(3)
    assert note is not None and "only 3 optimizer step(s)" in note and "training.min_steps" in note
    assert few_steps_note(50) is None


def test_each_pass_of_an_epoch_has_its_own_order_and_one_pass_keeps_the_old_order():
    single = ResumableSampler(10, seed=3)
    single.set_epoch(2)
    assert list(single) == np.random.default_rng((3, 2)).permutation(10).tolist()  # as before passes existed
    repeated = ResumableSampler(10, seed=3, passes=3)
    repeated.set_epoch(1)
    order = list(repeated)
    assert len(order) == len(repeated) == 30
    passes = [order[index : index + 10] for index in (0, 10, 20)]
    assert all(sorted(one) == list(range(10)) for one in passes)  # every row once a pass
    assert passes[0] != passes[1] != passes[2]
    assert passes[0] == np.random.default_rng((3, 3)).permutation(10).tolist()  # pass 0 of epoch 1: index 3


def test_a_repeated_epoch_resumes_where_it_stopped():
    sampler = ResumableSampler(10, seed=0, passes=2)
    whole = list(sampler)
    sampler.skip(13)
    assert list(sampler) == whole[13:] and len(sampler) == 7


def test_grouped_batches_repeat_their_rows_too():
    lengths = [3, 9, 1, 7, 5, 2]
    sampler = LengthGroupedSampler(lengths, batch_size=2, seed=0, passes=4)
    order = list(sampler)
    assert len(order) == 24 and sorted(order) == sorted(list(range(6)) * 4)
