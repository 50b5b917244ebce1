"""What the pretraining stage needs of a language model under training, whatever its family."""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class LanguageModelLoss(nn.Module):
    """A Hugging Face language model wrapped so that its forward is the training objective.

    forward(input_ids, labels) -> (mean loss, labelled tokens, correct predictions or None while training).
    Wrapping (rather than calling a loss function beside the model) lets DDP see the real forward.
    Recurrent models carry a state from batch to batch; the others keep these defaults.
    """

    @property
    def language_model(self) -> nn.Module:
        """The Hugging Face model inside, the one a checkpoint saves."""
        raise NotImplementedError

    def fresh_state(self) -> contextlib.AbstractContextManager:
        """A block (validation) that starts from a clean state and leaves training's state as it was."""
        return contextlib.nullcontext()

    def carried_state(self) -> dict[str, torch.Tensor]:
        """The state carried between batches, as named tensors for a checkpoint (none by default)."""
        return {}

    def restore_carried_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Put back what `carried_state` saved."""


class CarriedStateLoss(LanguageModelLoss):
    """A LanguageModelLoss whose model carries `state` from batch to batch: row i of each batch continues row i of
    the one before (the AWD-LSTM's truncated BPTT, Transformer-XL's memory). Validation starts from None."""

    def __init__(self):
        super().__init__()
        self.state = None

    @contextlib.contextmanager
    def fresh_state(self):
        """Start from no state inside the block (validation), and give training back its own state after it."""
        saved, self.state = self.state, None
        try:
            yield
        finally:
            self.state = saved
