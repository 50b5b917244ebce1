"""`finetune eval` of multiple-choice models: accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from finetune.data.task_files import task_file
from finetune.kinds.choices.data import read_choices
from finetune.kinds.choices.model import load_finetuned_choice_model
from finetune.kinds.choices.training import choose
from finetune.kinds.evaluation import load_each, models_of, one_task, refuse_ensembles, task_folder, tokenizer_of
from finetune.recipes import EvalRecipe
from finetune.reporting.eval_report import PREDICTIONS_DIR, report_markdown, task_report
from finetune.run_dir import prepare_run_dir
from finetune.tasks.metrics import compute_metrics
from finetune.tasks.specs import TaskSpec
from finetune.training.checkpoints import checkpoint_reading


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
    return task_report(run_dir, recipe, spec, len(questions.ids), results, report_markdown, accelerator.is_main_process)


def write_choice_predictions(path: Path, ids: list[str], labels: list[str]) -> None:
    """`id<TAB>prediction` per question: the label of the chosen choice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["id\tprediction"] + [f"{question_id}\t{label}" for question_id, label in zip(ids, labels)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
