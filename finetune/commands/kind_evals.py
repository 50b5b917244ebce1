"""`finetune eval` for the task kinds other than classification: taggers (entity-level scores and a table per
entity type), multiple-choice models (accuracy), question answering (SQuAD's EM and F1) and multi-label classifiers
(micro/macro F1 at each checkpoint's threshold, a table per label). Each scores its `models` one by one on `split`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from finetune.console import console
from finetune.data.choices import read_choices
from finetune.data.spans import read_squad
from finetune.data.tagging import read_conll, tag_indices
from finetune.data.tasks import read_task_split, split_source, task_file
from finetune.errors import UserError, recipe_key
from finetune.glue.metrics import compute_metrics, entity_types_table, label_table, multilabel_metrics, tagging_metrics
from finetune.glue.specs import TaskSpec
from finetune.glue.squad_metrics import best_threshold, squad_scores
from finetune.inference.predict import example_logits
from finetune.models.choices import load_finetuned_choice_model
from finetune.models.hub import load_tokenizer
from finetune.models.multilabel import DEFAULT_THRESHOLD, load_finetuned_multilabel, saved_threshold
from finetune.models.question_answering import answers_no_answer, load_finetuned_qa
from finetune.models.taggers import load_finetuned_tagger, model_tags
from finetune.recipes import EvalRecipe, TaskConfig
from finetune.reporting.eval_report import PREDICTIONS_DIR, report_markdown, write_report
from finetune.run_dir import prepare_run_dir
from finetune.training.checkpoints import checkpoint_reading
from finetune.training.choices import choose
from finetune.training.multilabel import label_probabilities, label_sets
from finetune.training.spans import answer_questions, checkpoint_span_reading, gold_answers
from finetune.training.tagging import tag_sentences


def refuse_ensembles(recipe: EvalRecipe, models: str) -> None:
    """These kinds score their models one by one: an ensemble is refused in one line."""
    if recipe.ensembles:
        raise UserError(f"ensembles: {models} are scored one by one; list them under models")


def one_task(recipe: EvalRecipe) -> TaskConfig:
    """The `task` of a one-task recipe (EvalRecipe's validator: task or tasks; run_eval sends a recipe with tasks to
    the GLUE evaluation)."""
    assert recipe.task is not None
    return recipe.task


def task_folder(recipe: EvalRecipe) -> Path:
    """The task's data_dir, which TaskConfig's validator requires of the kinds scored here."""
    data_dir = one_task(recipe).data_dir
    assert data_dir is not None
    return data_dir


def models_of(recipe: EvalRecipe) -> dict[str, str]:
    """`models`: report name -> checkpoint. EvalRecipe's validator requires models or ensembles with a task, and
    these kinds refuse ensembles first (refuse_ensembles)."""
    assert recipe.models is not None
    return recipe.models


def load_each(recipe: EvalRecipe, load: Callable) -> dict[str, Any]:
    """Every checkpoint of `models` by its report name, loaded with `load(path, trust_remote_code=...)`; a failure
    names its key (models.NAME)."""
    loaded = {}
    for name, path in models_of(recipe).items():
        with recipe_key(f"models.{name}"):
            loaded[name] = load(path, trust_remote_code=recipe.trust_remote_code)
    return loaded


def tokenizer_of(recipe: EvalRecipe, name: str):
    """The tokenizer saved with the checkpoint of models.NAME."""
    with recipe_key(f"models.{name}"):
        return load_tokenizer(models_of(recipe)[name], trust_remote_code=recipe.trust_remote_code)


def run_tagging_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every tagger of `models` on `split` of a tagging task: entity-level scores and a table per entity
    type; with write_predictions, predictions/MODEL.txt in CoNLL columns (word, tag, predicted tag)."""
    refuse_ensembles(recipe, "taggers (task kind tokens)")
    path = task_file(spec, task_folder(recipe), recipe.split)
    sentences = read_conll(path, spec.tag_column)
    assert sentences.tags is not None  # read_conll reads the tags (with_tags) or refuses the file
    taggers = load_each(recipe, load_finetuned_tagger)
    for name, model in taggers.items():  # a tag the model does not know is one line naming file and line
        with recipe_key(f"models.{name}"):
            tag_indices(sentences, model_tags(model))
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    results = {}
    for name, model in taggers.items():
        checkpoint = models_of(recipe)[name]
        tokenizer = tokenizer_of(recipe, name)
        max_length = checkpoint_reading(checkpoint, one_task(recipe).max_length).max_length
        predicted = tag_sentences(
            model,
            tokenizer,
            sentences,
            model_tags(model),
            max_length,
            recipe.batch_size,
            accelerator.device,
            name=recipe.split,
        )
        results[name] = {
            "checkpoint": checkpoint,
            **tagging_metrics(sentences.tags, predicted),
            "entity_types": entity_types_table(sentences.tags, predicted),
        }
        if recipe.write_predictions and accelerator.is_main_process:
            write_tagged(run_dir / PREDICTIONS_DIR / f"{name}.txt", sentences, predicted)
    report = {
        "task": spec.name,
        "split": recipe.split,
        "examples": len(sentences.words),
        "metrics": list(spec.metrics),
        "results": results,
    }
    if accelerator.is_main_process:
        write_report(run_dir, report, tagging_report_markdown(report))
    return report


def run_spans_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every question-answering model of `models` on `split`: exact match and F1 (and HasAns / NoAns for
    SQuAD 2.0 data, with the best no-answer threshold); with write_predictions, predictions/MODEL.json."""
    refuse_ensembles(recipe, "question-answering models (task kind spans)")
    path = task_file(spec, task_folder(recipe), recipe.split)
    questions = read_squad(path, with_answers=not recipe.write_predictions)
    labelled = any(question.answers or question.unanswerable for question in questions.questions)
    if not labelled and not recipe.write_predictions:
        raise UserError(f"{path} has no answers to score: set write_predictions: true to write the predictions")
    models = load_each(recipe, load_finetuned_qa)
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    golds, results = gold_answers(questions), {}
    for name, model in models.items():
        checkpoint = models_of(recipe)[name]
        tokenizer = tokenizer_of(recipe, name)
        reading = checkpoint_span_reading(one_task(recipe), checkpoint, model)
        answers = answer_questions(model, tokenizer, questions, reading, recipe.batch_size, accelerator.device)
        results[name] = {"checkpoint": checkpoint, "null_threshold": reading.null_threshold}
        if labelled:
            results[name].update(squad_scores(golds, [answer.text for answer in answers]))
            if questions.has_unanswerable and answers_no_answer(model):
                best_f1, threshold = best_threshold(
                    golds, [answer.span for answer in answers], [answer.null_margin for answer in answers]
                )
                results[name].update({"best_f1": best_f1, "best_f1_thresh": threshold})
        if recipe.write_predictions and accelerator.is_main_process:
            target = run_dir / PREDICTIONS_DIR / f"{name}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            predictions = {question.id: answer.text for question, answer in zip(questions.questions, answers)}
            target.write_text(json.dumps(predictions, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    metrics = ["f1", "exact"] + (
        ["HasAns_f1", "HasAns_exact", "NoAns_f1", "NoAns_exact"] if questions.has_unanswerable else []
    )
    report = {
        "task": spec.name,
        "split": recipe.split,
        "examples": len(questions.questions),
        "metrics": metrics if labelled else [],
        "results": results,
    }
    if accelerator.is_main_process:
        write_report(run_dir, report, spans_report_markdown(report))
    return report


def spans_report_markdown(report: dict) -> str:
    """The scores table, and for SQuAD 2.0 data the no-answer threshold each model used and the best one."""
    lines = [report_markdown(report)]
    for name, result in report["results"].items():
        if "best_f1_thresh" in result:
            lines.append(
                f"- {name}: no answer when the no-answer score beats the best span by more than "
                f"{result['null_threshold']:g}; the threshold {result['best_f1_thresh']:.3f} would have "
                f"scored the best F1 on this split, {100 * result['best_f1']:.1f} (task.null_threshold; "
                "chosen on this split, that score is optimistic)"
            )
    return "\n".join(lines) + "\n"


def write_tagged(path: Path, sentences, predicted: list[list[str]]) -> None:
    """CoNLL columns: word, its tag in the file, the predicted tag; a blank line after each sentence."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = [
        "\n".join(f"{word} {tag} {guess}" for word, tag, guess in zip(words, tags, guesses))
        for words, tags, guesses in zip(sentences.words, sentences.tags, predicted)
    ]
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")


def tagging_report_markdown(report: dict) -> str:
    """The scores table of every tagger, then each tagger's table per entity type."""
    lines = [report_markdown(report)]
    for name, result in report["results"].items():
        lines += [
            f"## {name}: by entity type",
            "",
            "| type | entities | precision | recall | f1 |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {kind} | {row['entities']:,} | {100 * row['precision']:.1f} | {100 * row['recall']:.1f} | "
            f"{100 * row['f1']:.1f} |"
            for kind, row in result["entity_types"].items()
        ]
        lines.append("")
    return "\n".join(lines)


def run_choices_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every multiple-choice model of `models` on `split` (accuracy); with write_predictions,
    predictions/MODEL.tsv with each question's id and predicted choice label."""
    refuse_ensembles(recipe, "multiple-choice models (task kind choices)")
    questions = read_choices(task_file(spec, task_folder(recipe), recipe.split))
    models = load_each(recipe, load_finetuned_choice_model)
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    results = {}
    for name, model in models.items():
        checkpoint = models_of(recipe)[name]
        tokenizer = tokenizer_of(recipe, name)
        max_length = checkpoint_reading(checkpoint, one_task(recipe).max_length).max_length
        probabilities = choose(model, tokenizer, questions, max_length, recipe.batch_size, accelerator.device)
        predicted = np.asarray([int(row.argmax()) for row in probabilities])
        results[name] = {"checkpoint": checkpoint, **compute_metrics(spec, predicted, np.asarray(questions.answers))}
        if recipe.write_predictions and accelerator.is_main_process:
            labels = [question_labels[index] for question_labels, index in zip(questions.labels, predicted)]
            write_choice_predictions(run_dir / PREDICTIONS_DIR / f"{name}.tsv", questions.ids, labels)
    report = {
        "task": spec.name,
        "split": recipe.split,
        "examples": len(questions.ids),
        "metrics": list(spec.metrics),
        "results": results,
    }
    if accelerator.is_main_process:
        write_report(run_dir, report, report_markdown(report))
    return report


def write_choice_predictions(path: Path, ids: list[str], labels: list[str]) -> None:
    """`id<TAB>prediction` per question: the label of the chosen choice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["id\tprediction"] + [f"{question_id}\t{label}" for question_id, label in zip(ids, labels)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def run_multilabel_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every multi-label classifier of `models` on `split`: micro F1, macro F1 and subset accuracy at each
    checkpoint's saved threshold (or task.threshold, a number), and a table per label; with write_predictions,
    predictions/MODEL.tsv with each example's predicted label set."""
    refuse_ensembles(recipe, "multi-label classifiers (task kind multilabel)")
    task, labels = one_task(recipe), spec.labels
    assert labels is not None  # a multi-label task's spec always has its label set (glue/specs.py multilabel_spec)
    if task.threshold == "dev":
        raise UserError(
            "task.threshold: dev is chosen while fine-tuning and saved with the checkpoint, which eval "
            "applies; give a number to score at another one, or leave it out"
        )
    examples = read_task_split(spec, task.data_dir, recipe.split)
    if examples.labels is None and not recipe.write_predictions:
        raise UserError(
            f"task '{spec.name}': {split_source(spec, task.data_dir, recipe.split)} has no "
            f"'{spec.label_column}' column: no labels to score against (set write_predictions=true to "
            "predict it)"
        )
    models = load_each(recipe, lambda path, **trust: load_finetuned_multilabel(path, spec, **trust))
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    results = {}
    for name, model in models.items():
        path = models_of(recipe)[name]
        tokenizer = tokenizer_of(recipe, name)
        reading = checkpoint_reading(path, task.max_length, task.long_documents)
        probabilities = label_probabilities(
            example_logits(accelerator, model, tokenizer, examples, reading, recipe.batch_size, name=recipe.split)
        )
        threshold = task.threshold or saved_threshold(model)
        if threshold is None:
            console.print(f"models.{name}: {path} has no saved decision threshold: {DEFAULT_THRESHOLD} is used")
            threshold = DEFAULT_THRESHOLD
        predicted = probabilities > threshold
        results[name] = {"checkpoint": path, "threshold": threshold}
        if examples.labels is not None:
            results[name] |= {
                **multilabel_metrics(examples.labels, predicted),
                "labels": label_table(examples.labels, predicted, labels),
            }
        if recipe.write_predictions and accelerator.is_main_process:
            write_label_sets(
                run_dir / PREDICTIONS_DIR / f"{name}.tsv",
                spec,
                examples.ids,
                label_sets(probabilities, labels, threshold),
            )
    report = {
        "task": spec.name,
        "split": recipe.split,
        "examples": len(examples.texts),
        "metrics": list(spec.metrics),
        "results": results,
    }
    if accelerator.is_main_process:
        write_report(run_dir, report, multilabel_report_markdown(report))
    return report


def write_label_sets(path: Path, spec: TaskSpec, ids: list[str], predicted: list[list[str]]) -> None:
    """`index<TAB>labels` per example: its predicted labels joined by the task's label separator (empty: none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["index\tlabels"] + [
        f"{example_id}\t{spec.label_separator.join(labels)}" for example_id, labels in zip(ids, predicted)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def multilabel_report_markdown(report: dict) -> str:
    """The scores table of every model (with the threshold it was scored at), then each model's table per label."""
    lines = [report_markdown(report), "| model | threshold |", "|---|---:|"]
    lines += [f"| {name} | {result['threshold']:g} |" for name, result in report["results"].items()]
    lines.append("")
    for name, result in report["results"].items():
        if "labels" not in result:
            continue
        lines += [
            f"## {name}: by label",
            "",
            "| label | examples | precision | recall | f1 |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {label} | {row['examples']:,} | {100 * row['precision']:.1f} | {100 * row['recall']:.1f} | "
            f"{100 * row['f1']:.1f} |"
            for label, row in result["labels"].items()
        ]
        lines.append("")
    return "\n".join(lines)
