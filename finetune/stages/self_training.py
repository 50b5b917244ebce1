"""Self-training (`unlabelled_text`, `self_training`): a classifier labels text for itself, round after round.

Round 0 is the run the recipe describes (any method). Each later round r loads round r-1's saved checkpoint (its
best weights, its probabilities calibrated where calibration: temperature fitted a T), predicts every unlabelled
row, and trains a new model from model.checkpoint on the labelled rows and at most r x per_class rows of each
predicted class, the most confident (above self_training.threshold where one is set; training/self_training.py
chooses them): every round
relabels all the text with its better teacher and takes more of it (Cascante-Bonilla et al. 2021's curriculum
labelling), and starts again from the pretrained weights, so no round inherits the last one's mistakes in its
weights. Rounds end early when fewer than min_rows rows would join, or the very rows the round before trained on
(the same data and seed train the same model).

RUN_DIR/round-R is each round's own run folder (the later ones with pseudo_labelled.jsonl and a "self_training"
record in their metrics.jsonl); RUN_DIR's checkpoint/, result.json and dev_predictions.jsonl are the kept round's
(self_training.keep: best, the round of the best dev score, round 0 included, so rounds whose pseudo-labels cost
points are dropped, as they did on SST-2 at 8 labels per class; or last), self_training.json and self_training.md
each round's rows and dev scores, metrics.jsonl a "self_training" record per round. `--resume` keeps the rounds
that finished, continues a stopped one from its periodic checkpoint and trains one that saved none anew. With
seeds or draws, every run (draw x seed) runs its own rounds.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import PartialState

from finetune.console import console
from finetune.data.examples import TaskExamples
from finetune.data.unlabelled_text import read_unlabelled_text
from finetune.errors import recipe_key
from finetune.kinds.fine_tuning import RESULT_FILE, say
from finetune.kinds.labelled_rows import class_rows, labelled_rows
from finetune.kinds.method import SelfTrainingChoice, choose_self_training, pseudo_labels_per_class, stage_two_line
from finetune.kinds.registry import kind_named, kind_of
from finetune.models.loading import starts_head_fresh
from finetune.reporting.model_card import add_card_section
from finetune.reporting.self_training import CARD_SECTION, card_text, rounds_markdown
from finetune.run_dir import (
    CHECKPOINT_DIR,
    DEV_PREDICTIONS_FILE,
    METRICS_FILE,
    MetricsLog,
    check_run_dir_free,
    check_same_recipe,
    claim_run_dir,
    prepare_run_dir,
    read_metrics,
    round_folder,
)
from finetune.tasks.specs import TaskSpec, task_spec
from finetune.training.checkpoints import copy_checkpoint, latest_run_checkpoint, latest_training_checkpoint
from finetune.training.driver import run_training
from finetune.training.self_training import PHASE, PseudoLabelled, pseudo_labelled, select_confident, text_key
from finetune.training.techniques import sentence_pooling

SUMMARY_JSON, SUMMARY_MARKDOWN = "self_training.json", "self_training.md"


def read_unlabelled(recipe) -> TaskExamples | None:
    """The recipe's unlabelled_text (the first unlabelled_rows rows), read and checked before any folder is made; None
    without it."""
    if not recipe.unlabelled_text:
        return None
    with recipe_key("unlabelled_text"):
        return read_unlabelled_text(recipe.unlabelled_text, task_spec(recipe.task), recipe.unlabelled_rows)


@dataclass
class SelfTrainingPlan:
    """What the rounds of a run need to know before they start: the decision and its line, the labelled rows per
    class, the rows a round adds per class, each unlabelled row's text key and the keys that may never join."""

    choice: SelfTrainingChoice
    spec: TaskSpec
    unlabelled: TaskExamples
    labelled: dict[str, int]
    per_class: int
    keys: list[tuple[str, ...]]
    excluded: set[tuple[str, ...]]
    dev_is_training: bool = False  # every dev row is a training row too: dev scores cannot rank the rounds


def self_training_plan(recipe, unlabelled: TaskExamples | None) -> SelfTrainingPlan | None:
    """The run's self-training (its line printed: rounds or off, and why), or None without unlabelled text."""
    if unlabelled is None:
        return None
    spec = task_spec(recipe.task)
    assert spec.labels is not None  # the recipe refuses unlabelled_text for a kind without classes
    train, dev = labelled_rows(recipe)
    assert train.labels is not None  # read_labelled_split refuses a training file without labels
    labelled = {name: len(rows) for name, rows in class_rows(train.labels, spec.labels).items()}
    choice = choose_self_training(recipe.self_training.rounds, len(unlabelled.texts), labelled)
    assert choice is not None  # there is unlabelled text
    say(choice.line())
    sentence_model = sentence_pooling(recipe.model.checkpoint, local_files_only=True) is not None
    say(stage_two_line(sentence_model, starts_head_fresh(recipe.model.checkpoint)))
    training_keys = {text_key(texts) for texts in train.texts}
    dev_keys = {text_key(texts) for texts in dev.texts}
    return SelfTrainingPlan(
        choice,
        spec,
        unlabelled,
        labelled,
        pseudo_labels_per_class(recipe.self_training.per_class, labelled),
        [text_key(spec.model_texts(texts)) for texts in unlabelled.texts],
        training_keys | dev_keys,
        dev_is_training=dev_keys <= training_keys,
    )


def run_self_training(recipe, plan: SelfTrainingPlan, resume: bool = False) -> Path:
    """The rounds of a run (see the module docstring) into RUN_DIR/round-R, then the last round's model as the run's;
    returns its checkpoint folder."""
    run_dir = Path(recipe.run_dir)
    if resume and (check_same_recipe(recipe) / RESULT_FILE).is_file():
        console.print(f"{run_dir} finished before: nothing to resume")
        return run_dir / CHECKPOINT_DIR
    # Under several processes only the main one creates (or locks) the folder, after every process has checked it.
    state = PartialState(cpu=recipe.training.device == "cpu" or not torch.cuda.is_available())
    if not resume:
        check_run_dir_free(recipe, latest_run_checkpoint)
    state.wait_for_everyone()
    run_dir = claim_run_dir(recipe, state.is_main_process) if resume else prepare_run_dir(recipe, state.is_main_process)
    state.wait_for_everyone()
    log = MetricsLog(run_dir / METRICS_FILE, state.is_main_process)
    log.truncate(0)  # a resumed run records its rounds again, the kept ones first
    rounds: list[dict] = []
    stopped = None
    for number in range(plan.choice.rounds + 1):
        console.print(f"[bold]self-training round {number}[/bold] (of rounds 0 to {plan.choice.rounds})")
        folder = round_folder(run_dir, number)
        if resume and (folder / RESULT_FILE).is_file():  # its rows were chosen, and it trained on them, before
            say(f"round {number} finished before: kept")
        else:
            rows = None if number == 0 else round_rows(recipe, plan, number)
            stopped = None if rows is None else stop_reason(recipe, plan, number, rows)
            if stopped is not None:
                say(f"self-training stops before round {number}: {stopped}")
                break
            train_round(recipe, number, rows, resume)
        rounds.append(round_summary(plan, number, folder))
        log.write({"phase": PHASE, **rounds[-1]})
        say(round_line(rounds))
    summary = summarise(recipe, plan, rounds, stopped)
    if state.is_main_process:
        write_result(run_dir, summary)
    state.wait_for_everyone()
    return run_dir / CHECKPOINT_DIR


def round_rows(recipe, plan: SelfTrainingPlan, number: int) -> PseudoLabelled:
    """Round `number`'s rows: round number - 1's model labels every unlabelled row, the confident ones join."""
    spec, section = plan.spec, recipe.self_training
    teacher = round_folder(recipe.run_dir, number - 1) / CHECKPOINT_DIR
    say(f"round {number - 1}'s model labels the {len(plan.unlabelled.texts):,} unlabelled rows")
    # The teacher's model is let go before the round's own is built.
    batch_size = 2 * recipe.training.batch_size
    probabilities = kind_of(spec).class_probabilities(str(teacher), recipe, spec, plan.unlabelled, batch_size)
    assert spec.labels is not None  # kind classification
    cap = number * plan.per_class
    selection = select_confident(probabilities, plan.keys, plan.excluded, section.threshold, cap, spec.labels)
    record = {
        "round": number,
        "unlabelled_rows": len(plan.unlabelled.texts),
        "threshold": section.threshold,
        "cap": cap,
        "confident": selection.confident,
        "added": selection.added,
    }
    floor = "" if section.threshold is None else f" at probability >= {section.threshold:g}"
    say(
        f"{sum(selection.confident.values()):,} rows{floor} (not labelled, not dev, each text once); "
        f"{len(selection.rows):,} join, the most confident {cap:,} per class ({described(selection.added)})"
    )
    return pseudo_labelled(selection, plan.unlabelled, spec.model_texts, {"phase": PHASE, **record})


def described(counts: dict[str, int]) -> str:
    """Counts per class in words: `negative 12, positive 9`."""
    return ", ".join(f"{name} {count}" for name, count in counts.items())


def stop_reason(recipe, plan: SelfTrainingPlan, number: int, rows: PseudoLabelled) -> str | None:
    """Why round `number` would teach nothing new, or None: fewer rows than min_rows join, or the very rows (and
    labels) the round before trained on."""
    if len(rows.texts) < recipe.self_training.min_rows:
        return f"{len(rows.texts)} row(s) would join, fewer than self_training.min_rows {recipe.self_training.min_rows}"
    assert plan.spec.labels is not None  # kind classification
    if rows.recorded_in(round_folder(recipe.run_dir, number - 1), plan.spec.text_columns, plan.spec.labels):
        return f"the rows round {number - 1} trained on would join again, with the same labels"
    return None


def train_round(recipe, number: int, rows: PseudoLabelled | None, resume: bool) -> None:
    """Round `number`, trained into its run folder: continued from its periodic checkpoint (`resume`), or from the
    start (over what a round stopped before its first periodic checkpoint left)."""
    folder = round_folder(recipe.run_dir, number)
    from_checkpoint = resume and latest_training_checkpoint(folder) is not None
    single = recipe.model_copy(update={"run_dir": folder, "overwrite": resume and not from_checkpoint})
    stage = kind_named(recipe.task.kind).fine_tuning(single)
    stage.pseudo_labelled = rows
    run_training(stage, from_checkpoint)


def round_summary(plan: SelfTrainingPlan, number: int, folder: Path) -> dict:
    """A finished round in numbers: the rows that joined per class, the training rows, the saved checkpoint's dev
    scores."""
    result = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    records = [record for record in read_metrics(folder / METRICS_FILE) if record.get("phase") == PHASE]
    chosen = records[-1] if records else {}
    added = chosen.get("added", dict.fromkeys(plan.labelled, 0))
    scores = result["best" if result["saved"] == "best" else "last"]
    return {
        "round": number,
        "added": added,
        "confident": chosen.get("confident"),
        "training_rows": sum(plan.labelled.values()) + sum(added.values()),
        "main_metric": result["main_metric"],
        **{name: value for name, value in scores.items() if name.startswith("dev_")},
    }


def round_line(rounds: list[dict]) -> str:
    """The line after a round: the rows that joined and the dev score, beside round 0's."""
    last, first = rounds[-1], rounds[0]
    metric = f"dev_{last['main_metric']}"
    joined = (
        f"{sum(last['added'].values()):,} pseudo-labelled rows ({described(last['added'])})"
        if last["round"]
        else "the labelled rows alone"
    )
    versus = f" (round 0: {first[metric]:.4f})" if len(rounds) > 1 else ""
    score = f"dev {metric.removeprefix('dev_')} {last[metric]:.4f}{versus}"
    return f"self-training round {last['round']}: {joined}; {score}"


def kept_round(rounds: list[dict], keep: str, dev_is_training: bool) -> tuple[int, str]:
    """The round whose model is the run's (self_training.keep), and why, in words."""
    last = rounds[-1]["round"]
    if keep == "last":
        return last, "the last round's (self_training.keep: last)"
    if dev_is_training:
        return last, "the last round's: every dev row is a training row, so dev cannot rank the rounds"
    if len(rounds) == 1:
        return last, "round 0's, the only round trained"
    name = rounds[0]["main_metric"]  # a classifier's metric, higher better, as keep_best reads it
    best = max(rounds, key=lambda entry: (entry[f"dev_{name}"], -entry["round"]))  # the earliest of equals
    return best["round"], f"round {best['round']}'s, the best dev {name} ({best[f'dev_{name}']:.4f})"


def summarise(recipe, plan: SelfTrainingPlan, rounds: list[dict], stopped: str | None) -> dict:
    """self_training.json: the decision, the settings in force, each round's rows and dev scores, and the round kept."""
    kept, why = kept_round(rounds, recipe.self_training.keep, plan.dev_is_training)
    return {
        "rounds_planned": plan.choice.rounds,
        "reason": plan.choice.reason,
        "final_round": rounds[-1]["round"],
        "kept_round": kept,
        "kept_because": why,
        "keep": recipe.self_training.keep,
        "stopped": stopped,
        "threshold": recipe.self_training.threshold,
        "per_class": plan.per_class,
        "min_rows": recipe.self_training.min_rows,
        "unlabelled_rows": len(plan.unlabelled.texts),
        "labelled_rows": plan.labelled,
        "main_metric": rounds[-1]["main_metric"],
        "rounds": rounds,
    }


def write_result(run_dir: Path, summary: dict) -> None:
    """The kept round's model as the run's: its checkpoint (with a card section on the rounds) and dev predictions,
    self_training.json and .md, and result.json last (the round's, with the summary): it says the run finished."""
    kept = summary["kept_round"]
    final = round_folder(run_dir, kept)
    (run_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (run_dir / SUMMARY_MARKDOWN).write_text(rounds_markdown(summary), encoding="utf-8")
    if (final / DEV_PREDICTIONS_FILE).is_file():
        shutil.copyfile(final / DEV_PREDICTIONS_FILE, run_dir / DEV_PREDICTIONS_FILE)
    checkpoint = copy_checkpoint(final / CHECKPOINT_DIR, run_dir / CHECKPOINT_DIR)
    add_card_section(checkpoint, CARD_SECTION, card_text(summary))
    result = json.loads((final / RESULT_FILE).read_text(encoding="utf-8"))
    keys = ("final_round", "kept_round", "kept_because", "stopped", "rounds_planned")
    result["self_training"] = {key: summary[key] for key in keys} | {
        "pseudo_labelled_rows": sum(summary["rounds"][kept]["added"].values())
    }
    (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    console.print(f"self-training: the run's model is {summary['kept_because']}; saved to {checkpoint}")
