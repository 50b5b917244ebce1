"""A fine-tuned tagger ready to predict: a tag for every word of a sentence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from finetune.data.examples import TaskExamples
from finetune.kinds.predictor import TextPredictor
from finetune.kinds.tokens.data import TaggedSentences
from finetune.kinds.tokens.training import tag_sentences
from finetune.tasks.specs import TaskSpec


@dataclass
class TaggingPredictor(TextPredictor):
    """A fine-tuned tagger (task kind tokens) ready to predict: a tag for every word of a sentence."""

    plain_text_only: ClassVar[str | None] = "a tagger reads plain text, a sentence per line (words split at spaces)"

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec  # its labels: the tagger's tags
    max_length: int | None
    batch_size: int = 64

    def predict(self, texts: Sequence[str]) -> list[dict]:
        """One result per sentence: {"words", "tags"}, the words split at white space."""
        return self.predict_examples(
            TaskExamples([(text,) for text in texts], None, [str(index) for index in range(len(texts))])
        )

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        words = [text.split() for (text,) in examples.texts]
        if not any(words):
            return [{"words": [], "tags": []} for _ in words]
        sentences = TaggedSentences(
            [sentence or [""] for sentence in words], None, list(range(1, len(words) + 1)), Path("input")
        )
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        tags = tag_sentences(
            self.model, self.tokenizer, sentences, self.spec.labels, self.max_length, self.batch_size, device
        )
        return [{"words": sentence, "tags": predicted[: len(sentence)]} for sentence, predicted in zip(words, tags)]
