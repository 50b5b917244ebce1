"""Contrastive sentence-embedding training of a mean-pooling classifier's encoder, then its head by logistic
regression: SetFit's method (Tunstall et al. 2022), run on the toolkit's model, layer groups and data.

1. Pairs of labelled rows (data/pairs.py) train the encoder so that the mean-pooled embeddings of similar rows
   have cosine 1 and of dissimilar rows 0: sentence-transformers' pair losses (`compute_loss_from_embeddings`),
   AdamW with discriminative LRs over the encoder's layer groups, linear warmup (10%) then decay, dropout on.
2. A logistic regression (scikit-learn's, SetFit's default head) on the training rows' embeddings becomes the
   classifier's linear layer, so the fine-tuning that follows starts from SetFit's model; multi-label rows get one
   regression per label (one-vs-rest, SetFit's multi-label default), each the row of its label's sigmoid.

The well-kept library does the losses (sentence-transformers: tested, several to choose from); the pairs are
drawn here, since `setfit` itself pins versions of transformers this toolkit has moved past.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from finetune.console import progress_bar
from finetune.data.pairs import Pairs
from finetune.models.mean_pooling import mean_over_real_tokens
from finetune.training.optim import build_optimizer, discriminative_lrs, set_learning_rates
from finetune.training.schedules import linear_warmup_decay

WARMUP_FRACTION = 0.1  # SetFit's warmup_proportion
LOG_EVERY = 10  # optimizer steps per record of the pair loss
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what the encoder reads of a collated batch


def pair_loss(name: str) -> nn.Module:
    """sentence-transformers' loss called `name` in the recipe (contrastive.loss)."""
    from sentence_transformers.sentence_transformer import losses  # late: seconds to import, only this method

    made: dict[str, Callable[[], nn.Module]] = {
        "cosine": lambda: losses.CosineSimilarityLoss(None),  # type: ignore[arg-type]  # embeddings given directly
        "contrastive": lambda: losses.ContrastiveLoss(None),  # type: ignore[arg-type]
        "online_contrastive": lambda: losses.OnlineContrastiveLoss(None),  # type: ignore[arg-type]
    }
    return made[name]()


def sentence_embeddings(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(batch, hidden): the mean over the real tokens the classifier's head reads (before its dropout), normalised
    where the model normalises it."""
    inputs = {key: value for key, value in batch.items() if key in MODEL_INPUTS}
    return model.normalized(mean_over_real_tokens(model.token_states(**inputs), inputs.get("attention_mask")))


def train_encoder_on_pairs(
    model, encoder_groups: list[list[nn.Parameter]], items, collate: Callable, pairs: Pairs, settings, device
) -> list[dict[str, Any]]:
    """Train the encoder's groups on `pairs` of `items` (settings: the contrastive section, discriminative factor,
    weight decay, betas); returns the loss records (step, loss, lr) for metrics.jsonl."""
    lrs = discriminative_lrs(len(encoder_groups), settings.lr, settings.factor)
    optimizer = build_optimizer(model, encoder_groups, lrs, settings.weight_decay, settings.betas)
    loss_function: Any = pair_loss(settings.loss)  # a sentence-transformers loss: compute_loss_from_embeddings
    total = math.ceil(len(pairs.similar) / settings.batch_size)
    model.to(device).train()
    records, window = [], []
    with progress_bar() as progress:
        bar = progress.add_task("contrastive pairs", total=total, status="")
        for step in range(total):
            rows = slice(step * settings.batch_size, (step + 1) * settings.batch_size)
            first, second = pairs.first[rows], pairs.second[rows]
            # One forward for both sides: the batch of 2 x pairs rows, padded together, split after pooling.
            batch = collate([items[int(row)] for row in np.concatenate([first, second])])
            embeddings = sentence_embeddings(model, {key: value.to(device) for key, value in batch.items()})
            similar = torch.from_numpy(pairs.similar[rows]).to(device)
            loss = loss_function.compute_loss_from_embeddings(list(embeddings.split(len(first))), similar)
            lr = set_learning_rates(optimizer, linear_warmup_decay(step, total, WARMUP_FRACTION))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for group in encoder_groups for p in group], 1.0)
            optimizer.step()
            window.append(loss.item())
            progress.advance(bar)
            if (step + 1) % LOG_EVERY == 0 or step + 1 == total:
                records.append({"phase": "contrastive", "step": step + 1, "loss": float(np.mean(window)), "lr": lr})
                progress.update(bar, status=f"loss {records[-1]['loss']:.4f}")
                window = []
    optimizer.zero_grad(set_to_none=True)
    return records


@torch.no_grad()
def embed_rows(model, items, collate: Callable, device, batch_size: int = 64) -> np.ndarray:
    """(rows, hidden) embeddings of every item, the model in evaluation mode (no dropout)."""
    model.eval()
    parts = [
        sentence_embeddings(model, {k: v.to(device) for k, v in collate([items[i] for i in chunk]).items()}).cpu()
        for chunk in np.array_split(np.arange(len(items)), max(1, math.ceil(len(items) / batch_size)))
    ]
    model.train()
    return torch.cat(parts).numpy()


def head_layer(classifier) -> nn.Linear:
    """The linear layer that predicts: with a LoRA adapter (peft's ModulesToSaveWrapper), the head's copy that trains
    and is saved."""
    copies = getattr(classifier, "modules_to_save", None)  # a ModuleDict by adapter name
    return classifier if copies is None else copies[classifier.active_adapters[0]]  # the run's one adapter


def cpu_zeros(classifier: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros shaped as the layer's weight and bias, on the CPU beside scikit-learn's arrays whatever device the layer
    is on (a GPU's: indexing its tensor by CPU class indices fails); `copy_` moves them to the layer at the end."""
    return (
        torch.zeros(classifier.weight.shape, dtype=classifier.weight.dtype),
        torch.zeros(classifier.bias.shape, dtype=classifier.bias.dtype),
    )


def fit_head_by_logistic_regression(classifier: nn.Linear, embeddings: np.ndarray, labels: np.ndarray, seed: int):
    """The classifier's weights and bias from scikit-learn's logistic regression on the embeddings (SetFit's head):
    the softmax of the layer's logits is the regression's probabilities. Returns the training accuracy."""
    from sklearn.linear_model import LogisticRegression

    classifier = head_layer(classifier)
    regression = LogisticRegression(max_iter=1000, random_state=seed).fit(embeddings, labels)
    weight, bias = cpu_zeros(classifier)
    coefficients = torch.as_tensor(regression.coef_, dtype=weight.dtype)
    intercepts = torch.as_tensor(regression.intercept_, dtype=weight.dtype)
    classes = torch.as_tensor(regression.classes_, dtype=torch.long)
    if len(classes) == 2:  # one logit z for the second class: logits -z/2, z/2 have the same softmax
        weight[classes[0]], weight[classes[1]] = -coefficients[0] / 2, coefficients[0] / 2
        bias[classes[0]], bias[classes[1]] = -intercepts[0] / 2, intercepts[0] / 2
    else:
        weight[classes], bias[classes] = coefficients, intercepts
    with torch.no_grad():
        classifier.weight.copy_(weight)
        classifier.bias.copy_(bias)
    return float(regression.score(embeddings, labels))


def fit_head_label_by_label(
    classifier: nn.Linear, embeddings: np.ndarray, labels: np.ndarray, seed: int
) -> tuple[float, list[int]]:
    """Each label's row of the classifier from a logistic regression of that label (0/1 `labels` columns) on the
    embeddings, one-vs-rest (SetFit's multi-label head): the sigmoid of a label's logit is its regression's
    probability. A label on no training row, or on every one, has no regression to fit: its row is a bias alone, the
    log-odds of its rate smoothed by half a row each way, (positives + 1/2) / (rows + 1), finite and on the side of
    the rows. Returns the training subset accuracy (rows whose every label is right) and those labels' indices."""
    from sklearn.linear_model import LogisticRegression

    classifier = head_layer(classifier)
    present = np.asarray(labels) > 0.5
    weight, bias = cpu_zeros(classifier)
    constant = []
    for label in range(present.shape[1]):
        column = present[:, label]
        if column.all() or not column.any():
            rate = (column.sum() + 0.5) / (len(column) + 1)
            bias[label] = float(np.log(rate / (1 - rate)))
            constant.append(label)
            continue
        regression = LogisticRegression(max_iter=1000, random_state=seed).fit(embeddings, column)
        weight[label] = torch.as_tensor(regression.coef_[0], dtype=weight.dtype)
        bias[label] = float(regression.intercept_[0])
    with torch.no_grad():
        classifier.weight.copy_(weight)
        classifier.bias.copy_(bias)
    decided = embeddings @ weight.double().numpy().T + bias.double().numpy() > 0
    return float((decided == present).all(axis=1).mean()), constant
