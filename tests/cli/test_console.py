"""The console: evaluation bars inside an epoch's bar, and the filter of transformers' expected-head load report."""

from __future__ import annotations

import logging

from transformers.utils.loading_report import LoadStateDictInfo

import finetune.console as console_module
from finetune.console import LibraryNoise, phase_bar, progress_bar


def test_an_evaluation_bar_inside_an_epoch_bar_joins_its_display():
    """rich refuses a second live display; a periodic evaluation during an epoch must not start one."""
    with progress_bar(True) as progress:
        epoch = progress.add_task("epoch 1", total=4, status="")
        with phase_bar("evaluating", 3) as advance:
            evaluation = next(task for task in progress.tasks if task.description == "evaluating")
            advance()
            assert evaluation.completed == 1
        assert [task.id for task in progress.tasks] == [epoch]  # the evaluation's line is gone again
    assert console_module._live is None
    with phase_bar("evaluating", 2) as advance:  # on its own, it opens (and closes) its own display
        advance(2)
    assert console_module._live is None


def load_report(missing: set[str], unexpected: set[str] = frozenset()) -> logging.LogRecord:
    """The warning transformers logs after loading weights, built by transformers itself."""
    info = LoadStateDictInfo(
        missing_keys=set(missing),
        unexpected_keys=set(unexpected),
        mismatched_keys=set(),
        error_msgs=[],
        conversion_errors={},
        skipped_pp_keys=set(),
    )
    message = "BertForSequenceClassification LOAD REPORT from: runs/x/checkpoint\n" + info.create_loading_report()
    return logging.LogRecord("transformers.modeling_utils", logging.WARNING, __file__, 1, message, None, None)


def test_a_new_head_on_a_pretrained_backbone_is_not_reported():
    report = load_report(
        {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight"},
        {"cls.predictions.transform.dense.weight", "cls.predictions.bias"},
    )
    assert LibraryNoise().filter(report) is False


def test_missing_backbone_weights_are_still_reported():
    report = load_report({"classifier.weight", "bert.encoder.layer.0.attention.self.query.weight"})
    assert LibraryNoise().filter(report) is True
    other = logging.LogRecord("transformers.modeling_utils", logging.WARNING, __file__, 1, "something else", None, None)
    assert LibraryNoise().filter(other) is True


def test_the_long_sequence_warning_of_whole_documents_is_dropped():
    message = (
        "Token indices sequence length is longer than the specified maximum sequence length for this model "
        "(121 > 64). Running this sequence through the model will result in indexing errors"
    )
    record = logging.LogRecord(
        "transformers.tokenization_utils_base", logging.WARNING, __file__, 1, message, None, None
    )
    assert LibraryNoise().filter(record) is False


def test_phase_bar_advance_takes_an_optional_count():
    with phase_bar("counting", 3, enabled=False) as advance:
        advance()
        advance(2)


def test_a_phase_bar_is_drawn_in_a_notebook_but_not_in_a_log_file(monkeypatch):
    """A notebook is no terminal, but rich draws bars there: the evaluation bars show in Jupyter too."""
    shown = []

    def recording_bar(enabled: bool = True, transient: bool = False):
        shown.append(enabled)
        return progress_bar(False, transient)

    monkeypatch.setattr(console_module, "progress_bar", recording_bar)
    monkeypatch.setattr(console_module.console, "quiet", False)
    monkeypatch.setattr(console_module.console, "_force_terminal", False)  # not a terminal: a log file, a pipe
    for in_a_notebook in (False, True):
        monkeypatch.setattr(console_module.console, "is_jupyter", in_a_notebook)
        with phase_bar("evaluating", 2):
            pass
    assert shown == [False, True]
