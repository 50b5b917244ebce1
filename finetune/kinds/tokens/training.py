"""Tag prediction (task kind tokens): per-token logits of sentences, turned into a tag per word."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorForTokenClassification

from finetune.console import phase_bar
from finetune.kinds.tokens.data import IGNORED, EncodedTagging, TaggedSentences
from finetune.models.families import reads_left_to_right
from finetune.models.heads import fitted_max_length
from finetune.models.packed_bert import packed_logits


def sentence_logits(model, loader, device, with_loss: bool = False) -> tuple[list[np.ndarray], float | None]:
    """Each sentence's per-token logits (padding cut off), in the loader's order; with_loss: the mean
    cross-entropy over the tagged tokens."""
    model.eval()
    outputs, loss_sum, tagged = [], 0.0, 0
    with torch.no_grad(), phase_bar("evaluating", len(loader), True) as advance:
        for batch in loader:
            batch = {key: value.to(device) for key, value in batch.items()}
            labels = batch.pop("labels", None)
            logits = packed_logits(model, **batch)  # BERT taggers skip the padding (models/packed_bert.py)
            logits = (model(**batch).logits if logits is None else logits).float()
            if with_loss and labels is not None:
                loss_sum += torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORED, reduction="sum"
                ).item()
                tagged += int((labels != IGNORED).sum())
            for row, length in zip(logits.cpu().numpy(), batch["attention_mask"].sum(dim=1).tolist()):
                outputs.append(row[:length])
            advance()
    return outputs, (loss_sum / max(tagged, 1) if with_loss else None)


def tag_sentences(
    model,
    tokenizer,
    sentences: TaggedSentences,
    tags,
    max_length: int | None,
    batch_size: int,
    device,
    name: str = "input",
) -> list[list[str]]:
    """The predicted tag of every word of every sentence (eval and predict)."""
    model.to(device)
    encoded = EncodedTagging(
        sentences,
        tokenizer,
        fitted_max_length(max_length, model),
        name=name,
        last_token=reads_left_to_right(model.config),
    )
    collate = DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORED)
    logits, _ = sentence_logits(model, DataLoader(encoded, batch_size=batch_size, collate_fn=collate), device)
    return encoded.word_tags(logits, tags)
