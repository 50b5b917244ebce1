"""`head_warmup`: a continued checkpoint's language-model head trains alone before the rest of the model does.

A checkpoint without a language-model head (a sentence-embedding model such as all-MiniLM-L6-v2: a bare encoder)
gets a random one when pretraining continues it, and the random head's first gradients move the encoder's
embeddings far from the ones it shipped: bench/stage2_drift.py measured, 25 masked-LM steps into ULMFiT's stage 2
(recipes/ulmfit/minilm-imdb-2-language-model.yaml), a mean cosine of 0.29 between MiniLM's mean-pooled embeddings and
the shipped ones, and a logistic-regression probe on 100 labelled IMDb reviews down from 66.2 to 58.8. With the fresh
head trained alone for 100 steps first (lr 1e-3), the cosine stayed 0.63 and the probe rose to 68.5: what LP-FT
(Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features") found for a classifier's random head.

So `head_warmup.steps: auto` (the default) is AUTO_STEPS when model.checkpoint holds no language-model head and the
head has parameters of its own to train (a masked LM's transform and output bias; an untied decoder's output layer),
else 0: a checkpoint with its head, a head that is only the tied input embeddings, a model trained from scratch
(everything starts fresh; the recipe refuses steps > 0 there). The phase itself, run before the training by the run
driver, is a `WarmupPhase` (training/driver.py): the head's own parameters alone, AdamW at head_warmup.lr, a linear
schedule with the recipe's schedule.warmup_fraction.
"""

from __future__ import annotations

from torch import nn

from finetune.console import console
from finetune.errors import UserError
from finetune.models.language_models import own_head_parameters
from finetune.models.loading import starts_head_fresh
from finetune.recipes.pretrain import HEAD_WARMUP_PHASE
from finetune.training.driver import WarmupPhase
from finetune.training.optim import build_optimizer
from finetune.training.schedules import linear_warmup_decay

AUTO_STEPS = 100  # bench/stage2_drift.py's --head-first 100


def may_warm_up(recipe) -> bool:
    """Whether a run of `recipe` may train its head alone first, asked before the model loads (the accelerator is made
    first, and DDP must then be told that parameters will be frozen after it wraps the model): from the checkpoint's
    config.json where it is stored here, and yes for a hub name not fetched yet."""
    steps, checkpoint = recipe.head_warmup.steps, recipe.model.checkpoint
    if checkpoint is None or steps == 0:
        return False
    return steps != "auto" or starts_head_fresh(checkpoint) is not False


def head_warmup_phase(recipe, language_model, groups: list[list[nn.Parameter]], masked: bool) -> WarmupPhase | None:
    """The run's head warm-up for its loaded (and, with an adapter, adapted) `language_model` whose layer groups are
    `groups`; None when it trains no step. A continued checkpoint's run prints the decision in one line."""
    head, checkpoint = own_head_parameters(language_model), recipe.model.checkpoint
    steps, why = planned_steps(recipe, head)
    section = recipe.head_warmup
    if checkpoint is not None:
        fresh = bool(starts_head_fresh(checkpoint))
        line = decision_line(steps, section.lr, why, masked, fresh)
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not steps:
        return None
    # One parameter group, tagged as the top layer group (the head's) in the logs' learning rates.
    below: list[list[nn.Parameter]] = [[] for _ in groups[:-1]]
    lrs = [section.lr] * len(groups)
    training = recipe.training
    optimizer = build_optimizer(language_model, [*below, head], lrs, training.weight_decay, training.adam_betas)
    fraction = recipe.schedule.warmup_fraction
    schedule = lambda step: linear_warmup_decay(step, steps, fraction)  # the phase's LR multiplier, a pure function
    return WarmupPhase(HEAD_WARMUP_PHASE, steps, head, optimizer, schedule)


def planned_steps(recipe, head: list[nn.Parameter]) -> tuple[int, str]:
    """(steps of the head alone, why) for a run whose language model's own head parameters are `head`."""
    steps, checkpoint = recipe.head_warmup.steps, recipe.model.checkpoint
    if steps != "auto":
        if steps and not head:
            raise UserError(
                f"head_warmup.steps: the language-model head of {checkpoint} has no parameters of its own (its "
                "output layer is the input embeddings, tied), so a warm-up would train nothing: set 0 or auto"
            )
        return steps, "set in the recipe"
    if checkpoint is None:
        return 0, "auto: a model trained from scratch starts fresh everywhere"
    if not starts_head_fresh(checkpoint):
        return 0, "auto: the checkpoint holds its language-model head"
    if not head:
        return 0, "auto: the fresh head has no parameters of its own (its output layer is the input embeddings, tied)"
    return AUTO_STEPS, (
        "auto: the checkpoint holds no language-model head; a random head's first gradients move the encoder's "
        "embeddings, bench/stage2_drift.py"
    )


def decision_line(steps: int, lr: float, why: str, masked: bool, fresh: bool) -> str:
    """The run's line about its head warm-up (`fresh`: the checkpoint holds no language-model head, which the line
    before says)."""
    if not steps:
        return f"head_warmup: none ({why})"
    head, rest = ("masked-LM head", "encoder") if masked else ("language-model head", "rest of the model")
    return (
        f"head_warmup: {steps} steps of the {'fresh ' if fresh else ''}{head} alone at lr {lr:g} before the {rest} "
        f"trains ({why})"
    )
