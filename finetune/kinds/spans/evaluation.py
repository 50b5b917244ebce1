"""`finetune eval` of question-answering models: SQuAD's exact match and F1 (HasAns / NoAns for SQuAD 2.0 data)."""

from __future__ import annotations

import json

from finetune.data.task_files import task_file
from finetune.errors import UserError
from finetune.kinds.evaluation import load_each, models_of, one_task, refuse_ensembles, task_folder, tokenizer_of
from finetune.kinds.spans.data import read_squad
from finetune.kinds.spans.metrics import best_threshold, squad_scores
from finetune.kinds.spans.model import answers_no_answer, load_finetuned_qa
from finetune.kinds.spans.training import answer_questions, checkpoint_span_reading, gold_answers
from finetune.recipes import EvalRecipe
from finetune.reporting.eval_report import PREDICTIONS_DIR, report_markdown, task_report
from finetune.run_dir import prepare_run_dir
from finetune.tasks.specs import TaskSpec


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
    shown = metrics if labelled else []
    return task_report(
        run_dir,
        recipe,
        spec,
        len(questions.questions),
        results,
        spans_report_markdown,
        accelerator.is_main_process,
        shown,
    )


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
