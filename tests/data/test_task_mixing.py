"""Multi-task batches (data/task_mixing.py): the sampling rules, one task per optimizer step, every row of a task
once per pass, and an order that a resumed run reads again exactly; and the shared encoder's layer groups
(models/shared_encoder.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

from finetune.data.step_batches import StepBatches
from finetune.data.task_mixing import MixedCollator, MixedTaskOrder, MixedTasks, steps_per_epoch, task_shares
from finetune.models.shared_encoder import MultiTaskModel, share_encoder, shared_layer_groups, shared_parameters

SIZES = [900, 100, 25]


def test_the_three_sampling_rules():
    assert task_shares(SIZES, "proportional") == pytest.approx([900 / 1025, 100 / 1025, 25 / 1025])
    assert task_shares(SIZES, "equal") == pytest.approx([1 / 3] * 3)
    root = np.sqrt(SIZES)  # temperature 2: T5's square root of the sizes, renormalised
    assert task_shares(SIZES, "temperature", 2.0) == pytest.approx(root / root.sum())
    assert task_shares(SIZES, "temperature", 1.0) == pytest.approx(task_shares(SIZES, "proportional"))


def order(shares, seed: int = 0, step: int = 8, steps: int = 400) -> MixedTaskOrder:
    return MixedTaskOrder(SIZES, np.asarray(shares), seed, step, steps)


def test_each_step_is_one_task_and_steps_follow_the_shares():
    mixing = order(task_shares(SIZES, "temperature", 2.0))
    indices = mixing.epoch_order().reshape(400, 8)
    ends = np.cumsum(SIZES)
    tasks = np.searchsorted(ends, indices, side="right")
    assert (tasks == tasks[:, :1]).all()  # every step's 8 examples from one task
    counts = np.bincount(tasks[:, 0], minlength=3) / 400
    assert counts == pytest.approx(task_shares(SIZES, "temperature", 2.0), abs=0.06)  # 400 draws, a fixed seed


def test_a_task_reads_every_row_once_a_pass_before_any_twice():
    mixing = order([0.0, 0.0, 1.0], steps=10)  # only the 25-row task: 80 rows, 3.2 passes over it
    rows = mixing.epoch_order() - (900 + 100)
    for start in range(0, 75, 25):
        assert sorted(rows[start : start + 25].tolist()) == list(range(25))
    mixing.set_epoch(1)  # the next epoch goes on where the stream stopped, no row read twice in its pass
    follow = mixing.epoch_order() - 1000
    assert sorted([*rows[75:].tolist(), *follow[:20].tolist()]) == list(range(25))


def test_the_order_is_the_seed_and_epoch_s_and_a_resume_reads_the_rest():
    shares = task_shares(SIZES, "proportional")
    first, again, other = order(shares).epoch_order(), order(shares).epoch_order(), order(shares, seed=1).epoch_order()
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    resumed = order(shares)
    resumed.skip_batches(10, 8)  # ten batches of 8 done
    assert list(resumed) == first[80:].tolist() and len(resumed) == len(first) - 80


def test_step_batches_never_mix_tasks_on_two_processes_with_accumulation():
    mixing = MixedTaskOrder(SIZES, task_shares(SIZES, "equal"), 3, 2 * 2 * 2, steps_per_epoch(SIZES, 8))
    ends = np.cumsum(SIZES)
    batches = list(StepBatches(mixing, batch_size=2, processes=2, accumulation=2))
    assert len(batches) == len(StepBatches(mixing, 2, 2, 2)) == steps_per_epoch(SIZES, 8) * 4
    for step in range(0, len(batches), 4):  # the 4 micro-batches of a step (2 processes x 2 accumulated)
        tasks = {
            int(np.searchsorted(ends, index, side="right")) for batch in batches[step : step + 4] for index in batch
        }
        assert len(tasks) == 1


def test_a_mixed_batch_is_collated_by_its_task_s_collator():
    mixed = MixedTasks([["a0", "a1"], ["b0", "b1", "b2"]])
    assert len(mixed) == 5 and mixed[1] == (0, "a1") and mixed[2] == (1, "b0")
    collate = MixedCollator([lambda items: {"a": items}, lambda items: {"b": items}])
    assert collate([mixed[2], mixed[4]]) == {"b": ["b0", "b2"], "task": 1}
    with pytest.raises(RuntimeError, match="mixes tasks"):
        collate([mixed[0], mixed[2]])


def tiny_models():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    return [
        BertForSequenceClassification(config),
        BertForTokenClassification(BertConfig(**config.to_dict(), num_labels=5)),
    ]


def test_the_tasks_share_the_encoder_and_the_heads_make_the_top_group():
    classifier, tagger = tiny_models()
    assert share_encoder([classifier, tagger]) == sum(p.numel() for p in tagger.bert.parameters())
    assert classifier.bert.encoder is tagger.bert.encoder and classifier.bert.embeddings is tagger.bert.embeddings
    assert classifier.bert.pooler is not None and tagger.bert.pooler is None  # a pooler only one reads stays its own
    groups = shared_layer_groups([classifier, tagger])
    everything = {id(p) for model in (classifier, tagger) for p in model.parameters()}
    assert sorted(id(p) for group in groups for p in group) == sorted(everything)  # each parameter once
    top = {id(p) for p in groups[-1]}
    assert {
        id(classifier.classifier.weight),
        id(tagger.classifier.weight),
        id(classifier.bert.pooler.dense.weight),
    } <= top
    shared = {id(p) for p in shared_parameters([classifier, tagger])}
    assert all(id(p) in shared for group in groups[:-1] for p in group)  # the lower groups: the encoder's alone


def test_a_resumable_state_holds_each_shared_tensor_once_and_loads_back():
    models = tiny_models()
    share_encoder(models)
    wrapper = MultiTaskModel(models)
    state = wrapper.state_dict()
    assert not any(name.startswith("tasks.1.bert.encoder") for name in state)
    assert "tasks.0.bert.encoder.layer.0.attention.self.query.weight" in state and "tasks.1.classifier.weight" in state
    changed = {name: tensor + 1 for name, tensor in state.items()}
    wrapper.load_state_dict(changed)
    assert torch.equal(models[1].bert.encoder.layer[0].attention.self.query.weight,
                       changed["tasks.0.bert.encoder.layer.0.attention.self.query.weight"])  # fmt: skip
    with pytest.raises(RuntimeError, match="missing"):
        wrapper.load_state_dict({name: tensor for name, tensor in changed.items() if "classifier" not in name})
