"""The Python API: the stages called from a notebook or a script, each returning a RunResult (finetune/api/runs.py).

>>> result = finetune.finetune("recipes/quickstart/finetune.yaml", {"training.epochs": 1}, train=frame, dev=dev_frame)
... # doctest: +SKIP
"""

from finetune.api.result import RunResult
from finetune.api.runs import evaluate, finetune, intermediate, multitask, pretrain, ulmfit

__all__ = ["RunResult", "evaluate", "finetune", "intermediate", "multitask", "pretrain", "ulmfit"]
