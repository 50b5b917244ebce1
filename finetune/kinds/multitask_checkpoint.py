"""What `finetune multitask` writes into a checkpoint folder (recipes/multitask_checkpoints.py's layout): a
Hugging Face checkpoint per task with its model card, and multitask.json."""

from __future__ import annotations

import json
from pathlib import Path

from finetune.recipes import recipe_to_yaml
from finetune.recipes.multitask_checkpoints import MANIFEST_FILE
from finetune.reporting.model_card import add_card_section, classifier_card, write_card
from finetune.run_dir import METRICS_FILE, read_metrics
from finetune.training.checkpoints import HYPERPARAMETERS_FILE


class SavedTasks:
    """The tasks' models as one saved checkpoint (what the run driver's saves call `save_pretrained` on)."""

    def __init__(self, names, models, recipes, tokenizer, recipe):
        self.names, self.models, self.recipes, self.tokenizer, self.recipe = names, models, recipes, tokenizer, recipe

    def save_pretrained(self, folder: str, safe_serialization: bool = True) -> None:
        entries = []
        for name, model, recipe in zip(self.names, self.models, self.recipes):
            task_folder = Path(folder) / name
            model.save_pretrained(str(task_folder), safe_serialization=safe_serialization)
            self.tokenizer.save_pretrained(str(task_folder))
            (task_folder / HYPERPARAMETERS_FILE).write_text(recipe_to_yaml(recipe), encoding="utf-8")
            entries.append({"name": name, "kind": recipe.task.kind, "folder": name})
        manifest = {
            "tasks": entries,
            "metric_for_best": self.recipe.metric_for_best,
            "base": self.recipe.model.checkpoint,
        }
        (Path(folder) / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def task_records(records: list[dict], name: str) -> list[dict]:
    """The run's metrics.jsonl records as one task's run would have written them (its dev scores unprefixed)."""
    prefix = f"dev_{name}_"
    return [{key.replace(prefix, "dev_", 1) if key.startswith(prefix) else key: value for key, value in record.items()
             if not key.startswith("dev_") or key.startswith(prefix)} for record in records]  # fmt: skip


def write_task_cards(checkpoint: Path, members, names: list[str], result: dict, run_dir: Path) -> None:
    """Each task's model card (its kind's, from its own scores), with a section listing every task and score."""
    records = read_metrics(run_dir / METRICS_FILE)
    saved = result["saved"]
    table = "| task | kind | dev " + ("(best)" if saved == "best" else "(last)") + " |\n|---|---|---|\n"
    for name in names:
        task = result["tasks"][name]
        score = task[saved].get(f"dev_{task['main_metric']}")
        table += f"| {name} | {task['kind']} | {task['main_metric']} {score:.4f} |\n" if score is not None else ""
    text = (f"Trained with the finetune toolkit's `finetune multitask`: one encoder shared by {len(names)} tasks, a "
            f"head each; this folder is the encoder with one task's head. The run kept the evaluation of the best "
            f"{result['main_metric']}.\n\n{table}")  # fmt: skip
    for name, member in zip(names, members):
        folder = checkpoint / name
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        model_type = config.get("model_type", "")
        task_result = result["tasks"][name]
        card = classifier_card(member.recipe, member.spec, task_result, task_records(records, name), model_type,
                               member.kind.card(member.recipe, member.spec, model_type, task_result))  # fmt: skip
        write_card(card, folder)
        add_card_section(folder, "Multi-task training", text)
