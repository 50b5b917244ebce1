"""Batched prediction over a task split, gathered across processes without duplicated tail samples."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from finetune.console import phase_bar
from finetune.data.examples import TaskExamples
from finetune.data.long_documents import (
    WINDOW_DOCUMENT,
    DocumentReading,
    ReadingError,
    classification_loss,
    pool_windows,
)
from finetune.data.reverse import reads_backwards, reads_both_directions
from finetune.data.task_batches import task_collator
from finetune.data.task_encoding import EncodedTask
from finetune.errors import recipe_key
from finetune.models.heads import fitted_max_length
from finetune.models.packed_bert import packed_logits
from finetune.tasks.specs import TaskSpec


class LengthSortedPrediction:
    """A loader over tokenized examples, longest first, and the way back to file order.

    Batches of neighbours in length pad to nearly their own length instead of to the longest example that file
    order happens to put beside them (SST-2 dev: 6-55 tokens), and the first batch is the largest, so a batch size
    that does not fit fails at once. The loader is not shuffled, so a distributed `gather_for_metrics` returns the
    outputs in the loader's order, which `in_file_order` undoes.
    """

    def __init__(self, encoded: EncodedTask, tokenizer, batch_size: int):
        self.order = np.argsort(-np.asarray(encoded.lengths), kind="stable")
        self.loader = DataLoader(
            Subset(encoded, self.order.tolist()), batch_size=batch_size, collate_fn=task_collator(tokenizer, encoded)
        )
        self.pool = encoded.reading.pool  # windowed documents: how their windows' logits become theirs

    def in_file_order(self, outputs: np.ndarray) -> np.ndarray:
        """Outputs of the loader's examples, in the order of the examples' file."""
        restored = np.empty_like(outputs)
        restored[self.order] = outputs
        return restored


@torch.inference_mode()
def predict_logits(accelerator, model, loader, pool: str = "mean") -> np.ndarray:
    """The model's logits for every example of a prepared loader, in the loader's order; a batch of windowed
    documents (chunks) gives one row per document, its windows' logits pooled by `pool`."""
    model.eval()
    unwrapped = accelerator.unwrap_model(model)  # no gradients here, so no wrapper needs to see the forward
    outputs = []
    with phase_bar("evaluating", len(loader), accelerator.is_main_process) as advance:
        for batch in loader:
            documents = batch.get(WINDOW_DOCUMENT)
            batch = {key: value for key, value in batch.items() if key not in ("labels", WINDOW_DOCUMENT)}
            # BERT classifiers skip the padding (models/packed_bert.py); any other model runs its own forward.
            logits = packed_logits(unwrapped, **batch)
            if logits is None:
                logits = model(**batch).logits
            if documents is not None:
                logits = pool_windows(logits, documents, pool)
            # gather_for_metrics drops the samples a distributed sampler repeats to even out the last batch.
            outputs.append(accelerator.gather_for_metrics(logits.float()).cpu())
            advance()
    return torch.cat(outputs).numpy()


def example_logits(
    accelerator,
    model,
    tokenizer,
    examples: TaskExamples,
    reading: DocumentReading | int | None,
    batch_size: int,
    name: str | None = None,
) -> np.ndarray:
    """A classifier's logits (or scores) for every example, batched longest first, returned in file order.

    `reading`: how the model reads each example (or just task.max_length), fitted to the model's positions; `name`
    (e.g. "dev"): say in one line what it does to examples longer than max_length. A batch holds `batch_size`
    examples (chunks: documents, each of its windows).
    """
    # Inference needs no wrapping by `accelerator.prepare`, which would also keep every model alive. Moved only when
    # elsewhere: `to` walks every module even when nothing moves (~5 ms a call for MiniLM, a batch of one's cost).
    parameter = next(model.parameters(), None)  # an ONNX graph's wrapper (commands/quantize.py) holds none
    if parameter is None or parameter.device != accelerator.device:
        model.to(accelerator.device)
    reading = reading if isinstance(reading, DocumentReading) else DocumentReading(reading)
    reading = replace(reading, max_length=fitted_max_length(reading.max_length, model))
    # A backward model reads its text backwards; a bidirectional one both ways.
    with recipe_key("task.long_documents", ReadingError):  # a head or overlap too long for the examples
        encoded = EncodedTask(
            examples,
            tokenizer,
            reading,
            name=name,
            backwards=reads_backwards(model.config),
            both_directions=reads_both_directions(model.config),
        )
    batches = LengthSortedPrediction(encoded, tokenizer, batch_size)
    return batches.in_file_order(predict_logits(accelerator, model, accelerator.prepare(batches.loader), reading.pool))


def logits_to_predictions(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """Class indices (argmax) for classification, the single output for regression."""
    return logits[:, 0] if spec.is_regression else logits.argmax(axis=-1)


def logits_loss(spec: TaskSpec, logits: np.ndarray, labels: np.ndarray) -> float:
    """The mean of the loss the model trains on: cross-entropy, or squared error for regression."""
    targets = torch.as_tensor(labels, dtype=torch.float32 if spec.is_regression else torch.int64)
    return classification_loss(torch.from_numpy(logits), targets).item()
