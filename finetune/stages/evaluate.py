"""`finetune eval`: score fine-tuned checkpoints on a task split; write report.json and report.md."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from finetune.console import console
from finetune.data.tasks import EncodedTask, read_task_split
from finetune.errors import UserError
from finetune.glue.metrics import compute_metrics
from finetune.glue.specs import task_spec
from finetune.models.heads import fitted_max_length, load_finetuned
from finetune.models.hub import load_tokenizer
from finetune.recipes import EvalRecipe
from finetune.run_dir import check_run_dir_free, prepare_run_dir
from finetune.training.predict import logits_to_predictions, predict_logits

REPORT_JSON, REPORT_MARKDOWN = "report.json", "report.md"
PREDICTIONS_DIR = "predictions"  # one TSV per model, with write_predictions


def run_eval(recipe: EvalRecipe) -> dict:
    """Score every model of the recipe; returns the report written to the run directory."""
    check_run_dir_free(recipe)
    accelerator = Accelerator(cpu=recipe.device == "cpu" or not torch.cuda.is_available())
    spec = task_spec(recipe.task)
    examples = read_task_split(spec, recipe.task.data_dir, recipe.split)
    if examples.labels is None and not recipe.write_predictions:
        raise UserError(f"task '{spec.name}': split '{recipe.split}' has no labels to score against "
                        "(set write_predictions=true to predict it)")
    models = {name: load_finetuned(path, spec, f"models.{name}") for name, path in recipe.models.items()}
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)

    results = {}
    for name, model in models.items():
        tokenizer = load_tokenizer(recipe.models[name], f"models.{name}")
        encoded = EncodedTask(examples, tokenizer, fitted_max_length(recipe.task.max_length, model))
        loader = DataLoader(encoded, batch_size=recipe.batch_size, collate_fn=DataCollatorWithPadding(tokenizer))
        model, loader = accelerator.prepare(model, loader)
        predictions = logits_to_predictions(spec, predict_logits(accelerator, model, loader))
        results[name] = {"checkpoint": recipe.models[name]}
        if examples.labels is not None:
            results[name].update(compute_metrics(spec, predictions, examples.labels))
        if recipe.write_predictions and accelerator.is_main_process:
            write_predictions(run_dir / PREDICTIONS_DIR / f"{name}.tsv", spec, examples.ids, predictions)

    report = {"task": spec.name, "split": recipe.split, "examples": len(examples.texts),
              "metrics": list(spec.metrics), "results": results}
    if accelerator.is_main_process:
        (run_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (run_dir / REPORT_MARKDOWN).write_text(report_markdown(report), encoding="utf-8")
        console.print(report_markdown(report))
        console.print(f"report written to {run_dir / REPORT_MARKDOWN}")
    return report


def write_predictions(path: Path, spec, ids: list[str], predictions) -> None:
    """`index<TAB>prediction` per example: the label name for classes, the score for regression."""
    path.parent.mkdir(parents=True, exist_ok=True)
    values = [f"{value:.3f}" for value in predictions] if spec.is_regression else \
        [spec.labels[int(index)] for index in predictions]
    rows = ["index\tprediction"] + [f"{example_id}\t{value}" for example_id, value in zip(ids, values)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def report_markdown(report: dict) -> str:
    """A Markdown table: one row per model, one column per metric (scores x 100, as GLUE reports them)."""
    metrics = report["metrics"]
    lines = [
        f"# {report['task']} ({report['split']}, {report['examples']} examples)",
        "",
        "| model | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for name, result in report["results"].items():
        scores = [f"{100 * result[metric]:.1f}" if metric in result else "-" for metric in metrics]
        lines.append(f"| {name} | " + " | ".join(scores) + " |")
    return "\n".join(lines) + "\n"
