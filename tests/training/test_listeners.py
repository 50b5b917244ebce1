"""The evaluation hook: listeners hear every evaluation of the runs inside their block, and can stop a run."""

from __future__ import annotations

import pytest

from finetune.training.listeners import evaluations_reported_to, report_evaluation


def test_listeners_hear_evaluations_only_inside_their_block_and_nest():
    heard: list[tuple[str, int]] = []
    report_evaluation(1, {"dev_accuracy": 0.5})  # nobody listens: nothing happens
    with evaluations_reported_to(lambda step, record: heard.append(("outer", step))):
        report_evaluation(2, {})
        with evaluations_reported_to(lambda step, record: heard.append(("inner", step))):
            report_evaluation(3, {})
        report_evaluation(4, {})
    report_evaluation(5, {})
    assert heard == [("outer", 2), ("outer", 3), ("inner", 3), ("outer", 4)]


def test_a_listener_that_raises_stops_the_reporting_caller():
    class Stop(Exception):
        pass

    def stop(step, record):
        raise Stop

    with evaluations_reported_to(stop), pytest.raises(Stop):
        report_evaluation(1, {"dev_accuracy": 0.1})
