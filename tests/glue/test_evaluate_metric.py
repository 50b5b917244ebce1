"""The shipped `evaluate` module gives exactly finetune/tasks/metrics.py's results, loaded offline from its file."""

from __future__ import annotations

import numpy as np
import pytest

evaluate = pytest.importorskip("evaluate", reason="the evaluate package is a declared dependency; not installed")

from finetune.glue.evaluate_metric import MODULE_PATH  # noqa: E402  (imported only once importorskip found evaluate)
from finetune.glue.specs import GLUE_TASKS  # noqa: E402  (imported only once importorskip found evaluate)
from finetune.tasks.metrics import compute_metrics  # noqa: E402  (imported only once importorskip found evaluate)


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No hub: the module must load from its file alone (a network call would fail here)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))


def random_outputs(task: str, count: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    spec = GLUE_TASKS[task]
    if spec.is_regression:
        references = rng.uniform(0, 5, count)
        return references + rng.normal(0, 1, count), references
    references = rng.integers(0, spec.num_labels, count)
    predictions = np.where(rng.random(count) < 0.7, references, rng.integers(0, spec.num_labels, count))
    return predictions, references


@pytest.mark.parametrize("task", ["cola", "sst2", "mrpc", "stsb", "mnli", "rte"])
def test_results_equal_the_toolkits_metrics(task):
    predictions, references = random_outputs(task)
    metric = evaluate.load(MODULE_PATH, task)
    got = metric.compute(predictions=predictions.tolist(), references=references.tolist())
    expected = compute_metrics(GLUE_TASKS[task], predictions, references)
    assert set(got) == set(GLUE_TASKS[task].metrics) == set(expected)
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-6), name  # stsb goes through float32 features
    assert 0 < abs(next(iter(got.values()))) <= 1


def test_batches_add_up_to_one_computation():
    predictions, references = random_outputs("mrpc", seed=1)
    metric = evaluate.load(MODULE_PATH, "mrpc")
    for start in range(0, 200, 64):
        metric.add_batch(
            predictions=predictions[start : start + 64].tolist(), references=references[start : start + 64].tolist()
        )
    assert metric.compute() == pytest.approx(compute_metrics(GLUE_TASKS["mrpc"], predictions, references))


def test_an_unknown_task_is_named():
    with pytest.raises(KeyError, match="unknown GLUE task 'sst3'"):
        evaluate.load(MODULE_PATH, "sst3")
