"""`finetune eval`: score fine-tuned checkpoints on a task split; write report.json and report.md."""

from __future__ import annotations

import json

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


def run_eval(recipe: EvalRecipe) -> dict:
    """Score every model of the recipe; returns the report written to the run directory."""
    check_run_dir_free(recipe)
    accelerator = Accelerator(cpu=recipe.device == "cpu" or not torch.cuda.is_available())
    spec = task_spec(recipe.task)
    examples = read_task_split(spec, recipe.task.data_dir, recipe.split)
    if examples.labels is None:
        raise UserError(f"task '{spec.name}': split '{recipe.split}' has no labels to score against")
    models = {name: load_finetuned(path, spec, f"models.{name}") for name, path in recipe.models.items()}
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)

    results = {}
    for name, model in models.items():
        tokenizer = load_tokenizer(recipe.models[name], f"models.{name}")
        encoded = EncodedTask(examples, tokenizer, fitted_max_length(recipe.task.max_length, model))
        loader = DataLoader(encoded, batch_size=recipe.batch_size, collate_fn=DataCollatorWithPadding(tokenizer))
        model, loader = accelerator.prepare(model, loader)
        predictions = logits_to_predictions(spec, predict_logits(accelerator, model, loader))
        results[name] = {"checkpoint": recipe.models[name], **compute_metrics(spec, predictions, examples.labels)}

    report = {"task": spec.name, "split": recipe.split, "examples": len(examples.texts),
              "metrics": list(spec.metrics), "results": results}
    if accelerator.is_main_process:
        (run_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (run_dir / REPORT_MARKDOWN).write_text(report_markdown(report), encoding="utf-8")
        console.print(report_markdown(report))
        console.print(f"report written to {run_dir / REPORT_MARKDOWN}")
    return report


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
        lines.append(f"| {name} | " + " | ".join(f"{100 * result[metric]:.1f}" for metric in metrics) + " |")
    return "\n".join(lines) + "\n"
