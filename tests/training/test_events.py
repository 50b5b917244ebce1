"""training/events.py: subscribers hear the events they handle, in order, and steer the run through its Control;
the run's subscribers are lined up in the order the driver documents."""

from __future__ import annotations

import pytest

from finetune.training.events import Control, Events, TrainingEvents
from finetune.training.keep_best import EarlyStopping, KeepBest
from finetune.training.state import BestSoFar, TrainingState


class Loop:
    step = 0


class Recorder(TrainingEvents):
    def __init__(self, name: str, heard: list):
        self.name, self.heard = name, heard

    def on_step_begin(self, loop, control, epoch):
        self.heard.append((self.name, "step", loop.step, epoch))

    def on_evaluate(self, loop, control, scores, record):
        self.heard.append((self.name, "evaluate", dict(record)))
        record[self.name] = True  # a later subscriber sees what an earlier one added


def test_subscribers_hear_their_events_in_order_and_nothing_else():
    heard: list = []
    events = Events([Recorder("a", heard), TrainingEvents(), Recorder("b", heard)])
    events.fire("on_step_begin", Loop(), 3)
    record: dict = {"dev_accuracy": 0.5}
    events.evaluated(Loop(), {"dev_accuracy": 0.5}, record)
    events.fire("on_train_end", Loop())  # no one handles it: nothing happens
    assert heard == [
        ("a", "step", 0, 3),
        ("b", "step", 0, 3),
        ("a", "evaluate", {"dev_accuracy": 0.5}),
        ("b", "evaluate", {"dev_accuracy": 0.5, "a": True}),
    ]
    assert record == {"dev_accuracy": 0.5, "a": True, "b": True}


def test_an_unknown_event_is_an_error_not_silence():
    with pytest.raises(AttributeError):
        Events([TrainingEvents()]).fire("on_stepp_begin", Loop())


def test_a_subscriber_that_raises_stops_the_event_there():
    heard: list = []

    class Stop(TrainingEvents):
        def on_step_begin(self, loop, control, epoch):
            raise RuntimeError("pruned")

    with pytest.raises(RuntimeError, match="pruned"):
        Events([Stop(), Recorder("after", heard)]).fire("on_step_begin", Loop(), 0)
    assert heard == []


def test_keep_best_marks_new_bests_and_early_stopping_stops_after_patience():
    best = BestSoFar("dev_accuracy", patience=2)
    new_bests: list[int] = []

    class Saver(TrainingEvents):
        def on_new_best(self, loop, control):
            new_bests.append(loop.step)

    events, loop, records = Events([KeepBest(best), EarlyStopping(best), Saver()]), Loop(), []
    for step, accuracy in ((1, 0.5), (2, 0.7), (3, 0.6), (4, 0.65)):
        loop.step = step
        record: dict = {}
        events.evaluated(loop, {"dev_accuracy": accuracy}, record)
        records.append((record["best_so_far"], events.control.should_stop))
    assert new_bests == [1, 2]
    assert records == [(True, False), (True, False), (False, False), (False, True)]
    assert events.control.new_best is False  # reset once on_new_best was fired


def test_keep_best_and_early_stopping_carry_through_a_resume():
    best = BestSoFar("dev_accuracy", patience=1)
    events, loop = Events([KeepBest(best), EarlyStopping(best)]), Loop()
    for step, accuracy in ((1, 0.7), (2, 0.6)):
        loop.step = step
        events.evaluated(loop, {"dev_accuracy": accuracy}, {})
    state = TrainingState()
    events.fire("on_save", loop, state)
    resumed_best = BestSoFar("dev_accuracy", patience=1)
    resumed = Events([KeepBest(resumed_best), EarlyStopping(resumed_best)])
    resumed.fire("on_restore", loop, state)
    assert (resumed_best.step, resumed_best.scores) == (1, {"dev_accuracy": 0.7})
    assert resumed.control.should_stop  # patience ran out before the checkpoint


def test_control_starts_with_nothing_asked():
    assert Control() == Control(should_stop=False, new_best=False)
