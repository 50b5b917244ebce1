"""finetune: transfer learning for NLP in the line of ULMFiT, GPT and BERT."""

from finetune._version import __version__

__all__ = ["__version__", "predict"]


def predict(checkpoint: str, texts, batch_size: int = 64) -> list[dict]:
    """Labels and probabilities (or scores) of a fine-tuned checkpoint for raw texts; see finetune.commands.predict.

    >>> finetune.predict("runs/quickstart/finetune/checkpoint", ["a warm , funny film"])  # doctest: +SKIP
    [{'label': ..., 'probabilities': {'0': ..., '1': ...}}]
    """
    from finetune.commands.predict import predict as predict_texts  # late: torch and transformers are slow to import

    return predict_texts(checkpoint, texts, batch_size)
