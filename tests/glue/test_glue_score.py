"""The GLUE score under each convention, against a worked example computed by hand."""

from __future__ import annotations

import pytest

from finetune.glue.score import CONVENTIONS, glue_score, glue_scores
from finetune.glue.specs import GLUE_TASKS

# BERT-base's GLUE test scores: BERT paper Table 1 (MNLI-m/mm, QQP F1, QNLI, SST-2, CoLA, STS-B Spearman, MRPC F1,
# RTE), completed with the leaderboard's other metrics for this example (MRPC/QQP accuracy, STS-B Pearson, WNLI).
PERCENT = {
    "cola": {"mcc": 52.1, "accuracy": 80.0},
    "sst2": {"accuracy": 93.5},
    "mrpc": {"f1": 88.9, "accuracy": 84.8},
    "stsb": {"pearson": 87.1, "spearman": 85.8},
    "qqp": {"f1": 71.2, "accuracy": 89.2},
    "mnli": {"accuracy": 84.6},
    "mnli-mm": {"accuracy": 83.4},
    "qnli": {"accuracy": 90.5},
    "rte": {"accuracy": 66.4},
    "wnli": {"accuracy": 65.1},
}
SCORES = {task: {metric: value / 100 for metric, value in metrics.items()} for task, metrics in PERCENT.items()}


def test_leaderboard_convention_by_hand():
    # CoLA 52.1 (MCC only); SST-2 93.5; MRPC (88.9 + 84.8) / 2 = 86.85; STS-B (87.1 + 85.8) / 2 = 86.45;
    # QQP (71.2 + 89.2) / 2 = 80.2; MNLI (84.6 + 83.4) / 2 = 84.0; QNLI 90.5; RTE 66.4; WNLI 65.1
    # sum 705.1 over 9 tasks
    score = glue_scores(SCORES)["leaderboard"]
    assert score["score"] == pytest.approx(705.1 / 9 / 100)
    assert score["components"]["MRPC"] == pytest.approx(0.8685)
    assert score["components"]["MNLI"] == pytest.approx(0.84)
    assert list(score["components"]) == ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
    assert score["missing"] == []


def test_bert_paper_convention_reproduces_table_one():
    # 84.6 + 83.4 + 71.2 + 90.5 + 93.5 + 52.1 + 85.8 + 88.9 + 66.4 = 716.4; / 9 = 79.6, the paper's "Average"
    score = glue_scores(SCORES)["bert-paper"]
    assert score["score"] == pytest.approx(0.796)
    assert "WNLI" not in score["components"] and len(score["components"]) == 9


def test_one_metric_per_task_convention_by_hand():
    # 52.1 + 93.5 + 88.9 (MRPC F1) + 87.1 (STS-B Pearson) + 71.2 (QQP F1) + 84.6 + 83.4 + 90.5 + 66.4 + 65.1 = 782.8
    score = glue_scores(SCORES)["one-metric-per-task"]
    assert score["score"] == pytest.approx(0.7828)
    assert score["components"]["STS-B"] == pytest.approx(0.871)


def test_missing_task_gives_no_score_but_lists_it():
    without_wnli = {task: metrics for task, metrics in SCORES.items() if task != "wnli"}
    scores = glue_scores(without_wnli)
    assert scores["leaderboard"]["score"] is None and scores["leaderboard"]["missing"] == ["WNLI"]
    assert scores["leaderboard"]["mean_of_present"] == pytest.approx((705.1 - 65.1) / 8 / 100)
    assert scores["bert-paper"]["score"] == pytest.approx(0.796)  # WNLI is not part of it
    assert scores["one-metric-per-task"]["missing"] == ["WNLI"]


def test_half_of_a_two_task_component_is_missing():
    without_mismatched = {task: metrics for task, metrics in SCORES.items() if task != "mnli-mm"}
    score = glue_scores(without_mismatched)
    assert score["leaderboard"]["missing"] == ["MNLI"] and "MNLI" not in score["leaderboard"]["components"]
    assert score["bert-paper"]["missing"] == ["MNLI-mm"] and "MNLI-m" in score["bert-paper"]["components"]


def test_nothing_present():
    score = glue_score(CONVENTIONS[0], {})
    assert score["score"] is None and score["mean_of_present"] is None and len(score["missing"]) == 9


def test_conventions_name_real_tasks_and_metrics():
    for convention in CONVENTIONS:
        for component in convention.components:
            for task, metric in component.parts:
                assert metric in GLUE_TASKS[task].metrics, (convention.name, task, metric)
        assert "ax" not in {task for component in convention.components for task, _ in component.parts}
