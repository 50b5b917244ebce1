"""The GLUE metrics as a Hugging Face `evaluate` module, computed by finetune/tasks/metrics.py.

    import evaluate
    from finetune.glue.evaluate_metric import MODULE_PATH
    metric = evaluate.load(MODULE_PATH, "mrpc")          # a local file: no network
    metric.compute(predictions=[1, 0, 1], references=[1, 1, 1])   # {'accuracy': 0.667, 'f1': 0.8}

The configuration is a task name of finetune/glue/specs.py (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli,
...). Results are those `finetune eval` reports, under the same names: accuracy, f1 (of class 1), mcc, pearson,
spearman; the hub's `glue` metric calls the last three matthews_correlation, pearson and spearmanr. Predictions
are class indices (scores for stsb), as are references; `add_batch` collects them batch by batch.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import evaluate
import numpy as np

from finetune.glue.specs import GLUE_TASKS
from finetune.tasks.metrics import compute_metrics

MODULE_PATH = str(Path(__file__).resolve())  # what evaluate.load takes

_DESCRIPTION = "GLUE task metrics (accuracy, F1, Matthews correlation, Pearson/Spearman) as finetune computes them."
_INPUTS = """
Args:
    predictions: class indices, or real-valued scores for a regression task (stsb).
    references: the gold class indices or scores, in the same order.
Returns:
    every metric of the task, e.g. {"accuracy": ..., "f1": ...} for mrpc, {"mcc": ...} for cola.
"""
_CITATION = """@inproceedings{wang2019glue,
  title={GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class FinetuneGlue(evaluate.Metric):
    """One GLUE task's metrics; the task is the configuration name given to evaluate.load."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in GLUE_TASKS:
            raise KeyError(f"unknown GLUE task {self.config_name!r}; choose one of: {', '.join(sorted(GLUE_TASKS))}")
        kind = "float32" if GLUE_TASKS[self.config_name].is_regression else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value(kind), "references": datasets.Value(kind)}),
            reference_urls=["https://gluebenchmark.com/"],
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return compute_metrics(GLUE_TASKS[self.config_name], np.asarray(predictions), np.asarray(references))
