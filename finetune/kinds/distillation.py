"""Distillation (recipe section `distillation`): a fine-tuned teacher's logits are soft targets for the model being
trained (Hinton, Vinyals and Dean 2015), mixed with the hard labels.

The teacher reads every training row's text with its own tokenizer before training starts (so teacher and student
may tokenize differently), and the rows of unlabelled_text, which train on its soft targets alone: more transfer
data for free. Its logits travel with each row through batching (`TeacherTargets`, `with_teacher_logits`); the
loss is soft_weight x T^2 x KL(teacher || student) at temperature T (regression: the squared distance to the
teacher's score) + (1 - soft_weight) x the hard labels' loss over the labelled rows. The logits are written to the
run folder at the start, so a --resume trains on the very same targets without the teacher.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from finetune.data.examples import TaskExamples
from finetune.errors import InputError, UserError, recipe_key
from finetune.models.backbones import stack_of_blocks
from finetune.models.mean_pooling import backbone_config
from finetune.recipes import FinetuneRecipe, load_recipe
from finetune.tasks.specs import IGNORE_INDEX, TaskSpec, task_spec
from finetune.training.checkpoints import HYPERPARAMETERS_FILE

TEACHER_LOGITS = "teacher_logits"  # a batch's key: the teacher's logits of its rows
TEACHER_FILE = "teacher_logits.npy"  # in the run folder: the training rows' targets, what --resume reads back
NO_CLASS = IGNORE_INDEX  # the hard label of a row of unlabelled_text: none (its loss is the soft targets')


@dataclass
class Teacher:
    """A fine-tuned checkpoint of the task, ready to give its logits for rows as the student's task reads them."""

    folder: Path
    predictor: Any  # its kind's predictor (kinds/classification/predictor.py's): `logits(examples, name)`

    def logits(self, examples: TaskExamples, name: str | None) -> np.ndarray:
        """Its logits of `examples`, whose texts are already what a model reads (the task's text template filled);
        `name`: what the line on rows longer than its max_length calls them (None: no line)."""
        return np.asarray(self.predictor.logits(examples, name), dtype=np.float32)

    def dev_logits(self, examples: TaskExamples) -> np.ndarray:
        """Its logits of the run's dev rows, which the run scores as its own (the student's retention)."""
        return self.logits(examples, "dev")


def load_teacher(folder: Path, spec: TaskSpec, batch_size: int, make_predictor: Callable) -> Teacher:
    """The teacher in `folder` (distillation.teacher), refused in one line where it cannot teach this task: not a
    fine-tuned checkpoint, another kind, other labels, or a text template other than the task's. `make_predictor`:
    the task kind's (TaskKind.predictor), which is the teacher's too."""
    with recipe_key("distillation.teacher"):
        recipe_file = Path(folder) / HYPERPARAMETERS_FILE
        if not recipe_file.is_file():
            raise InputError(
                f"no {HYPERPARAMETERS_FILE}: the teacher must be a checkpoint fine-tuned by finetune (a run's "
                "checkpoint folder)",
                source=folder,
            )
        try:
            recipe = load_recipe(recipe_file, expected_stage="finetune", check_paths=False)
        except UserError as error:
            raise InputError(f"not a fine-tuned checkpoint ({error})", source=folder) from error
        assert isinstance(recipe, FinetuneRecipe)
        teacher_spec = task_spec(recipe.task)
        if teacher_spec.kind != spec.kind:  # before its predictor of another kind is made
            raise InputError(f"the teacher is a {teacher_spec.kind} model and this task is {spec.kind}", source=folder)
        predictor = make_predictor(str(folder), recipe, teacher_spec, batch_size, None)
        problem = teaching_problem(predictor.spec, spec)  # the predictor's: a tagger's tags are its model's
        if problem is not None:
            raise InputError(problem, source=folder)
        # The rows it is given are the student's model texts (the same template, checked): read as they are.
        predictor = replace(predictor, spec=replace(predictor.spec, text_template=None))
    return Teacher(Path(folder), predictor)


def teaching_problem(teacher: TaskSpec, student: TaskSpec) -> str | None:
    """Why a teacher of task `teacher` (of the same kind: load_teacher checked) cannot teach task `student`, or None."""
    if teacher.labels != student.labels:
        return (
            f"the teacher's labels ({', '.join(teacher.labels or ())}) are not the task's "
            f"({', '.join(student.labels or ())}) in the same order"
        )
    if teacher.text_template != student.text_template:
        return (
            f"the teacher reads task.text {teacher.text_template!r} and this task {student.text_template!r}: give "
            "both the same"
        )
    return None


def unlabelled_rows(unlabelled: TaskExamples, spec: TaskSpec) -> TaskExamples:
    """unlabelled_text's rows as training rows: the texts a model reads, and no hard label (a class of NO_CLASS; a
    score, or a multi-label row, of NaN)."""
    count = len(unlabelled.texts)
    labels: np.ndarray
    if spec.label_sets:
        assert spec.labels is not None  # a multi-label task lists its labels
        labels = np.full((count, len(spec.labels)), np.nan, dtype=np.float32)
    elif spec.is_regression:
        labels = np.full(count, np.nan, dtype=np.float32)
    else:
        labels = np.full(count, NO_CLASS, dtype=np.int64)
    return TaskExamples(
        [spec.model_texts(tuple(texts)) for texts in unlabelled.texts],
        labels,
        [f"unlabelled-{row}" for row in range(count)],
    )


def joined(labelled: TaskExamples, unlabelled: TaskExamples) -> TaskExamples:
    """The labelled training rows, then the unlabelled ones."""
    assert labelled.labels is not None and unlabelled.labels is not None
    return TaskExamples(
        [*labelled.texts, *unlabelled.texts],
        np.concatenate([labelled.labels, unlabelled.labels.astype(labelled.labels.dtype)]),
        [*labelled.ids, *unlabelled.ids],
    )


def saved_targets(run_dir: Path, rows: int) -> np.ndarray | None:
    """The targets a stopped run started with (RUN_DIR/teacher_logits.npy), for --resume; None without the file."""
    path = Path(run_dir) / TEACHER_FILE
    if not path.is_file():
        return None
    targets = np.load(path)
    if len(targets) != rows:
        raise UserError(
            f"distillation: {path} holds the teacher's logits of {len(targets):,} rows, the run now reads {rows:,} "
            "(the data changed since it started); restore it, or start again with overwrite=true"
        )
    return targets


class TeacherTargets(torch.utils.data.Dataset):
    """`encoded` (a task's EncodedTask) with each item's teacher logits beside it; its `lengths` and `windows` are
    the encoded task's."""

    def __init__(self, encoded, logits: np.ndarray):
        assert len(encoded) == len(logits)
        self.encoded, self.logits = encoded, logits

    def __len__(self) -> int:
        return len(self.encoded)

    def __getattr__(self, name: str) -> Any:  # lengths, windows, ...: the encoded task's
        if name in ("encoded", "logits"):
            raise AttributeError(name)
        return getattr(self.encoded, name)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.encoded[index], TEACHER_LOGITS: self.logits[index]}


def with_teacher_logits(collate: Callable[[list[dict]], dict]) -> Callable[[list[dict]], dict]:
    """`collate` for items of TeacherTargets: the items collated without their logits, which are stacked beside."""

    def collated(items: list[dict]) -> dict:
        logits = torch.from_numpy(np.stack([item[TEACHER_LOGITS] for item in items]))
        batch = collate([{key: value for key, value in item.items() if key != TEACHER_LOGITS} for item in items])
        batch[TEACHER_LOGITS] = logits
        return batch

    return collated


def distillation_loss(
    logits: torch.Tensor,
    teacher: torch.Tensor,
    labels: torch.Tensor,
    hard_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    temperature: float,
    soft_weight: float,
) -> torch.Tensor:
    """soft_weight x the soft-target loss (mean over the rows) + (1 - soft_weight) x `hard_loss` over the labelled
    rows, weighed by their share of the batch. Class logits: T^2 x KL(softmax(teacher / T) || softmax(logits / T));
    a multi-label row (float labels, one column per label): T^2 x the binary cross-entropy of sigmoid(logits / T)
    against sigmoid(teacher / T), its mean over the labels; a regression's scores (float labels): the squared
    distance between the two scores."""
    teacher = teacher.to(logits.dtype)
    if labels.is_floating_point() and labels.dim() == 2:
        targets = torch.sigmoid(teacher / temperature)
        terms = functional.binary_cross_entropy_with_logits(logits / temperature, targets, reduction="none")
        # Minus the targets' own entropy: the divergence, 0 where the student gives the teacher's probabilities.
        entropy = functional.binary_cross_entropy_with_logits(teacher / temperature, targets, reduction="none")
        soft = (terms - entropy).mean(-1) * temperature**2
        labelled = ~torch.isnan(labels).any(-1)
    elif labels.is_floating_point():
        soft = (logits.squeeze(-1) - teacher.squeeze(-1)).pow(2)
        labelled = ~torch.isnan(labels)
    else:
        soft = softened_divergence(logits, teacher, temperature)
        labelled = labels != NO_CLASS
    loss = soft_weight * soft.mean()
    if soft_weight < 1 and bool(labelled.any()):
        share = labelled.float().mean()
        loss = loss + (1 - soft_weight) * share * hard_loss(logits[labelled], labels[labelled])
    return loss


def tagging_distillation_loss(
    logits: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The summed soft-target loss of a tagger's batch: T^2 x KL(teacher || student) at each tagged token (a word's,
    where `labels` is not IGNORE_INDEX), `teacher` holding each sentence's targets of its tagged words in order (NaN
    rows: a word the teacher did not read, or padding)."""
    tagged = labels != IGNORE_INDEX
    rows, positions = tagged.nonzero(as_tuple=True)
    words = (tagged.long().cumsum(dim=1) - 1)[rows, positions]  # the how-manieth tagged token of its sentence
    inside = words < teacher.shape[1]
    rows, positions, words = rows[inside], positions[inside], words[inside]
    targets = teacher[rows, words].to(logits.dtype)
    known = ~torch.isnan(targets).any(-1)
    return softened_divergence(logits[rows, positions][known].float(), targets[known].float(), temperature).sum()


def softened_divergence(logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each row's T^2 x KL(softmax(teacher / T) || softmax(logits / T)): Hinton et al.'s soft-target loss, T^2 keeping
    its gradients' size whatever T."""
    student_log = functional.log_softmax(logits / temperature, dim=-1)
    teacher_log = functional.log_softmax(teacher / temperature, dim=-1)
    return functional.kl_div(student_log, teacher_log, log_target=True, reduction="none").sum(-1) * temperature**2


def tagged_word_targets(teacher_words: list[np.ndarray], student_positions: list[list[int | None]]) -> np.ndarray:
    """Per sentence, the teacher's logits of the words the student tags, in their order (a word the student does not
    read has no tagged token), padded with NaN rows to the longest: one array the batches index."""
    chosen = [
        words[[word for word, position in enumerate(positions) if position is not None]]
        for words, positions in zip(teacher_words, student_positions)
    ]
    longest = max((len(rows) for rows in chosen), default=0)
    tags = teacher_words[0].shape[1] if teacher_words else 0
    targets = np.full((len(chosen), max(longest, 1), tags), np.nan, dtype=np.float32)
    for sentence, rows in enumerate(chosen):
        targets[sentence, : len(rows)] = rows
    return targets


@contextlib.contextmanager
def last_hidden_states(model) -> Iterator[list[torch.Tensor]]:
    """Inside, each forward of `model` appends the output of its last block (the hidden states DistilBERT's cosine
    loss aligns): a hook on the model's stack of blocks, whatever its family and head."""
    found = stack_of_blocks(model.base_model)
    assert found is not None  # hidden_problem checked the model has one
    captured: list[torch.Tensor] = []

    def keep(module, inputs, output) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = found[1][-1].register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


def hidden_cosine_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """1 - the cosine similarity of the two models' last hidden states, averaged over the real tokens (DistilBERT's
    cosine embedding loss)."""
    real = torch.ones(student.shape[:2], dtype=torch.bool, device=student.device) if mask is None else mask.bool()
    similarity = functional.cosine_similarity(student[real], teacher[real].to(student.dtype), dim=-1)
    return (1 - similarity).mean()


def hidden_problem(teacher, teacher_tokenizer, student, student_tokenizer) -> str | None:
    """Why the two models' hidden states cannot be compared token by token (distillation.hidden_weight), or None:
    the same tokens (vocabularies) and the same hidden size, and a stack of blocks in each."""
    if teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        return "the teacher and the student tokenize differently, so their hidden states are not of the same tokens"
    sizes = [getattr(backbone_config(model.config), "hidden_size", None) for model in (teacher, student)]
    if sizes[0] is None or sizes[0] != sizes[1]:
        return f"the teacher's hidden size ({sizes[0]}) is not the student's ({sizes[1]})"
    if stack_of_blocks(teacher.base_model) is None or stack_of_blocks(student.base_model) is None:
        return "the models have no stack of blocks whose last output to compare"
    return None


def retention(student: dict[str, float], teacher: dict[str, float], metric: str) -> float | None:
    """The student's score of `metric` as a share of the teacher's on the same dev rows (None where either is
    missing or the teacher's is not positive)."""
    key = f"dev_{metric}"
    if key not in student or key not in teacher or teacher[key] <= 0:
        return None
    return student[key] / teacher[key]


def distillation_record(teacher: Teacher, teacher_dev: dict[str, float], best: dict[str, float], metric: str) -> dict:
    """result.json's `distillation`: the teacher, its scores on the run's dev rows, and the student's retention."""
    return {
        "teacher": str(teacher.folder),
        "teacher_dev": teacher_dev,
        "student_dev": best,
        "retention": retention(best, teacher_dev, metric),
        "metric": metric,
    }


def card_section(record: dict, recipe) -> str:
    """The model card's Distillation section: teacher, scores and retention, the loss's settings."""
    metric = record["metric"]
    teacher, student = record["teacher_dev"].get(f"dev_{metric}"), record["student_dev"].get(f"dev_{metric}")
    kept = record["retention"]
    config = recipe.distillation
    layers = recipe.model.keep_layers
    blocks = "every other block" if layers == "every_other" else f"blocks {layers}"
    made = f"; the student was made of {blocks} of {recipe.model.checkpoint}" if layers is not None else ""
    intro = (
        f"Distilled from the teacher `{record['teacher']}` (soft targets at temperature {config.temperature}, "
        f"{config.soft_weight:.0%} of the loss; the hard labels the rest){made}."
    )
    lines = [
        intro,
        "",
        "| | dev " + metric + " |",
        "|---|---:|",
        f"| teacher | {teacher:.4f} |" if teacher is not None else "| teacher | - |",
        f"| this model | {student:.4f} |" if student is not None else "| this model | - |",
        f"| retention | {kept:.1%} |" if kept is not None else "| retention | - |",
    ]
    return "\n".join(lines)
