"""Distillation (recipe section `distillation`, kinds/distillation.py): a fine-tuned teacher's logits as soft targets
mixed with the hard labels, the teacher labelling unlabelled_text too, a student made of some of its blocks
(model.keep_layers), an exact --resume, a teacher with another tokenizer, and the refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional
from transformers import AutoModelForSequenceClassification
from typer.testing import CliRunner

from finetune import predict
from finetune.cli import app
from finetune.kinds.distillation import NO_CLASS, TEACHER_FILE, distillation_loss
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.finetune import RESULT_FILE, run_finetune
from tests.conftest import finetune_recipe, interrupted_at_step, one_error_line, save_tiny_masked_lm, write_yaml
from tests.tiny_families import save_tiny_checkpoint

CE = functional.cross_entropy
UNLABELLED = ["the film was great .", "the plot was awful .", "really dull"]


def test_the_loss_mixes_the_teachers_soft_targets_with_the_hard_labels():
    torch.manual_seed(0)
    student, teacher, labels = torch.randn(4, 3), torch.randn(4, 3), torch.tensor([0, 2, 1, 1])
    temperature = 2.0
    kl = (
        torch.softmax(teacher / temperature, -1)
        * (torch.log_softmax(teacher / temperature, -1) - torch.log_softmax(student / temperature, -1))
    ).sum(-1)
    soft = (kl * temperature**2).mean()
    assert torch.allclose(distillation_loss(student, teacher, labels, CE, temperature, 1.0), soft)
    assert torch.allclose(distillation_loss(student, teacher, labels, CE, temperature, 0.0), CE(student, labels))
    mixed = distillation_loss(student, teacher, labels, CE, temperature, 0.3)
    assert torch.allclose(mixed, 0.3 * soft + 0.7 * CE(student, labels))
    assert distillation_loss(teacher, teacher, labels, CE, temperature, 1.0).abs() < 1e-6  # nothing left to learn
    # A row without a class (unlabelled_text) counts in the soft part only; the hard part weighs its share.
    unlabelled = torch.tensor([0, NO_CLASS, 1, 1])
    rows = torch.tensor([0, 2, 3])
    expected = 0.5 * soft + 0.5 * 0.75 * CE(student[rows], unlabelled[rows])
    assert torch.allclose(distillation_loss(student, teacher, unlabelled, CE, temperature, 0.5), expected)


def test_a_regressions_soft_target_is_the_teachers_score():
    student, teacher = torch.tensor([[1.0], [2.0], [0.0]]), torch.tensor([[0.0], [2.5], [1.0]])
    scores = torch.tensor([1.5, float("nan"), 0.0])  # the second: a row of unlabelled_text
    mse = lambda logits, labels: functional.mse_loss(logits.squeeze(-1), labels)
    soft = torch.tensor([1.0, 0.25, 1.0]).mean()
    hard = (2 / 3) * torch.tensor([0.25, 0.0]).mean()
    assert torch.allclose(distillation_loss(student, teacher, scores, mse, 2.0, 0.4), 0.4 * soft + 0.6 * hard)


def test_a_multilabel_rows_soft_targets_are_each_labels_probability():
    torch.manual_seed(1)
    student, teacher, temperature = torch.randn(3, 4), torch.randn(3, 4), 2.0
    labels = torch.tensor([[1.0, 0, 0, 1], [float("nan")] * 4, [0, 1, 0, 0]])  # the second: a row of unlabelled_text
    bce = functional.binary_cross_entropy_with_logits
    p, q = torch.sigmoid(teacher / temperature), torch.sigmoid(student / temperature)
    divergence = (p * (p.log() - q.log()) + (1 - p) * ((1 - p).log() - (1 - q).log())).mean(-1)
    soft = (divergence * temperature**2).mean()
    rows = torch.tensor([0, 2])
    hard = (2 / 3) * bce(student[rows], labels[rows])
    mixed = distillation_loss(student, teacher, labels, bce, temperature, 0.25)
    assert torch.allclose(mixed, 0.25 * soft + 0.75 * hard, atol=1e-6)
    assert distillation_loss(teacher, teacher, labels, bce, temperature, 1.0).abs() < 1e-6


def test_a_multilabel_student_learns_from_its_teacher(tmp_path):
    from tests.kinds.test_multilabel import multilabel_recipe, write_marker_task

    task = write_marker_task(tmp_path / "task")
    base = save_tiny_masked_lm(tmp_path / "lm", dropout=0.0)
    data = multilabel_recipe(base, task, tmp_path / "teacher")
    data["training"]["epochs"] = 2
    teacher = run_finetune(load_recipe(write_yaml(tmp_path / "teacher.yaml", data)))
    data = multilabel_recipe(teacher, task, tmp_path / "student")
    data.update({"distillation": {"teacher": str(teacher), "soft_weight": 1.0}, "unfreezing": {"mode": "none"}})
    data["training"].update({"epochs": 1, "log_every": 1})
    run_finetune(load_recipe(write_yaml(tmp_path / "student.yaml", data)))
    first = next(record["loss"] for record in read_metrics(tmp_path / "student" / "metrics.jsonl") if "loss" in record)
    assert first < 1e-6  # the student is its teacher (no dropout): nothing to learn before its first update
    record = json.loads((tmp_path / "student" / RESULT_FILE).read_text())["distillation"]
    teacher_best = json.loads((teacher.parent / RESULT_FILE).read_text())["best"]
    # The teacher's score on the same dev rows at the threshold it saved: its own run's best.
    metric = record["metric"]
    assert record["teacher_dev"][f"dev_{metric}"] == pytest.approx(teacher_best[f"dev_{metric}"])


def test_the_cosine_loss_compares_the_real_tokens_last_hidden_states():
    from finetune.kinds.distillation import hidden_cosine_loss, last_hidden_states
    from tests.models.test_student import tiny_classifier

    student = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    teacher = torch.tensor([[[2.0, 0.0], [1.0, 0.0], [-1.0, 0.0]]])
    # Token 1: the same direction (0), token 2: orthogonal (1), token 3: padding (left out).
    assert hidden_cosine_loss(student, teacher, torch.tensor([[1, 1, 0]])) == pytest.approx(0.5)
    assert hidden_cosine_loss(teacher, teacher, None) == pytest.approx(0.0, abs=1e-6)
    model, tokenizer = tiny_classifier("bert")
    inputs = tokenizer(["the film was great ."], return_tensors="pt")
    with torch.no_grad(), last_hidden_states(model) as states:
        expected = model(**inputs, output_hidden_states=True).hidden_states[-1]
    assert len(states) == 1 and torch.equal(states[0], expected)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A tiny 2-block BERT classifier fine-tuned on the generated task, without dropout: the teacher."""
    folder = tmp_path_factory.mktemp("teacher")
    task = write_task_with_more_rows(folder / "task")
    base = save_tiny_masked_lm(folder / "lm", dropout=0.0)
    data = finetune_recipe(base, task, folder / "run")
    data.update({"unfreezing": {"mode": "none"}})
    data["training"].update({"epochs": 2, "lr": 5e-3})
    return run_finetune(load_recipe(write_yaml(folder / "teacher.yaml", data)))


def write_task_with_more_rows(folder: Path) -> Path:
    from tests.conftest import write_task

    return write_task(folder, train_rows=48)


def student_recipe(teacher: Path, tmp_path: Path, name: str, **distillation) -> dict:
    """A student of the teacher's own weights (or some of its blocks) taught by it for one epoch of 6 steps."""
    data = finetune_recipe(teacher, teacher.parent.parent / "task", tmp_path / name)
    data.update({"unfreezing": {"mode": "none"}, "distillation": {"teacher": str(teacher), **distillation}})
    data["training"].update({"epochs": 1, "lr": 5e-3})
    return data


def test_a_student_that_is_its_teacher_has_nothing_to_learn_and_the_hard_labels_take_the_rest(teacher, tmp_path):
    """Before its first update, a student with the teacher's weights (no dropout) gives the teacher's logits: with
    soft_weight 1 its loss is 0; with soft_weight 0 it is the hard labels' loss of the same run without a teacher."""
    first_losses = {}
    arms = {
        "soft": {"soft_weight": 1.0},
        "soft+hidden": {"soft_weight": 1.0, "hidden_weight": 1.0},
        "hard": {"soft_weight": 0.0},
        "none": None,
    }
    for name, distillation in arms.items():
        data = student_recipe(teacher, tmp_path, name, **(distillation or {}))
        if distillation is None:
            del data["distillation"]
        run_dir = Path(data["run_dir"])
        run_finetune(load_recipe(write_yaml(tmp_path / f"{name}.yaml", data)))
        first_losses[name] = next(
            record["loss"] for record in read_metrics(run_dir / "metrics.jsonl") if "loss" in record
        )
    assert first_losses["soft"] < 1e-6 < first_losses["none"]
    assert first_losses["soft+hidden"] < 1e-5  # the same hidden states: a cosine of 1
    assert first_losses["hard"] == pytest.approx(first_losses["none"], abs=1e-6)


def test_the_teacher_labels_the_training_rows_and_the_unlabelled_text_and_the_student_is_smaller(teacher, tmp_path):
    (tmp_path / "more.txt").write_text("\n".join(UNLABELLED) + "\n", encoding="utf-8")
    data = student_recipe(teacher, tmp_path, "run", temperature=3.0, soft_weight=0.7)
    data.update({"unlabelled_text": str(tmp_path / "more.txt")})
    data["model"]["keep_layers"] = [1]
    checkpoint = run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    # Its targets: the teacher's logits of each training row in file order, then of each unlabelled row, the
    # probabilities `finetune.predict` gives for them.
    task = teacher.parent.parent / "task"
    sentences = [line.split("\t")[0] for line in (task / "train.tsv").read_text().splitlines()[1:]]
    targets = np.load(tmp_path / "run" / TEACHER_FILE)
    assert targets.shape == (48 + 3, 2)
    expected = [row["probabilities"]["1"] for row in predict(teacher, sentences + UNLABELLED)]
    assert np.allclose(torch.softmax(torch.from_numpy(targets), -1)[:, 1].numpy(), expected, atol=1e-5)
    # result.json and the card: the teacher's score on these dev rows, the student's, the retention.
    record = json.loads((tmp_path / "run" / RESULT_FILE).read_text())["distillation"]
    teacher_result = json.loads((teacher.parent / RESULT_FILE).read_text())
    assert record["teacher_dev"]["dev_accuracy"] == pytest.approx(teacher_result["best"]["dev_accuracy"])
    assert record["student_dev"] == json.loads((tmp_path / "run" / RESULT_FILE).read_text())["best"]
    assert record["retention"] == pytest.approx(
        record["student_dev"]["dev_accuracy"] / record["teacher_dev"]["dev_accuracy"]
    )
    card = (checkpoint / "README.md").read_text()
    assert "## Distillation" in card and "temperature 3.0, 70% of the loss" in card and "blocks [1]" in card
    student = AutoModelForSequenceClassification.from_pretrained(checkpoint)
    assert student.config.num_hidden_layers == 1 and len(student.bert.encoder.layer) == 1


def test_a_stopped_distillation_resumes_to_the_same_weights(teacher, tmp_path):
    def recipe_file(name: str) -> Path:
        data = student_recipe(teacher, tmp_path, name, soft_weight=0.5)
        data.update({"checkpoint_every": 2})
        data["model"]["keep_layers"] = "every_other"
        return write_yaml(tmp_path / f"{name}.yaml", data)

    full = run_finetune(load_recipe(recipe_file("full")))
    with interrupted_at_step(4):
        run_finetune(load_recipe(recipe_file("resumed")))
    resumed = run_finetune(load_recipe(recipe_file("resumed")), resume=True)
    one, other = (AutoModelForSequenceClassification.from_pretrained(path).state_dict() for path in (full, resumed))
    assert all(torch.equal(one[name], other[name]) for name in one)


def test_a_teacher_with_another_tokenizer_teaches_on_text(teacher, tmp_path):
    """A RoBERTa-style teacher (byte-level BPE) of the same task teaches the BERT student (WordPiece)."""
    base = save_tiny_checkpoint(tmp_path / "roberta", "roberta")
    data = finetune_recipe(base, teacher.parent.parent / "task", tmp_path / "roberta-teacher")
    data["training"].update({"epochs": 1})
    roberta = run_finetune(load_recipe(write_yaml(tmp_path / "roberta.yaml", data)))
    student = student_recipe(teacher, tmp_path, "student")
    student["distillation"]["teacher"] = str(roberta)
    run_finetune(load_recipe(write_yaml(tmp_path / "student.yaml", student)))
    targets = np.load(tmp_path / "student" / TEACHER_FILE)
    sentences = [
        line.split("\t")[0] for line in (teacher.parent.parent / "task" / "train.tsv").read_text().splitlines()[1:]
    ]
    expected = [row["probabilities"]["1"] for row in predict(roberta, sentences)]
    assert np.allclose(torch.softmax(torch.from_numpy(targets), -1)[:, 1].numpy(), expected, atol=1e-5)
    # Their hidden states are of other tokens: the cosine loss is refused in one line.
    student["distillation"]["hidden_weight"] = 1.0
    student["run_dir"] = str(tmp_path / "hidden")
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "hidden.yaml", student))])
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "error: distillation.hidden_weight: the teacher and the student tokenize differently, so their hidden "
        "states are not of the same tokens; set it to 0"
    )
    assert not (tmp_path / "hidden" / "checkpoint").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda data, tmp: data["distillation"].update(teacher=str(tmp)),
            r"^error: distillation\.teacher: .+: no finetune_recipe\.yaml: the teacher must be a checkpoint fine-tuned",
        ),
        (
            lambda data, tmp: data["task"].update(labels=["1", "0"]),
            r"^error: distillation\.teacher: .+: the teacher's labels \(0, 1\) are not the task's \(1, 0\) in the same",
        ),
        (
            lambda data, tmp: data["model"].update(keep_layers=[0, 5]),
            r"^error: model\.keep_layers: block 5 is out of range: the model has 2 blocks \(0 to 1\)$",
        ),
        (lambda data, tmp: data["model"].update(keep_layers=[]), r"model\.keep_layers: an empty list keeps no block"),
        (
            lambda data, tmp: data["model"].update(keep_layers=[0], adapter={"kind": "lora"}),
            r"keep_layers makes a new, smaller model, on which an adapter could not be loaded again",
        ),
        (
            lambda data, tmp: data.update(method="contrastive"),
            r"method: contrastive pairs labelled rows; with distillation use method plain",
        ),
        (
            lambda data, tmp: data.update(self_training={"rounds": 2}),
            r"self_training: with distillation the teacher labels unlabelled_text",
        ),
        (lambda data, tmp: data["distillation"].update(temperature=0), r"distillation\.temperature"),
    ],
)
def test_what_cannot_teach_is_refused_in_one_line(teacher, tmp_path, change, message):
    data = student_recipe(teacher, tmp_path, "run")
    change(data, tmp_path)
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2, result.output
    assert re.search(message, one_error_line(result)), one_error_line(result)
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_a_kind_not_distilled_yet_is_refused(teacher, tmp_path):
    data = student_recipe(teacher, tmp_path, "run")
    data["task"] = {"kind": "choices", "name": "arc", "data_dir": str(tmp_path)}
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2
    owners = "classification, regression, multilabel, tokens"
    assert f"distillation: task kind choices is not distilled yet (kinds {owners} are)" in result.output


# ---------------------------------------------------------------------------------------------
# Taggers (kind tokens): a soft target per word, across tokenizers by the words themselves
# ---------------------------------------------------------------------------------------------


def test_a_taggers_soft_targets_are_the_teachers_logits_of_the_words_it_tags():
    from finetune.kinds.distillation import tagged_word_targets, tagging_distillation_loss

    nan = float("nan")
    teacher_words = [np.array([[1.0, 0], [0, 1], [2, 2]], dtype=np.float32), np.array([[0.0, 3]], dtype=np.float32)]
    # The student tags words 0 and 2 of the first sentence (word 1 not read) and the second's only word.
    targets = tagged_word_targets(teacher_words, [[1, None, 4], [1]])
    expected = np.array([[[1.0, 0], [2, 2]], [[0, 3], [nan, nan]]], dtype=np.float32)
    assert np.array_equal(targets, expected, equal_nan=True)
    logits = torch.zeros(2, 6, 2)
    logits[0, 1], logits[0, 4], logits[1, 1] = torch.tensor([1.0, 0]), torch.tensor([2.0, 2]), torch.tensor([0.0, 3])
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[0, 4], labels[1, 1] = 0, 1, 1
    # The student gives the teacher's logits at every word it tags: nothing to learn.
    assert tagging_distillation_loss(logits, torch.from_numpy(targets), labels, 2.0) == pytest.approx(0, abs=1e-6)
    logits[1, 1] = torch.tensor([3.0, 0])
    p, q = torch.softmax(torch.tensor([0.0, 3]) / 2, -1), torch.softmax(torch.tensor([3.0, 0]) / 2, -1)
    by_hand = 4 * (p * (p.log() - q.log())).sum()
    assert tagging_distillation_loss(logits, torch.from_numpy(targets), labels, 2.0) == pytest.approx(float(by_hand))


@pytest.fixture(scope="module")
def tagging_teacher(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny BERT tagger without dropout trained on the generated CoNLL task, the task)."""
    from tests.kinds.test_tagging import tagging_recipe, write_conll

    folder = tmp_path_factory.mktemp("tagging-teacher")
    for split, count, seed in (("train", 48, 1), ("dev", 16, 2)):
        write_conll(folder / "task" / f"{split}.txt", count, seed)
    base = save_tiny_masked_lm(folder / "lm", dropout=0.0)
    data = tagging_recipe(base, folder / "task", folder / "run")
    data["training"].update({"epochs": 2})
    return run_finetune(load_recipe(write_yaml(folder / "teacher.yaml", data))), folder / "task"


def test_a_tagger_that_is_its_teacher_has_nothing_to_learn_and_resumes_exactly(tagging_teacher, tmp_path):
    from tests.kinds.test_tagging import tagging_recipe

    teacher, task = tagging_teacher

    def recipe_file(name: str, **keys) -> Path:
        data = tagging_recipe(teacher, task, tmp_path / name)
        data.update({"distillation": {"teacher": str(teacher), **keys}, "unfreezing": {"mode": "none"}})
        data["training"].update({"epochs": 1, "log_every": 1, "batch_size": 8})
        return write_yaml(tmp_path / f"{name}.yaml", data)

    run_finetune(load_recipe(recipe_file("same", soft_weight=1.0)))
    first = next(record["loss"] for record in read_metrics(tmp_path / "same" / "metrics.jsonl") if "loss" in record)
    assert first < 1e-6
    record = json.loads((tmp_path / "same" / RESULT_FILE).read_text())["distillation"]
    teacher_best = json.loads((teacher.parent / RESULT_FILE).read_text())["best"]
    assert record["teacher_dev"]["dev_f1"] == pytest.approx(teacher_best["dev_f1"])
    full = run_finetune(load_recipe(recipe_file("full", soft_weight=0.5, temperature=3.0)))
    stopped = load_recipe(recipe_file("resumed", soft_weight=0.5, temperature=3.0))
    stopped = stopped.model_copy(update={"checkpoint_every": 2})
    with interrupted_at_step(4):
        run_finetune(stopped)
    resumed = run_finetune(stopped, resume=True)
    one, other = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(one[name], other[name]) for name in one)


def test_a_tagger_of_another_tokenizer_teaches_by_the_words(tagging_teacher, tmp_path):
    from tests.kinds.test_tagging import tagging_recipe

    bert_teacher, task = tagging_teacher
    base = save_tiny_checkpoint(tmp_path / "roberta", "roberta")
    data = tagging_recipe(base, task, tmp_path / "roberta-teacher")
    data["training"].update({"epochs": 1})
    roberta = run_finetune(load_recipe(write_yaml(tmp_path / "roberta.yaml", data)))
    student = tagging_recipe(bert_teacher, task, tmp_path / "student")
    student.update({"distillation": {"teacher": str(roberta)}})
    student["training"].update({"epochs": 1})
    run_finetune(load_recipe(write_yaml(tmp_path / "student.yaml", student)))
    targets = np.load(tmp_path / "student" / TEACHER_FILE)
    sentences = [
        " ".join(line.split()[0] for line in block.splitlines())
        for block in (task / "train.txt").read_text().split("\n\n")[1:]
        if block.strip()
    ]
    tags = [row["tags"] for row in predict(roberta, sentences)]
    names = json.loads((roberta / "config.json").read_text())["id2label"]
    assert len(targets) == len(sentences)
    for sentence_targets, sentence_tags in zip(targets, tags):  # every word of these short sentences is read
        read = sentence_targets[~np.isnan(sentence_targets).any(-1)]
        assert [names[str(index)] for index in read.argmax(-1)] == sentence_tags


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda data, tmp: data.update(unlabelled_text=str(tmp / "more.txt")),
            "a teacher of kind tokens labels the training rows only",
        ),
        (
            lambda data, tmp: data["distillation"].update(hidden_weight=1.0),
            "the cosine loss is for pooled sequence classifiers, not kind tokens",
        ),
        (
            lambda data, tmp: data["task"].update(labels=["O", "B-ORG", "I-ORG"]),
            "the teacher's labels (.+) are not the task's",
        ),
    ],
)
def test_what_cannot_teach_a_tagger_is_refused_in_one_line(tagging_teacher, tmp_path, change, message):
    from tests.kinds.test_tagging import tagging_recipe

    teacher, task = tagging_teacher
    (tmp_path / "more.txt").write_text("some text\n")
    data = tagging_recipe(teacher, task, tmp_path / "run")
    data["distillation"] = {"teacher": str(teacher)}
    change(data, tmp_path)
    result = CliRunner().invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2, result.output
    assert re.search(message, one_error_line(result)), one_error_line(result)
    assert not (tmp_path / "run" / "checkpoint").exists()
