"""The recipe keys of a classifier's refusals: models/heads.py says what is wrong with a checkpoint or an option, the
stage that read them from a recipe says which key to change."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from finetune.errors import UserError, recipe_key
from finetune.models.heads import BackwardEncoderError, ClassifierOptionError

# Classifier options that sit at the recipe's top level; the others are fields of its model section.
TOP_LEVEL_OPTIONS = ("pooling",)


@contextlib.contextmanager
def classifier_keys() -> Iterator[None]:
    """Around `load_classifier` / `classifier_skeleton`: a refused option is named by its key (model.X, or pooling),
    the backward checkpoint's errors by model.backward_checkpoint, the others by model.checkpoint."""
    with recipe_key("model.checkpoint"), recipe_key("model.backward_checkpoint", BackwardEncoderError):
        try:
            yield
        except ClassifierOptionError as error:
            key = error.option if error.option in TOP_LEVEL_OPTIONS else f"model.{error.option}"
            raise UserError(f"{key}: {error}") from error
