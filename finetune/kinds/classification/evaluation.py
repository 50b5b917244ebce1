"""`finetune eval` of sequence classifiers (kind classification, and regression, which shares it): every model of
`models` and every ensemble of `ensembles` (and its members) scored on one split of the task, with a per-class table,
and with write_predictions each one's predictions. GLUE's map of tasks to checkpoints is commands/evaluate.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from finetune.errors import recipe_key
from finetune.inference.calibration import temperature_of
from finetune.inference.ensemble import check_one_task, ensemble_outputs
from finetune.inference.predict import example_logits, logits_to_predictions
from finetune.kinds.evaluation import examples_to_score, one_task
from finetune.kinds.recipe import TextTaskSection
from finetune.models.heads import load_finetuned
from finetune.models.hub import load_tokenizer
from finetune.recipes import EvalRecipe
from finetune.reporting.eval_report import PREDICTIONS_DIR, report_markdown, task_report
from finetune.run_dir import prepare_run_dir
from finetune.tasks.metrics import class_report, compute_metrics
from finetune.tasks.specs import TaskSpec
from finetune.training.checkpoints import checkpoint_reading


def run_classification_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every model of `models` and every ensemble of `ensembles` (and its members) on `split` of `task`."""
    task = one_task(recipe)
    assert isinstance(task, TextTaskSection)  # the sequence-classification kinds read text columns
    examples = examples_to_score(spec, task, recipe)
    models, ensembles = recipe.models or {}, recipe.ensembles or {}
    keys = {path: f"models.{name}" for name, path in models.items()}  # each checkpoint loaded and run once
    for name, members in ensembles.items():
        check_one_task(f"ensembles.{name}", members)
        keys.update({path: f"ensembles.{name}" for path in members if path not in keys})
    loaded = {path: named_finetuned(path, spec, key, recipe.trust_remote_code) for path, key in keys.items()}
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)

    # checkpoint -> logits (or scores) of every example, over the checkpoint's calibration temperature: an ensemble
    # averages its members' probabilities as each predicts them (the labels of one model are the same either way)
    outputs = {}
    for path, model in loaded.items():
        with recipe_key(keys[path]):
            tokenizer = load_tokenizer(path, trust_remote_code=recipe.trust_remote_code)
        reading = checkpoint_reading(path, task.max_length, task.long_documents)
        logits = example_logits(accelerator, model, tokenizer, examples, reading, recipe.batch_size, name=recipe.split)
        outputs[path] = logits / temperature_of(model.config)

    def scored(row: dict, model_outputs: np.ndarray, name: str | None = None) -> dict:
        """`row` with the scores of these outputs; with `name`, their predictions are also written."""
        predictions = logits_to_predictions(spec, model_outputs)
        if examples.labels is not None:
            row.update(compute_metrics(spec, predictions, examples.labels))
            if name is not None and spec.labels is not None:  # a model's (not an ensemble member's), of classes
                row["classes"] = class_report(spec.labels, predictions, examples.labels)
        if name is not None and recipe.write_predictions and accelerator.is_main_process:
            write_predictions(run_dir / PREDICTIONS_DIR / f"{name}.tsv", spec, examples.ids, predictions)
        return row

    results = {name: scored({"checkpoint": path}, outputs[path], name) for name, path in models.items()}
    for name, members in ensembles.items():
        results[name] = scored({"ensemble": members}, ensemble_outputs(spec, [outputs[path] for path in members]), name)
        results[name]["members"] = [scored({"checkpoint": path}, outputs[path]) for path in members]

    return task_report(
        run_dir, recipe, spec, len(examples.texts), results, report_markdown, accelerator.is_main_process
    )


def write_predictions(path: Path, spec, ids: Sequence[str], predictions) -> None:
    """`index<TAB>prediction` per example: the label name for classes, the score for regression."""
    path.parent.mkdir(parents=True, exist_ok=True)
    values = (
        [f"{value:.3f}" for value in predictions]
        if spec.is_regression
        else [spec.labels[int(index)] for index in predictions]
    )
    rows = ["index\tprediction"] + [f"{example_id}\t{value}" for example_id, value in zip(ids, values)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def named_finetuned(checkpoint: str, spec, key: str, trust_remote_code: bool):
    """`load_finetuned`, its refusals named by the recipe key that gave the checkpoint (models.NAME, tasks.NAME)."""
    with recipe_key(key):
        return load_finetuned(checkpoint, spec, trust_remote_code=trust_remote_code)
