"""SQuAD's exact match and F1, as the official evaluation scripts define them (evaluate-v2.0.py, which scores v1.1
answers the same way): answers normalised (lower case, punctuation and the articles a/an/the removed, white space
collapsed), each prediction scored against every gold answer and the best kept; v2.0 adds the scores of the
answerable (HasAns) and unanswerable (NoAns) questions, and the no-answer threshold that would have scored best.

Written here rather than loaded with the `evaluate` library: its squad_v2 metric is a script fetched from the hub.
Scores are fractions (0 to 1) like the project's other metrics; reports show them x 100 as SQuAD does.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, articles removed, white space collapsed (the official normalize_answer)."""
    text = "".join(character for character in text.lower() if character not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def exact_match(gold: str, predicted: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(predicted))


def f1_score(gold: str, predicted: str) -> float:
    """Token F1 of the normalised answers; an empty answer (no answer) scores 1 against an empty one, else 0."""
    gold_tokens, predicted_tokens = answer_tokens(gold), answer_tokens(predicted)
    if not gold_tokens or not predicted_tokens:
        return float(gold_tokens == predicted_tokens)
    shared = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_texts(answers: Sequence[str]) -> list[str]:
    """The gold answers scored against: those that do not normalise to nothing, or [""] (no answer)."""
    return [answer for answer in answers if normalize_answer(answer)] or [""]


def question_scores(answers: Sequence[str], predicted: str) -> tuple[int, float]:
    """(exact match, F1) of one prediction: the best over the gold answers."""
    golds = gold_texts(answers)
    return max(exact_match(gold, predicted) for gold in golds), max(f1_score(gold, predicted) for gold in golds)


def squad_scores(answers: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """exact and f1 over every question; where some questions have no answer (v2.0), HasAns_ and NoAns_ exact and
    f1 and the question counts too. `answers`: each question's gold texts (none: unanswerable)."""
    pairs = [question_scores(gold, predicted) for gold, predicted in zip(answers, predictions)]
    scores = {"exact": _mean([exact for exact, _ in pairs]), "f1": _mean([f1 for _, f1 in pairs])}
    has_answer = [bool(gold) for gold in answers]
    if not all(has_answer):
        for name, wanted in (("HasAns", True), ("NoAns", False)):
            chosen = [pair for pair, answerable in zip(pairs, has_answer) if answerable == wanted]
            scores.update(
                {
                    f"{name}_exact": _mean([exact for exact, _ in chosen]),
                    f"{name}_f1": _mean([f1 for _, f1 in chosen]),
                    f"{name}_total": len(chosen),
                }
            )
    return scores


def best_threshold(
    answers: Sequence[Sequence[str]], span_texts: Sequence[str], null_margins: Sequence[float]
) -> tuple[float, float]:
    """(the best F1, the threshold giving it) over every no-answer threshold: the official find_best_thresh with
    F1, where a question is left unanswered when its null margin (no-answer score minus best span score) is above
    the threshold; `span_texts`: each question's best span (its answer when it is answered)."""
    no_answers = sum(1 for gold in answers if not gold)
    current = best = float(no_answers)  # every question unanswered: right for the unanswerable ones
    threshold = 0.0
    for index in sorted(range(len(answers)), key=lambda index: null_margins[index]):
        if answers[index]:
            current += question_scores(answers[index], span_texts[index])[1]
        elif span_texts[index]:
            current -= 1
        if current > best:
            best, threshold = current, null_margins[index]
    return best / max(len(answers), 1), float(threshold)


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
