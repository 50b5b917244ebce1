"""finetune: transfer learning for NLP in the line of ULMFiT, GPT and BERT.

From Python (a notebook): `finetune.pretrain`, `finetune.finetune`, `finetune.ulmfit`, `finetune.intermediate`,
`finetune.multitask` and `finetune.evaluate` run the stages as the CLI does and return a `finetune.RunResult`
(finetune/api/); `finetune.predict` labels texts. Importing the package imports none of the libraries they need:
each is loaded when first used.
"""

import os
from typing import Any

from finetune._version import __version__

# finetune/api/, imported when first asked for
_API = ("RunResult", "evaluate", "finetune", "intermediate", "multitask", "pretrain", "ulmfit")

__all__ = [
    "RunResult", "__version__", "evaluate", "finetune", "intermediate", "multitask", "predict", "pretrain", "ulmfit"
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The Python API's functions, imported on first use (docs/python.md)."""
    if name in _API:
        from finetune import api

        return getattr(api, name)
    raise AttributeError(f"module 'finetune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


def predict(checkpoint: str | os.PathLike, texts, batch_size: int = 64) -> list[dict]:
    """Labels and probabilities (or scores) of a fine-tuned checkpoint for raw texts; see finetune.commands.predict.

    >>> finetune.predict("runs/quickstart/finetune/checkpoint", ["a warm , funny film"])  # doctest: +SKIP
    [{'label': ..., 'probabilities': {'0': ..., '1': ...}}]
    """
    from finetune.commands.predict import predict as predict_texts  # late: torch and transformers are slow to import

    return predict_texts(os.fspath(checkpoint), texts, batch_size)
