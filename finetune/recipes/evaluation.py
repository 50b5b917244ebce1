"""The `eval` recipe: one model on a task file, or a GLUE suite with a submission folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_serializer, model_validator

from finetune.glue.specs import GLUE_TASKS
from finetune.recipes.base import InputFolder, RunRecipe, Section
from finetune.recipes.multitask_checkpoints import multitask_tasks, task_checkpoint
from finetune.recipes.task import TaskConfig


def _repeated_member(members: list[str]) -> str | None:
    """The first checkpoint listed twice, if any."""
    return next((path for path in sorted(members) if members.count(path) > 1), None)


class GlueTaskEntry(Section):
    """One GLUE task of an eval recipe's `tasks`: its fine-tuned checkpoints (or one ensemble) and, optionally, its
    own folder."""

    # Before checkpoints: its validator reads it.
    ensemble: list[str] | None = Field(
        None,
        min_length=2,
        description="instead of checkpoints: classifiers whose class probabilities (STS-B: "
        "scores) are averaged, e.g. a forward and a backward one (ULMFiT's bidirectional model); the ensemble is "
        "the task's score and submission, each member is reported beside it",
    )
    checkpoints: list[str] = Field(
        default_factory=list,
        validate_default=True,
        description="fine-tuned checkpoint folders; several (runs, seeds) are aggregated",
    )
    data_dir: InputFolder | None = Field(
        None, description="the task's folder (mnli's also holding diagnostic.tsv for AX); null: glue_dir/FOLDER"
    )

    @model_validator(mode="before")
    @classmethod
    def _checkpoints_alone(cls, value: Any) -> Any:
        """`rte: runs/rte/checkpoint` and `rte: [a, b]` are short for `rte: {checkpoints: [...]}`."""
        if isinstance(value, str):
            return {"checkpoints": [value]}
        return {"checkpoints": value} if isinstance(value, list) else value

    @field_validator("checkpoints")
    @classmethod
    def _checkpoints_or_an_ensemble(cls, checkpoints: list[str], info: ValidationInfo) -> list[str]:
        if "ensemble" not in info.data:  # the ensemble is wrong, and reported
            return checkpoints
        if checkpoints and info.data["ensemble"] is not None:
            raise ValueError("give checkpoints (runs, aggregated) or ensemble (averaged into one model), not both")
        if not checkpoints and info.data["ensemble"] is None:
            raise ValueError("give at least one checkpoint (or an ensemble)")
        return checkpoints

    @model_validator(mode="after")
    def _distinct_checkpoints(self) -> GlueTaskEntry:
        repeated = _repeated_member(self.checkpoints or self.ensemble or [])
        if repeated:
            raise ValueError(f"checkpoint {repeated} is listed twice (it would count twice in the mean)")
        return self


GLUE_ONLY_EVAL_KEYS = ("glue_dir", "source", "max_length", "submission", "allow_incomplete", "multitask_checkpoint")
SINGLE_TASK_EVAL_KEYS = ("models", "ensembles", "split", "write_predictions")


class EvalRecipe(RunRecipe):
    """`finetune eval`: score fine-tuned checkpoints on one task split, or on GLUE tasks (GLUE scores, submission)."""

    stage: Literal["eval"]
    # One task (custom or GLUE): `models` scored on `split`.
    task: TaskConfig | None = Field(None, description="the one task to score models on (or use tasks)")
    split: str = Field("dev", description="task: which split file to score: dev -> dev.tsv")
    models: dict[str, str] | None = Field(
        None, min_length=1, description="task: report row name -> fine-tuned checkpoint folder"
    )
    ensembles: dict[str, list[str]] | None = Field(
        None,
        min_length=1,
        description="task: report row name -> fine-tuned checkpoints whose class probabilities "
        "(regression: scores) are averaged, e.g. [forward, backward] (ULMFiT's bidirectional model); each member "
        "is scored beside the ensemble",
    )
    write_predictions: bool = Field(
        False,
        description="task: also write predictions/MODEL.tsv (index, predicted label name or score); a split "
        "without labels (test) is then predicted but not scored",
    )
    # GLUE: a map of tasks to checkpoints.
    tasks: dict[str, GlueTaskEntry] | None = Field(
        None,
        min_length=1,
        description="GLUE task -> checkpoint folder, list of folders (runs/seeds, aggregated), "
        "or {checkpoints, data_dir}: dev scores, GLUE scores; mnli also scores mnli-mm and predicts AX",
    )
    multitask_checkpoint: InputFolder | None = Field(
        None,
        description="instead of tasks: a multi-task checkpoint (finetune multitask's RUN_DIR/checkpoint); every GLUE "
        "task it has a head for is scored (and with submission predicted) by that head",
    )
    glue_dir: InputFolder | None = Field(
        None,
        description="tasks: the GLUE root in download_glue_data.py's layout (CoLA/, SST-2/, ..., MNLI/, diagnostic/)",
    )
    source: Literal["files", "hub"] = Field(
        "files", description="tasks: files (glue_dir or each data_dir) or hub (nyu-mll/glue; needs a network)"
    )
    max_length: int | None = Field(
        None, gt=1, description="tasks: tokens read per example; null: each checkpoint's own task.max_length"
    )
    submission: bool = Field(
        False,
        description="tasks: also predict every test file (each task's best checkpoint on dev) into "
        "RUN_DIR/submission.zip for the GLUE leaderboard",
    )
    allow_incomplete: bool = Field(
        False,
        description="tasks: score the listed tasks whose dev data and checkpoints exist, leave out the others (one "
        "line says which and why), and with submission write the archive without the tasks it lacks (listed); "
        "false: any of them missing is an error",
    )
    batch_size: int = Field(64, gt=0, description="examples per forward pass")
    device: Literal["auto", "cpu"] = Field("auto", description="auto: the GPU when there is one, else the CPU")
    trust_remote_code: bool = Field(
        False,
        strict=True,
        description="run Python code shipped with the checkpoints (their config's auto_map); "
        "only for code you have read: false refuses such checkpoints",
    )

    @model_validator(mode="before")
    @classmethod
    def _tasks_of_a_multitask_checkpoint(cls, data: Any) -> Any:
        """multitask_checkpoint: the map of tasks to checkpoints, one per GLUE task the checkpoint has a head for."""
        if not isinstance(data, dict) or not isinstance(data.get("multitask_checkpoint"), str):
            return data
        folder = data["multitask_checkpoint"]
        if data.get("tasks") is not None or data.get("task") is not None:
            raise ValueError("multitask_checkpoint: it gives the tasks; leave task and tasks out")
        heads = multitask_tasks(folder)
        if heads is None and not Path(folder).exists():
            return data  # the path checks name the missing folder (a recipe checked without them stays valid)
        if heads is None:
            raise ValueError(f"multitask_checkpoint: {folder} is not a multi-task checkpoint (no multitask.json in it)")
        glue = {name: str(Path(folder) / entry["folder"]) for name, entry in heads.items() if name in GLUE_TASKS}
        if not glue:
            raise ValueError(f"multitask_checkpoint: {folder} has no GLUE task's head (it has {', '.join(heads)})")
        return {**data, "tasks": glue}

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> dict[str, Any]:
        """With multitask_checkpoint, the recipe without the tasks it gave, so that a saved recipe loads again."""
        data = handler(self)
        if self.multitask_checkpoint is not None:
            data["tasks"] = None
        return data

    @model_validator(mode="after")
    def _each_task_of_a_multitask_checkpoint(self) -> EvalRecipe:
        """A multi-task checkpoint named for a task is that task's head (the folder's task folder)."""
        try:
            for name, entry in (self.tasks or {}).items():
                for key in ("checkpoints", "ensemble"):
                    folders = getattr(entry, key)
                    if folders and (resolved := [task_checkpoint(folder, name) for folder in folders]) != folders:
                        setattr(entry, key, resolved)  # assigned only when changed: assignment validates again
            if self.task is not None and self.models is not None:
                models = {row: task_checkpoint(folder, self.task.name) for row, folder in self.models.items()}
                if models != self.models:
                    self.models = models
            if self.task is not None and self.ensembles is not None:
                ensembles = {row: [task_checkpoint(folder, self.task.name) for folder in members]
                             for row, members in self.ensembles.items()}  # fmt: skip
                if ensembles != self.ensembles:
                    self.ensembles = ensembles
        except ValueError as error:
            raise ValueError(str(error)) from None
        return self

    @model_validator(mode="after")
    def _one_task_or_a_map(self) -> EvalRecipe:
        if self.multitask_checkpoint is not None and self.tasks is None:
            return self  # its folder is not there yet: the path checks refuse it before anything runs
        if (self.task is None) == (self.tasks is None):
            raise ValueError(
                "give task and models (one task) or tasks (GLUE task -> checkpoints), not both"
                if self.task is not None
                else "give task and models (one task) or tasks (GLUE tasks)"
            )
        # Keys of the other shape must keep their defaults (a saved, resolved recipe holds every key).
        changed = {key for key, field in type(self).model_fields.items() if getattr(self, key) != field.default}
        if self.task is not None:
            if self.models is None and self.ensembles is None:
                raise ValueError(
                    "models: required key is missing (report row name -> checkpoint folder; or "
                    "ensembles: name -> checkpoints)"
                )
            self._check_ensembles()
            misplaced = [key for key in GLUE_ONLY_EVAL_KEYS if key in changed]
            if misplaced:
                raise ValueError(f"{', '.join(misplaced)}: only with tasks (GLUE), not with a single task")
            return self
        assert self.tasks is not None  # task is None here, and one of task and tasks is given (checked first)
        misplaced = [key for key in SINGLE_TASK_EVAL_KEYS if key in changed]
        if misplaced:
            raise ValueError(
                f"{', '.join(misplaced)}: only with task; tasks are scored on dev (and test with submission)"
            )
        if self.source == "hub" and (self.glue_dir is not None or any(entry.data_dir for entry in self.tasks.values())):
            raise ValueError("source hub reads no folders; remove glue_dir and data_dir")
        for name, entry in self.tasks.items():
            spec = GLUE_TASKS.get(name)
            if spec is None:
                raise ValueError(
                    f"tasks.{name}: not a GLUE task ({', '.join(GLUE_TASKS)}); score a custom task with task and models"
                )
            if spec.predicted_by is not None:
                raise ValueError(
                    f"tasks.{name}: predicted by the {spec.predicted_by} model; give the checkpoints "
                    f"under tasks.{spec.predicted_by}"
                )
            if self.source == "files" and entry.data_dir is None and self.glue_dir is None:
                raise ValueError(f"tasks.{name}: no data: give its data_dir, or glue_dir for every task")
        return self

    def _check_ensembles(self) -> None:
        """Each ensemble: two or more distinct members, and a report row name of its own."""
        for name, members in (self.ensembles or {}).items():
            if len(members) < 2:
                raise ValueError(f"ensembles.{name}: an ensemble needs at least two checkpoints")
            repeated = _repeated_member(members)
            if repeated:
                raise ValueError(
                    f"ensembles.{name}: checkpoint {repeated} is listed twice (it would count twice in the mean)"
                )
            if name in (self.models or {}):
                raise ValueError(f"ensembles.{name}: models has a row of that name too; name the ensemble otherwise")
