"""`method: auto`: how a classifier is trained, decided at the start of a run from what it has to learn from.

| method | when auto picks it |
|---|---|
| contrastive (SetFit's) | kind classification, a sentence-embedding checkpoint read by mean pooling, at most |
| | CONTRASTIVE_UP_TO labelled rows per class (the median over classes), rows that give a similar pair of two |
| | rows and a dissimilar pair (data/pairs.py), no class of a single row (method contrastive trains one, paired |
| | with itself as in SetFit; on ATIS's first draw that was 0.7 points below plain: not auto's choice yet) |
| contrastive | kind multilabel, the same checkpoint and pooling, at most CONTRASTIVE_UP_TO positive rows per label |
| | (a label's rows, the median over labels), rows that give a similar and a dissimilar pair (data/pairs.py) |
| plain | everything else |

Why: with a handful of labels a head trained by gradient steps on a few rows starts from an embedding space that
was not made for the task; SetFit's pairs (rows x rows) give the encoder far more to learn from, and its authors
measured the gain to fade past a few hundred labels (Tunstall et al. 2022, Table 2 and Figure 3).
bench/few_labels_vs_setfit.py measures the rule on SST-2, CB and ATIS against the setfit library and plain
fine-tuning (docs/benchmarks.md): level with SetFit at 8, 16, 64 and 256 SST-2 rows per class, above plain
fine-tuning in the mean at each; at 256, contrastive 81.2 / 80.7 on draws 0 and 1 against SetFit's 81.3 / 80.7 and
plain's 80.2 / 79.7, so CONTRASTIVE_UP_TO is 256 (it was 64 until that arm was run). The price at 256 is SetFit's
too: 2 x 20 pairs per row, 1,280 pair steps, about 20 minutes on 2 CPU cores where plain fine-tuning takes one or
two; past 256 the gain is not measured and SetFit's authors saw it fade.

`self_training.rounds: auto` (stages/self_training.py runs the rounds):

| self-training | when auto runs it |
|---|---|
| SELF_TRAINING_ROUNDS rounds | SELF_TRAINING_MEASURED_GAIN (now False: off), unlabelled_text given (kind |
| | classification), at most SELF_TRAINING_UP_TO labelled rows per class (the median over classes) |
| off | everything else (said in one line where unlabelled_text is given; nothing without it) |

Why: a classifier's own confident labels on unlabelled text add rows where labelled ones are few (Yarowsky 1995;
Cascante-Bonilla et al. 2021's curriculum labelling: every round relabels all the text and restarts from the
pretrained weights); with hundreds of labels per class the rows it adds are those it already gets right, and a round
costs a whole training and a pass over the text. SELF_TRAINING_UP_TO, SELF_TRAINING_ROUNDS and
PSEUDO_LABELS_PER_CLASS are provisional.

Measured (bench/few_labels_vs_setfit.py --arms unlabelled, docs/benchmarks.md), self-training has not yet earned
being the default: on SST-2 at 8 labels per class after method contrastive the ranked rows cost 4.2 and 3.4 points
on the first two draws (55.5 and 66.2 against round 0's 59.8 and 69.6; the teacher is right on 60-70% of
sentences); on ATIS at 8 per class (plain fine-tuning, the earlier 0.9 floor) +0.6 points over 4 draws, the interval
across zero. So auto says it is off and why, and `self_training.rounds: 2` runs it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

CONTRASTIVE_UP_TO = 256  # labelled rows per class (median over classes) up to which auto trains contrastively
# After the pair training the head starts from the logistic regression; the encoder keeps what the pairs taught it
# and the head alone goes on training, at a linear layer's rate.
CONTRASTIVE_HEAD_LR = 1e-3
# Multi-label rows pair through any label they share, so a label of one positive row (or none) leaves its rows other
# partners: no label needs rows of its own, the rows need a similar and a dissimilar pair between them (data/pairs.py),
# and a label with no regression to fit (on no row, or every row) starts its head row from its rate alone.
SELF_TRAINING_UP_TO = 100  # labelled rows per class (median over classes) up to which auto self-trains
SELF_TRAINING_ROUNDS = 2  # the rounds auto runs where it runs them
SELF_TRAINING_MEASURED_GAIN = False  # no measured gain yet (the module docstring): auto leaves self-training off
# self_training.per_class's default: each round adds up to this many times the smallest class's labelled rows per
# class, so the pseudo-labelled rows outnumber the labelled ones without swamping them in the first round.
PSEUDO_LABELS_PER_CLASS = 4


@dataclass(frozen=True)
class MethodChoice:
    """The method a run trains with, and why (printed at the start, with the techniques)."""

    method: str
    reason: str


def contrastive_problem(
    rows_per_class: dict[str, int], pooling: str | None, rows_problem: str | None = None, per_label: bool = False
) -> str | None:
    """Why contrastive training cannot run here, or None. `rows_problem`: why the task's rows make no pairs to train on
    (data/pairs.py `unpaired`, through kinds/contrastive.py); `per_label`: the counts are a multi-label task's positive
    rows per label, which need no minimum. A class needs one row: a class of one row pairs with itself as its similar
    partner and with the other classes' rows as dissimilar ones (SetFit's pairs, drawn with replacement), as ATIS's
    intents of one training row do; a class of none would get no row of the logistic regression the head starts from."""
    if pooling not in ("mean", "scalar_mix"):
        return f"it trains the mean-pooled sentence embeddings, and pooling is {pooling}"
    if per_label:
        return rows_problem
    empty = [label for label, count in rows_per_class.items() if count == 0]
    if empty:
        return f"class '{empty[0]}' has no training row: the head's start (a logistic regression) has none to fit"
    return rows_problem


def choose_method(
    requested: str,
    rows_per_class: dict[str, int] | None,
    sentence_model: bool,
    pooling: str | None,
    rows_problem: str | None = None,
    per_label: bool = False,
) -> MethodChoice:
    """The method of a run: `requested` (method), or for auto the rule of the module docstring.

    `rows_per_class`: None for a kind that cannot train contrastively (regression, tagging, ...); with `per_label`,
    each label's positive rows (multi-label). `rows_problem`: why the rows make no pairs to train on, or None.
    """
    if requested != "auto":
        return MethodChoice(requested, "set in the recipe")
    if rows_per_class is None:
        return MethodChoice("plain", "auto: the task's kind trains a head on the encoder")
    median = statistics.median(rows_per_class.values()) if rows_per_class else 0
    counted = "positive rows per label" if per_label else "labelled rows per class"
    if not sentence_model:
        return MethodChoice("plain", "auto: the checkpoint is not a sentence-embedding model (no mean Pooling module)")
    if median > CONTRASTIVE_UP_TO:
        return MethodChoice("plain", f"auto: {median:g} {counted} (median), more than {CONTRASTIVE_UP_TO} for pairs")
    problem = contrastive_problem(rows_per_class, pooling, rows_problem, per_label)
    if problem is not None:
        return MethodChoice("plain", f"auto: not contrastive, since {problem}")
    single = [label for label, count in rows_per_class.items() if count == 1]
    if single and not per_label:
        return MethodChoice(
            "plain",
            f"auto: class '{single[0]}' has one training row; contrastive training with such classes is not measured "
            "to help yet (ATIS, docs/benchmarks.md), method: contrastive trains it",
        )
    return MethodChoice(
        "contrastive",
        f"auto: a sentence-embedding checkpoint and {median:g} {counted} (median), at most "
        f"{CONTRASTIVE_UP_TO} (finetune/kinds/method.py)",
    )


def contrastive_techniques(recipe):
    """The recipe of the head's training after the pair training: the head alone trains (unfreezing schedule [1]) at
    CONTRASTIVE_HEAD_LR, where the recipe left those keys to their defaults."""
    sources = dict(getattr(recipe, "_technique_sources", None) or {})
    updates = {}
    if sources.get("unfreezing.mode", "set") != "set":
        updates["unfreezing"] = recipe.unfreezing.model_copy(
            update={"mode": "gradual", "schedule": [1], "groups_per_epoch": None}
        )
        sources["unfreezing.mode"] = "method contrastive: the encoder keeps what the pairs taught it"
    if sources.get("training.lr", "set") != "set":
        updates["training"] = recipe.training.model_copy(update={"lr": CONTRASTIVE_HEAD_LR})
        sources["training.lr"] = "method contrastive: the head alone trains, from the logistic regression"
    changed = recipe.model_copy(update=updates)
    changed._technique_sources = sources
    return changed


@dataclass(frozen=True)
class SelfTrainingChoice:
    """The rounds of self-training a run trains, and why (printed at the start)."""

    rounds: int
    reason: str

    def line(self) -> str:
        """The run's line: `self-training: 2 rounds (...)` or `self-training: off (...)`."""
        rounds = "off" if self.rounds == 0 else f"{self.rounds} round{'s' if self.rounds > 1 else ''}"
        return f"self-training: {rounds} ({self.reason})"


def choose_self_training(
    requested: int | str, unlabelled_rows: int, rows_per_class: dict[str, int]
) -> SelfTrainingChoice | None:
    """The rounds of a run: `requested` (self_training.rounds), or for auto the rule of the module docstring; None
    where there is nothing to say (no unlabelled_text, the common case: off without a word)."""
    if not unlabelled_rows:
        return None
    if requested != "auto":
        return SelfTrainingChoice(int(requested), "set in the recipe")
    median = statistics.median(rows_per_class.values()) if rows_per_class else 0
    if not SELF_TRAINING_MEASURED_GAIN:
        return SelfTrainingChoice(
            0,
            "auto: no gain measured yet (SST-2, 8 labels per class: -4.2 and -3.4 points; ATIS: +0.6, within the "
            "noise; finetune/kinds/method.py); self_training.rounds: 2 runs it",
        )
    if median > SELF_TRAINING_UP_TO:
        return SelfTrainingChoice(
            0,
            f"auto: {median:g} labelled rows per class (median), more than {SELF_TRAINING_UP_TO}, where the rows "
            "the model labels itself add little",
        )
    return SelfTrainingChoice(
        SELF_TRAINING_ROUNDS,
        f"auto: {unlabelled_rows:,} unlabelled rows and {median:g} labelled rows per class (median), at most "
        f"{SELF_TRAINING_UP_TO} (finetune/kinds/method.py)",
    )


def pseudo_labels_per_class(per_class: int | None, rows_per_class: dict[str, int]) -> int:
    """The rows a round adds per predicted class: self_training.per_class, or PSEUDO_LABELS_PER_CLASS times the
    labelled rows of the smallest class (at least 1)."""
    if per_class is not None:
        return per_class
    return max(PSEUDO_LABELS_PER_CLASS * min(rows_per_class.values(), default=0), 1)


# Where ULMFiT's stage 2 stands for a classifier with unlabelled text (printed beside self-training's line): a
# finetune run does not run it; what it would do for the checkpoint is measured for a sentence-embedding model only.
STAGE_TWO_MEASURED = (
    "on all-MiniLM-L6-v2 it cost 2.5 points at 100 IMDb labels and gained nothing at 1,000 (bench/ulmfit_imdb.py), "
    "its random masked-LM head moving the embeddings within 25 steps (bench/stage2_drift.py); pretrain's head_warmup "
    "now keeps them, with no gain measured yet"
)


def stage_two_line(sentence_model: bool, starts_head_fresh: bool | None) -> str:
    """The run's line on ULMFiT's stage 2 (a language-model pass over unlabelled_text before fine-tuning): not run
    by a finetune run; for a sentence-embedding checkpoint, or one without a language-model head, why it is not
    advised; for any other, how to run it (the ulmfit flow)."""
    if sentence_model or starts_head_fresh:
        kind = "a sentence-embedding model" if sentence_model else "a checkpoint without a language-model head"
        return f"stage 2 (a language-model pass over unlabelled_text): not run, nor advised for {kind}: " + (
            STAGE_TWO_MEASURED
        )
    return (
        "stage 2 (a language-model pass over unlabelled_text): not run by a finetune run; ULMFiT's stage 2 on this "
        "text is `finetune pretrain` continuing model.checkpoint on it, then this recipe from its checkpoint (or "
        "`finetune ulmfit`: docs/ulmfit.md)"
    )
