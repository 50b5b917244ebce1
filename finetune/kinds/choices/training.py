"""Multiple-choice scores (task kind choices): a model's logits per choice with padding choices masked out, the
loss over each question's choices, and the probabilities of every question (eval and predict)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from finetune.console import phase_bar
from finetune.kinds.choices.data import CHOICE_MASK, ChoiceQuestions, EncodedChoices, collate_choices
from finetune.kinds.choices.model import reads_last_token
from finetune.models.heads import fitted_max_length


def choice_logits(model, batch: dict) -> torch.Tensor:
    """(questions, choices) scores, -inf for the padding choices: a softmax or cross-entropy over a row then sees
    only the question's own choices. `batch` keeps its labels (the model is not asked for its loss)."""
    inputs = {key: value for key, value in batch.items() if key not in (CHOICE_MASK, "labels")}
    logits = model(**inputs).logits.float()
    return logits.masked_fill(~batch[CHOICE_MASK], float("-inf"))


def choice_loss(model, batch: dict, smoothing: float = 0.0) -> torch.Tensor:
    """The mean cross-entropy over the batch's questions, each over its own choices; with label `smoothing`, that
    share of each target spread evenly over the question's own choices (torch's label_smoothing, padding left out)."""
    return smoothed_choice_loss(choice_logits(model, batch), batch["labels"], batch[CHOICE_MASK], smoothing)


def smoothed_choice_loss(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, smoothing: float = 0.0
) -> torch.Tensor:
    """The mean over questions of (1 - smoothing) x the answer's cross-entropy + smoothing x the mean of its
    choices' (padding choices, whose logits are -inf, left out)."""
    if not smoothing:
        return torch.nn.functional.cross_entropy(logits, labels)
    log_probabilities = logits.log_softmax(dim=-1)
    answer = -log_probabilities.gather(1, labels.unsqueeze(1)).squeeze(1)
    spread = -log_probabilities.masked_fill(~mask, 0.0).sum(dim=-1) / mask.sum(dim=-1)
    return ((1 - smoothing) * answer + smoothing * spread).mean()


def question_probabilities(model, loader, device, with_loss: bool = False) -> tuple[list[np.ndarray], float | None]:
    """Each question's probabilities over its choices (padding cut off), in the loader's order; with_loss: the
    mean cross-entropy over the questions."""
    model.eval()
    outputs, loss_sum, count = [], 0.0, 0
    with torch.no_grad(), phase_bar("evaluating", len(loader), True) as advance:
        for batch in loader:
            batch = {key: value.to(device) for key, value in batch.items()}
            logits = choice_logits(model, batch)
            if with_loss and "labels" in batch:
                loss_sum += torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="sum").item()
                count += len(logits)
            probabilities = torch.softmax(logits.double(), dim=-1).cpu().numpy()
            outputs += [row[:choices] for row, choices in zip(probabilities, batch[CHOICE_MASK].sum(dim=1).tolist())]
            advance()
    return outputs, (loss_sum / max(count, 1) if with_loss else None)


def choice_delimiter(model, tokenizer) -> int | None:
    """GPT's delimiter (the end-of-text token) for a model that reads the last token; None for a sentence pair."""
    return tokenizer.eos_token_id if reads_last_token(model) else None


def encoded_questions(model, tokenizer, questions: ChoiceQuestions, max_length: int | None) -> EncodedChoices:
    fitted = fitted_max_length(max_length, model)
    # None only for a model that reads whole documents (an AWD-LSTM), which has no multiple-choice head
    assert fitted is not None
    return EncodedChoices(questions, tokenizer, fitted, choice_delimiter(model, tokenizer))


def choose(
    model, tokenizer, questions: ChoiceQuestions, max_length: int | None, batch_size: int, device
) -> list[np.ndarray]:
    """Every question's probabilities over its choices, in file order (eval and predict)."""
    model.to(device)
    encoded = encoded_questions(model, tokenizer, questions, max_length)
    loader = DataLoader(encoded, batch_size=batch_size, collate_fn=collate_choices(tokenizer.pad_token_id))
    probabilities, _ = question_probabilities(model, loader, device)
    return probabilities
