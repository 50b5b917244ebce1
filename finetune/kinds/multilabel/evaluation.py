"""`finetune eval` of multi-label classifiers: micro/macro F1 at each checkpoint's threshold, a table per label."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from finetune.console import console
from finetune.errors import UserError
from finetune.inference.predict import example_logits
from finetune.kinds.evaluation import examples_to_score, load_each, models_of, one_task, refuse_ensembles, tokenizer_of
from finetune.kinds.multilabel.metrics import label_table, multilabel_metrics
from finetune.kinds.multilabel.model import DEFAULT_THRESHOLD, load_finetuned_multilabel, saved_threshold
from finetune.kinds.multilabel.recipe import MultilabelSection
from finetune.kinds.multilabel.spec import multilabel_spec
from finetune.kinds.multilabel.training import label_probabilities, label_sets
from finetune.recipes import EvalRecipe
from finetune.reporting.eval_report import PREDICTIONS_DIR, report_markdown, task_report
from finetune.run_dir import prepare_run_dir
from finetune.tasks.specs import TaskSpec
from finetune.training.checkpoints import checkpoint_reading


def run_multilabel_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every multi-label classifier of `models` on `split`: micro F1, macro F1 and subset accuracy at each
    checkpoint's saved threshold (or task.threshold, a number), and a table per label; with write_predictions,
    predictions/MODEL.tsv with each example's predicted label set."""
    refuse_ensembles(recipe, "multi-label classifiers (task kind multilabel)")
    task, labels = one_task(recipe), spec.labels
    assert isinstance(task, MultilabelSection)  # the kind of the spec is the section's
    assert labels is not None  # a multi-label task's spec always has its label set (kinds/multilabel/recipe.py)
    if task.threshold == "dev":
        raise UserError(
            "task.threshold: dev is chosen while fine-tuning and saved with the checkpoint, which eval "
            "applies; give a number to score at another one, or leave it out"
        )
    examples = examples_to_score(spec, task, recipe)
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
    return task_report(
        run_dir, recipe, spec, len(examples.texts), results, multilabel_report_markdown, accelerator.is_main_process
    )


def write_label_sets(path: Path, spec: TaskSpec, ids: Sequence[str], predicted: list[list[str]]) -> None:
    """`index<TAB>labels` per example: its predicted labels joined by the task's label separator (empty: none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    separator = multilabel_spec(spec).label_separator
    rows = ["index\tlabels"] + [f"{example_id}\t{separator.join(labels)}" for example_id, labels in zip(ids, predicted)]
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
