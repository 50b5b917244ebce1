"""A fine-tuned tagger ready to predict: a tag for every word of a sentence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorForTokenClassification

from finetune.data.examples import TaskExamples
from finetune.kinds.dev_split import dev_examples
from finetune.kinds.predictor import TextPredictor
from finetune.kinds.tokens.data import IGNORED, EncodedTagging, TaggedSentences, read_tagged_split
from finetune.kinds.tokens.training import sentence_logits, tag_sentences
from finetune.models.families import reads_left_to_right
from finetune.models.heads import fitted_max_length
from finetune.tasks.specs import TaskSpec


@dataclass
class TaggingPredictor(TextPredictor):
    """A fine-tuned tagger (task kind tokens) ready to predict: a tag for every word of a sentence."""

    plain_text_only: ClassVar[str | None] = "a tagger reads plain text, a sentence per line (words split at spaces)"

    model: torch.nn.Module
    tokenizer: Any
    spec: TaskSpec  # its labels: the tagger's tags
    max_length: int | None
    batch_size: int = 64

    def predict(self, texts: Sequence[str]) -> list[dict]:
        """One result per sentence: {"words", "tags"}, the words split at white space."""
        return self.predict_examples(
            TaskExamples([(text,) for text in texts], None, [str(index) for index in range(len(texts))])
        )

    def dev_inputs(self, task: Any, checkpoint: Path) -> list:
        """The dev sentences `checkpoint` was scored on (its task's CoNLL columns), each as its words joined by
        spaces: what `predict` takes."""
        read = lambda split: read_tagged_split(self.spec, task.data_dir, split)
        return [" ".join(words) for words in dev_examples(self.spec, task, [checkpoint], read).words]

    def word_logits(self, sentences: TaggedSentences, name: str | None = None) -> list[np.ndarray]:
        """Each sentence's logits of each word (at the token its tag is read from), a row of NaN for a word it does
        not read: a teacher's soft targets (kinds/distillation.py)."""
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(device)
        encoded = EncodedTagging(
            sentences,
            self.tokenizer,
            fitted_max_length(self.max_length, self.model),
            name=name or "teacher's",
            last_token=reads_left_to_right(self.model.config),
        )
        collate = DataCollatorForTokenClassification(self.tokenizer, label_pad_token_id=IGNORED)
        loader = DataLoader(encoded, batch_size=self.batch_size, collate_fn=collate)
        logits, _ = sentence_logits(self.model, loader, device)
        tags = len(self.spec.labels or ())
        words = []
        for row, positions in zip(logits, encoded.word_positions):
            sentence = np.full((len(positions), tags), np.nan, dtype=np.float32)
            for word, position in enumerate(positions):
                if position is not None:
                    sentence[word] = row[position]
            words.append(sentence)
        return words

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
