"""The `multitask` recipe: several tasks on one shared encoder, one head per task (MT-DNN, Liu et al. 2019).

Written as a finetune recipe whose `task` is a list `tasks`, plus how batches are drawn from them (`sampling`), the
weight of each task's loss (`loss_weights`) and what picks the kept checkpoint (`metric_for_best`: the mean of every
task's main dev metric, or one task's). Every other key (model, training, schedule, unfreezing, pooling, keep_best,
...) is shared: each task's own finetune recipe is that body with its task section, validated as any finetune recipe
is, so a key's checks and defaults are the ones users know.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from finetune.recipes.base import Section, TrainingRunRecipe
from finetune.recipes.describe import KeyField, key_fields
from finetune.recipes.finetune import FinetuneRecipe

MULTITASK_KEYS = ("tasks", "sampling", "loss_weights", "metric_for_best")  # the recipe's own; the rest is shared
RUN_KEYS = ("stage", "description", "run_dir", "overwrite", "checkpoint_every", "keep_checkpoints")
MEAN = "mean"  # metric_for_best: the mean of every task's main dev metric
TASK_FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a task's name is its checkpoint's folder name
# A shared key the multi-task run does not take (yet), and why: refused in one line, never silently ignored.
REFUSED_SHARED_KEYS = {
    "seeds": "run the recipe once per seed (seed=N on the command line)",
    "draws": "labels_per_class draws are a single-task experiment",
    "distillation": "a teacher per task is not supported; distil each task's checkpoint afterwards",
    "unlabelled_text": "self-training is a single-task stage; continue one task from the multi-task checkpoint",
    "self_training": "self-training is a single-task stage",
    "contrastive": "the tasks train plainly (method: plain)",
}
REFUSED_TASK_KEYS = {
    "dev_split": "give each task a dev file (the held-out rows of several tasks would share one record)",
    "long_documents": "the tasks read max_length tokens per example (windows are a single-task feature)",
    "hub": "give each task's files in data_dir (source files)",
}


def multitask_location(location: list) -> list:
    """A problem's key as the user wrote it: a task's key under tasks.N, a shared key at the top (each task's finetune
    recipe holds both, pydantic names them tasks.N.task.KEY and tasks.N.KEY)."""
    if len(location) >= 3 and location[0] == "tasks" and isinstance(location[1], int):
        return ["tasks", location[1], *location[3:]] if location[2] == "task" else location[2:]
    return location


def multitask_key_fields(finetune_fields: list[KeyField]) -> list[KeyField]:
    """A multitask recipe's keys (`finetune recipes --keys multitask`): its own, a finetune recipe's shared keys at the
    top (`finetune_fields`: every key of a finetune recipe), each task's keys under tasks.N (N: its place)."""
    fields = [field for field in key_fields(MultiTaskRecipe) if field.key != "tasks"]
    own = {field.key.partition(".")[0] for field in fields}
    for key, field, variant in finetune_fields:
        top = key.partition(".")[0]
        if top == "task" and key.split(".")[1] in (*REFUSED_TASK_KEYS, "source"):
            continue
        if top == "task":
            tagged = tuple((tag.replace("task.", "tasks.N.", 1), value) for tag, value in variant)
            fields.append(KeyField(key.replace("task.", "tasks.N.", 1), field, tagged))
        elif top not in (*own, *REFUSED_SHARED_KEYS, "method", "draw"):
            fields.append(KeyField(key, field, variant))
    return fields


class SamplingConfig(Section):
    """Which task each optimizer step's batch comes from (MT-DNN: proportional; T5: a temperature on it)."""

    rule: Literal["proportional", "temperature", "equal"] = Field(
        "proportional",
        description="proportional: a task's share of the steps is its share of the training rows (MT-DNN); "
        "temperature: that share to the power 1/temperature, renormalised (T5: small tasks drawn more often); equal: "
        "every task as often",
    )
    temperature: float = Field(2.0, gt=0, description="rule temperature: 1 is proportional, higher moves toward equal")

    @model_validator(mode="after")
    def _temperature_of_its_rule(self) -> SamplingConfig:
        if self.rule != "temperature" and "temperature" in self.model_fields_set and self.temperature != 2.0:
            raise ValueError(f"temperature is read only with rule temperature (rule is {self.rule}); remove it")
        return self


class MultiTaskRecipe(TrainingRunRecipe):
    """`finetune multitask`: one encoder, a head per task, batches drawn from the tasks by `sampling`."""

    stage: Literal["multitask"]
    tasks: list[FinetuneRecipe] = Field(
        min_length=2,
        description="the tasks, each a finetune task section (name, data_dir, kind, ...); every other key of the "
        "recipe (model, training, unfreezing, ...) is shared by them; each task's name is its checkpoint folder",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="how steps are dealt to tasks")
    loss_weights: dict[str, float] = Field(
        default_factory=dict, description="task name -> its loss's weight (default 1.0 each), e.g. {rte: 2.0}"
    )
    metric_for_best: str = Field(
        MEAN,
        description="what keep_best and early stopping follow: mean (every task's main dev metric, averaged) or a "
        "task's name (its main dev metric)",
    )

    @model_validator(mode="before")
    @classmethod
    def _each_task_a_finetune_recipe(cls, data: Any) -> Any:
        """Each task section with the shared keys becomes a finetune recipe, validated as one."""
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
            return data  # refused by the fields' own validation
        shared = {key: value for key, value in data.items() if key not in MULTITASK_KEYS and key not in RUN_KEYS}
        for key, why in REFUSED_SHARED_KEYS.items():
            if shared.get(key) not in (None, []):  # a saved recipe's null stays harmless
                raise ValueError(f"{key}: not in a multitask recipe ({why}); remove it")
        if shared.get("method", "plain") not in ("plain", "auto"):
            raise ValueError("method: a multitask recipe trains every task plainly; remove it or set plain")
        members = []
        for index, task in enumerate(data["tasks"]):
            if isinstance(task, dict):
                for key, why in REFUSED_TASK_KEYS.items():
                    if task.get(key) is not None or (key == "hub" and task.get("source", "files") != "files"):
                        raise ValueError(f"tasks.{index}.{key}: not in a multitask recipe ({why}); remove it")
            run = {key: data[key] for key in ("run_dir", "description") if key in data}
            members.append({**shared, **run, "method": "plain", "stage": "finetune", "task": task})
        own = {key: value for key, value in data.items() if key in MULTITASK_KEYS or key in RUN_KEYS}
        return {**own, "tasks": members}

    @model_validator(mode="after")
    def _tasks_named_once(self) -> MultiTaskRecipe:
        names = self.task_names()
        for index, name in enumerate(names):
            if not TASK_FOLDER_NAME.match(name):
                raise ValueError(
                    f"tasks.{index}.name: '{name}' names the task's checkpoint folder: letters, digits, _ . -"
                )
            if names.index(name) != index:
                raise ValueError(f"tasks.{index}.name: '{name}' is task {names.index(name)}'s name too; name each once")
        for name, weight in self.loss_weights.items():
            if name not in names:
                raise ValueError(f"loss_weights.{name}: not a task of the recipe ({', '.join(names)})")
            if not weight > 0:
                raise ValueError(f"loss_weights.{name}: a weight above 0 (got {weight})")
        if self.metric_for_best != MEAN and self.metric_for_best not in names:
            raise ValueError(
                f"metric_for_best: '{self.metric_for_best}' is not a task of the recipe; mean or one of "
                + ", ".join(names)
            )
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> dict[str, Any]:
        """The recipe as a user writes it: the shared keys once, each task's section in `tasks`."""
        data = handler(self)
        members = data.pop("tasks")
        left = ("task", "method", *RUN_KEYS, *MULTITASK_KEYS, *REFUSED_SHARED_KEYS)
        shared = {key: value for key, value in members[0].items() if key not in left}
        return {**data, **shared, "tasks": [member["task"] for member in members]}

    def task_names(self) -> list[str]:
        return [member.task.name for member in self.tasks]

    def loss_weight(self, name: str) -> float:
        return self.loss_weights.get(name, 1.0)

    # What the run driver (training/driver.py) reads of a training recipe: the shared keys, the same in every task's.

    @property
    def seed(self) -> int:
        return self.tasks[0].seed

    @property
    def training(self):
        return self.tasks[0].training

    @property
    def schedule(self):
        return self.tasks[0].schedule

    @property
    def unfreezing(self):
        return self.tasks[0].unfreezing

    @property
    def model(self):
        return self.tasks[0].model

    @property
    def eval_every(self) -> int | None:
        return self.tasks[0].eval_every

    @property
    def keep_best(self) -> bool:
        return self.tasks[0].keep_best

    @property
    def early_stopping_patience(self) -> int | None:
        return self.tasks[0].early_stopping_patience
