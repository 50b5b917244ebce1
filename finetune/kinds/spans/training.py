"""Answer prediction (task kind spans): start and end logits of every window, turned into each question's answer.

For a question, over all its windows: the `n_best` highest start and end logits of each window are paired; a pair
is a valid span when both tokens are in the window's context, start <= end, and it is at most
`max_answer_length` tokens long; the best valid span (start logit + end logit) is the answer, its text cut from
the context by the tokens' character offsets. A model trained with unanswerable questions (SQuAD 2.0) also has a
no-answer score, start_logit[CLS] + end_logit[CLS], the lowest over the question's windows (as Hugging Face's
run_qa): it answers nothing when that score beats the best span by more than `null_threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from finetune.console import phase_bar
from finetune.kinds.spans.data import DEFAULT_MAX_LENGTH, EncodedSpans, SpanReading, SquadQuestions
from finetune.models.heads import fitted_max_length
from finetune.training.checkpoints import saved_recipe


@dataclass
class Answer:
    """A question's answer: its text ("" for no answer), score, and character span in the context (None for no
    answer); `span` is the best valid span's text even when no answer won, and `null_margin` how much the
    no-answer score beat it (what SQuAD 2.0's best threshold is searched over)."""

    text: str
    score: float
    start: int | None
    end: int | None
    span: str
    null_margin: float

    def as_row(self) -> dict:
        return {"answer": self.text, "score": self.score, "start": self.start, "end": self.end}


def window_logits(
    model, loader, device, with_loss: bool = False
) -> tuple[list[np.ndarray], list[np.ndarray], float | None]:
    """Each window's start and end logits (padding cut off), in the loader's order; with_loss: the model's mean
    loss over the windows (where the batches hold start and end positions)."""
    model.eval()
    starts, ends, loss_sum, windows = [], [], 0.0, 0
    with torch.no_grad(), phase_bar("evaluating", len(loader), True) as advance:
        for batch in loader:
            batch = {key: value.to(device) for key, value in batch.items()}
            if not with_loss:
                batch.pop("start_positions", None), batch.pop("end_positions", None)
            output = model(**batch)
            if with_loss and getattr(output, "loss", None) is not None:
                size = batch["input_ids"].shape[0]
                loss_sum, windows = loss_sum + output.loss.item() * size, windows + size
            lengths = batch["attention_mask"].sum(dim=1).tolist()
            for start, end, length in zip(
                output.start_logits.float().cpu().numpy(), output.end_logits.float().cpu().numpy(), lengths
            ):
                starts.append(start[:length])
                ends.append(end[:length])
            advance()
    return starts, ends, (loss_sum / windows if windows else None)


def best_answers(
    encoded: EncodedSpans,
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    reading: SpanReading,
    no_answer: bool,
) -> list[Answer]:
    """Each question's answer from its windows' logits (see the module docstring); `no_answer`: the model may
    answer nothing (SQuAD 2.0)."""
    windows_of: list[list[int]] = [[] for _ in encoded.questions.questions]
    for window, question in enumerate(encoded.question_of):
        windows_of[question].append(window)
    answers = []
    for question, windows in zip(encoded.questions.questions, windows_of):
        best, null_score = None, None
        for window in windows:
            starts, ends, offsets = start_logits[window], end_logits[window], encoded.offsets[window]
            cls = encoded.cls_positions[window]
            window_null = float(starts[cls] + ends[cls])
            null_score = window_null if null_score is None else min(null_score, window_null)
            for first in np.argsort(starts)[::-1][: reading.n_best]:
                for last in np.argsort(ends)[::-1][: reading.n_best]:
                    if (
                        not (first < len(offsets) and last < len(offsets))
                        or offsets[first] is None
                        or offsets[last] is None
                        or last < first
                        or last - first + 1 > reading.max_answer_length
                    ):
                        continue
                    score = float(starts[first] + ends[last])
                    if best is None or score > best[0]:
                        best = (score, offsets[first][0], offsets[last][1])
        if best is None:  # no valid span in any window (a context the windows did not reach): no answer
            answers.append(Answer("", null_score or 0.0, None, None, "", float("inf")))
            continue
        score, start, end = best
        assert null_score is not None  # a span was found in a window, whose no-answer score was taken first
        span, margin = question.context[start:end], null_score - score
        if no_answer and margin > reading.null_threshold:
            answers.append(Answer("", null_score, None, None, span, margin))
        else:
            answers.append(Answer(span, score, start, end, span, margin))
    return answers


def answer_questions(
    model, tokenizer, questions: SquadQuestions, reading: SpanReading, batch_size: int, device
) -> list[Answer]:
    """Every question's answer (eval and predict)."""
    from finetune.kinds.spans.model import answers_no_answer

    model.to(device)
    encoded = EncodedSpans(questions, tokenizer, reading, with_labels=False)
    loader = DataLoader(encoded, batch_size=batch_size, collate_fn=DataCollatorWithPadding(tokenizer))
    starts, ends, _ = window_logits(model, loader, device)
    return best_answers(encoded, starts, ends, reading, answers_no_answer(model))


def gold_answers(questions: SquadQuestions) -> list[list[str]]:
    """Each question's gold answer texts (none: unanswerable)."""
    return [[text for text, _ in question.answers] for question in questions.questions]


def checkpoint_span_reading(task, checkpoint: str, model) -> SpanReading:
    """How an eval reads and answers with a checkpoint: the eval recipe's task keys, else those it was trained
    with (its finetune_recipe.yaml), else the defaults; max_length fitted to the model."""
    saved = saved_recipe(checkpoint).get("task")
    saved = saved if isinstance(saved, dict) else {}
    max_length = task.max_length or (saved.get("max_length") if isinstance(saved.get("max_length"), int) else None)
    return SpanReading.of(task, span_max_length(max_length, model), saved)


def span_max_length(max_length: int | None, model) -> int:
    """The tokens of a window: `max_length` (None: the default, 384) fitted to the model's positions."""
    fitted = fitted_max_length(max_length or DEFAULT_MAX_LENGTH, model)
    assert fitted is not None  # None only where no length is asked for (an AWD-LSTM's whole document)
    return fitted
