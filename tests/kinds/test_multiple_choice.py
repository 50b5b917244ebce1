"""Multiple choice (task kind choices): questions read from JSON Lines in ARC's layout with every line checked, a
score per choice with a softmax over each question's own choices (3, 4 and 5 of them in one batch), encoders through
AutoModelForMultipleChoice and GPT-2 GPT's way, trained with the classifier's machinery, evaluated, predicted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMultipleChoice, AutoTokenizer
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.predict import predict
from finetune.errors import InputError
from finetune.kinds.choices.data import EncodedChoices, collate_choices, read_choices
from finetune.kinds.choices.model import GPT2ForMultipleChoice
from finetune.kinds.choices.training import choice_delimiter, choice_logits
from tests.conftest import NEGATIVE, POSITIVE, SUBJECTS, one_error_line, save_tiny_masked_lm, write_corpus, write_yaml

runner = CliRunner()
LETTERS, DIGITS = "ABCDE", "1234"


def question(rng: random.Random, index: int, with_answer: bool = True) -> dict:
    """`the film was ...`: 3 to 5 choices, one positive adjective (the answer) among negative ones; labels A-E,
    or 1-4 for a question of 4 choices or fewer, as in ARC."""
    count = rng.choice([3, 4, 5])
    texts = [rng.choice(POSITIVE)] + rng.sample(NEGATIVE, count - 1)
    rng.shuffle(texts)
    labels = DIGITS if count <= 4 and rng.random() < 0.3 else LETTERS
    row = {
        "id": f"q{index}",
        "question": {
            "stem": f"{rng.choice(SUBJECTS)} was good : how ?",
            "choices": [{"text": text, "label": labels[position]} for position, text in enumerate(texts)],
        },
    }
    if with_answer:
        row["answerKey"] = labels[next(position for position, text in enumerate(texts) if text in POSITIVE)]
    return row


def write_questions(path: Path, count: int, seed: int, with_answers: bool = True) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(question(rng, index, with_answers)) + "\n" for index in range(count)), encoding="utf-8"
    )
    return path


@pytest.fixture(scope="module")
def choices_task(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("choices") / "task"
    write_questions(folder / "train.jsonl", 64, 1)
    write_questions(folder / "dev.jsonl", 24, 2)
    write_questions(folder / "test.jsonl", 16, 3)
    return folder


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return save_tiny_masked_lm(tmp_path_factory.mktemp("choices-lm"))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory) -> Path:
    """A tiny GPT-2 language model with a byte-level BPE tokenizer and, like the hub's, no pad token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from finetune.data.corpus import read_documents
    from finetune.data.tokenizers import train_byte_level_bpe
    from finetune.training.checkpoints import save_checkpoint

    folder = tmp_path_factory.mktemp("choices-gpt2")
    tokenizer = train_byte_level_bpe(read_documents([write_corpus(folder / "corpus")]), 300, min_frequency=1)
    tokenizer.pad_token = None
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=2,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    )
    return save_checkpoint(model, tokenizer, folder / "gpt2")


def choices_recipe(checkpoint: Path, task: Path, run_dir: Path, **task_keys) -> dict:
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"checkpoint": str(checkpoint)},
        "task": {"name": "tiny-choices", "kind": "choices", "data_dir": str(task), "max_length": 24, **task_keys},
        "training": {"epochs": 6, "batch_size": 8, "lr": 3e-3, "log_every": 5, "device": "cpu"},
    }


# ---------------------------------------------------------------------------------------------
# Reading ARC's layout
# ---------------------------------------------------------------------------------------------


def arc_line(choices: list[tuple[str, str]], answer: str, question_id: str = "Mercury_1") -> str:
    return json.dumps(
        {
            "id": question_id,
            "question": {
                "stem": "Which is a mammal?",
                "choices": [{"text": text, "label": label} for text, label in choices],
            },
            "answerKey": answer,
        }
    )


def test_questions_with_letter_and_digit_labels(tmp_path):
    path = tmp_path / "ARC-Easy-Dev.jsonl"
    path.write_text(
        arc_line([("a bat", "A"), ("a shark", "B"), ("a frog", "C")], "A")
        + "\n\n"
        + arc_line([("fish", "1"), ("birds", "2"), ("whales", "3"), ("snakes", "4")], "3", "NYSEDREGENTS_2")
        + "\n",
        encoding="utf-8",
    )
    questions = read_choices(path)
    assert questions.ids == ["Mercury_1", "NYSEDREGENTS_2"] and questions.lines == [1, 3]
    assert questions.choices[1] == ["fish", "birds", "whales", "snakes"] and questions.labels[1] == list("1234")
    assert questions.answers == [0, 2]


@pytest.mark.parametrize(
    "line, reason",
    [
        (arc_line([("a bat", "A")], "A"), "1 choices: a question has 2 to 8"),
        (arc_line([(f"animal {index}", str(index)) for index in range(9)], "1"), "9 choices: a question has 2 to 8"),
        (
            arc_line([("a bat", "A"), ("a shark", "B")], "E"),
            "answerKey 'E' is not one of the question's choice labels (A, B)",
        ),
        (arc_line([("a bat", "A"), ("a shark", "A")], "A"), "choice labels A, A repeat a label"),
        ('{"id": "q", "question": "Which?"}', "not a question in ARC's layout"),
        ("{not json", "not JSON"),
    ],
)
def test_a_malformed_question_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "train.jsonl"
    path.write_text(arc_line([("a bat", "A"), ("a shark", "B")], "A") + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(InputError) as error:
        read_choices(path)
    assert (error.value.source, error.value.line) == (path, 2)
    assert str(error.value).startswith(f"{path} line 2: {reason}")


def test_predict_input_needs_no_answer_key(tmp_path):
    path = write_questions(tmp_path / "questions.jsonl", 3, 5, with_answers=False)
    questions = read_choices(path, with_answers=False)
    assert questions.answers is None and len(questions.ids) == 3
    with pytest.raises(InputError, match="line 1: answerKey None is not one of"):
        read_choices(path)


# ---------------------------------------------------------------------------------------------
# Encoding and masking
# ---------------------------------------------------------------------------------------------


def test_an_encoder_reads_each_choice_as_a_sentence_pair(tmp_path, tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    questions = read_choices(write_questions(tmp_path / "q.jsonl", 1, 7))
    item = EncodedChoices(questions, tokenizer, 24)[0]
    assert len(item["input_ids"]) == len(questions.choices[0])
    first = tokenizer.convert_ids_to_tokens(item["input_ids"][0])
    assert first[0] == "[CLS]" and first.count("[SEP]") == 2 and first[-2] == questions.choices[0][0]
    assert item["token_type_ids"][0][-2] == 1 and item["labels"] == questions.answers[0]


def test_a_decoder_reads_question_delimiter_choice_delimiter(tmp_path, tiny_gpt2):
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    model = AutoModelForMultipleChoice.from_pretrained(tiny_gpt2)
    assert isinstance(model, GPT2ForMultipleChoice)
    delimiter = choice_delimiter(model, tokenizer)
    assert delimiter == tokenizer.eos_token_id
    questions = read_choices(write_questions(tmp_path / "q.jsonl", 1, 7))
    ids = EncodedChoices(questions, tokenizer, 64, delimiter)[0]["input_ids"][1]
    assert ids[-1] == delimiter and ids.count(delimiter) == 2
    middle = ids.index(delimiter)
    assert tokenizer.decode(ids[:middle]) == questions.stems[0]
    assert tokenizer.decode(ids[middle + 1 : -1]) == " " + questions.choices[0][1]


@pytest.mark.parametrize("checkpoint", ["tiny_bert", "tiny_gpt2"])
def test_questions_of_3_4_and_5_choices_in_one_batch_score_as_alone(tmp_path, checkpoint, request):
    folder = request.getfixturevalue(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForMultipleChoice.from_pretrained(folder).eval()
    questions = read_choices(write_questions(tmp_path / "q.jsonl", 12, 3))
    encoded = EncodedChoices(questions, tokenizer, 24, choice_delimiter(model, tokenizer))
    items = [encoded[index] for index in range(len(encoded))]
    assert {len(item["input_ids"]) for item in items} == {3, 4, 5}
    collate = collate_choices(tokenizer.pad_token_id)
    with torch.no_grad():
        together = torch.softmax(choice_logits(model, collate(items)), dim=-1)
        for row, item in enumerate(items):
            alone = torch.softmax(choice_logits(model, collate([item])), dim=-1)[0]
            count = len(item["input_ids"])
            assert torch.allclose(together[row, :count], alone, atol=1e-5)
            assert (together[row, count:] == 0).all()  # a padding choice gets no probability


# ---------------------------------------------------------------------------------------------
# Fine-tune, evaluate, predict
# ---------------------------------------------------------------------------------------------


def finetuned(folder: Path, checkpoint: Path, task: Path) -> Path:
    recipe = write_yaml(folder / "recipe.yaml", choices_recipe(checkpoint, task, folder / "run"))
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    return folder / "run"


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory, tiny_bert, choices_task) -> Path:
    return finetuned(tmp_path_factory.mktemp("bert-choices"), tiny_bert, choices_task)


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory, tiny_gpt2, choices_task) -> Path:
    return finetuned(tmp_path_factory.mktemp("gpt2-choices"), tiny_gpt2, choices_task)


@pytest.mark.parametrize(
    "run, model_class", [("bert_run", "BertForMultipleChoice"), ("gpt2_run", "GPT2ForMultipleChoice")]
)
def test_a_multiple_choice_model_learns_and_saves_a_loadable_checkpoint(run, model_class, request):
    run_dir = request.getfixturevalue(run)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["main_metric"] == "accuracy" and result["best"]["dev_accuracy"] == 1.0  # chance: about 0.27
    evaluations = [
        record
        for record in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if record["phase"] == "eval"
    ]
    assert len(evaluations) == 6
    assert evaluations[0]["validation_loss"] > 0.7 and evaluations[-1]["validation_loss"] < 0.3  # ln 4 = 1.39
    model = AutoModelForMultipleChoice.from_pretrained(run_dir / "checkpoint")
    assert type(model).__name__ == model_class
    card = (run_dir / "checkpoint" / "README.md").read_text()
    assert "pipeline_tag: multiple-choice" in card and "AutoModelForMultipleChoice" in card
    assert ("import finetune.kinds.choices.model" in card) == (model_class == "GPT2ForMultipleChoice")


def test_eval_scores_accuracy_and_writes_chosen_labels(bert_run, choices_task, tmp_path):
    recipe = write_yaml(
        tmp_path / "eval.yaml",
        {
            "stage": "eval",
            "run_dir": str(tmp_path / "eval"),
            "split": "test",
            "write_predictions": True,
            "task": {"name": "tiny-choices", "kind": "choices", "data_dir": str(choices_task)},
            "models": {"bert": str(bert_run / "checkpoint")},
        },
    )
    result = runner.invoke(app, ["eval", str(recipe)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["examples"] == 16 and report["results"]["bert"]["accuracy"] == 1.0
    rows = (tmp_path / "eval" / "predictions" / "bert.tsv").read_text().splitlines()
    test = read_choices(choices_task / "test.jsonl")
    assert rows[0] == "id\tprediction"
    assert rows[1:] == [
        f"{question_id}\t{labels[answer]}" for question_id, labels, answer in zip(test.ids, test.labels, test.answers)
    ]


def test_predict_gives_the_chosen_label_and_a_probability_per_choice(gpt2_run, tmp_path):
    rng = random.Random(9)
    questions = [question(rng, index, with_answer=False) for index in range(4)]
    rows = predict(str(gpt2_run / "checkpoint"), questions)
    for asked, row in zip(questions, rows):
        right = next(choice["label"] for choice in asked["question"]["choices"] if choice["text"] in POSITIVE)
        assert row["id"] == asked["id"] and row["label"] == right
        assert list(row["probabilities"]) == [choice["label"] for choice in asked["question"]["choices"]]
        assert sum(row["probabilities"].values()) == pytest.approx(1.0)
    source = write_questions(tmp_path / "questions.jsonl", 5, 11, with_answers=False)
    result = runner.invoke(
        app, ["predict", str(gpt2_run / "checkpoint"), "--input", str(source), "--output", str(tmp_path / "out.jsonl")]
    )
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["id"] for row in written] == [f"q{index}" for index in range(5)]


# ---------------------------------------------------------------------------------------------
# Bad input: one line each
# ---------------------------------------------------------------------------------------------


def test_a_dev_answer_key_outside_its_choices_is_one_line(tiny_bert, choices_task, tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "train.jsonl").write_text((choices_task / "train.jsonl").read_text())
    (task / "dev.jsonl").write_text(
        arc_line([("a bat", "A"), ("a shark", "B")], "A")
        + "\n"
        + arc_line([("a bat", "A"), ("a shark", "B")], "C")
        + "\n"
    )
    recipe = write_yaml(tmp_path / "recipe.yaml", choices_recipe(tiny_bert, task, tmp_path / "run"))
    message = one_error_line(runner.invoke(app, ["finetune", str(recipe)]))
    assert message.startswith(f"error: {task / 'dev.jsonl'} line 2: answerKey 'C' is not one of the question's")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"text_columns": ["question"]}, "text_columns: not for kind choices"),
        ({"labels": ["A", "B"]}, "labels: not for kind choices"),
        ({"format": "csv"}, "task.format: csv: a multiple-choice task reads JSON Lines in ARC's layout"),
    ],
)
def test_classification_keys_are_refused_for_a_choices_task(tiny_bert, choices_task, tmp_path, keys, expected):
    recipe = write_yaml(tmp_path / "recipe.yaml", choices_recipe(tiny_bert, choices_task, tmp_path / "run", **keys))
    assert expected in one_error_line(runner.invoke(app, ["finetune", str(recipe)]))


def test_pooling_is_not_for_a_multiple_choice_model(tiny_bert, choices_task, tmp_path):
    data = {**choices_recipe(tiny_bert, choices_task, tmp_path / "run"), "pooling": "mean"}
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))]))
    assert "pooling: mean is for classifiers; a multiple-choice model (task.kind choices)" in message


def test_an_awd_lstm_is_refused_as_a_multiple_choice_model_in_one_line(choices_task, tmp_path):
    from tests.commands.test_profile import save_tiny_awd_lstm

    checkpoint = save_tiny_awd_lstm(tmp_path / "lm")
    recipe = write_yaml(tmp_path / "recipe.yaml", choices_recipe(checkpoint, choices_task, tmp_path / "run"))
    message = one_error_line(runner.invoke(app, ["finetune", str(recipe)]))
    assert "is a 'awd_lstm' model, which has no multiple-choice head:" in message
    assert not (tmp_path / "run").exists()


def test_a_classifier_is_no_multiple_choice_model_for_eval(bert_run, choices_task, tmp_path):
    recipe = write_yaml(
        tmp_path / "eval.yaml",
        {
            "stage": "eval",
            "run_dir": str(tmp_path / "eval"),
            "split": "dev",
            "task": {"name": "tiny-choices", "kind": "choices", "data_dir": str(choices_task)},
            "models": {"lm": str(bert_run.parent.parent / "choices-lm0" / "checkpoint")},
        },
    )
    message = one_error_line(runner.invoke(app, ["eval", str(recipe)]))
    assert "is no multiple-choice model (BertForMaskedLM): fine-tune it on a task of kind choices first" in message


def test_profile_counts_the_model_a_run_builds(tiny_bert, choices_task, tmp_path):
    data = choices_recipe(tiny_bert, choices_task, tmp_path / "run")
    result = runner.invoke(
        app, ["profile", str(write_yaml(tmp_path / "recipe.yaml", data)), "--json", "--matmul-gflops", "100"]
    )
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)
    real = AutoModelForMultipleChoice.from_pretrained(tiny_bert)
    assert profile["parameters"]["total"] == sum(parameter.numel() for parameter in real.parameters())
    assert profile["model"]["kind"] == "multiple choice, a score per choice"


def test_a_stopped_multiple_choice_run_resumes_bit_for_bit(tiny_gpt2, choices_task, tmp_path, monkeypatch):
    from tests.training.test_resume_finetune import Stopped, assert_same_run, stop_after_checkpoint

    def recipe(name: str) -> Path:
        data = choices_recipe(tiny_gpt2, choices_task, tmp_path / name)
        data.update({"checkpoint_every": 5, "eval_every": 4, "unfreezing": {"mode": "gradual"}})
        data["training"]["epochs"] = 2
        return write_yaml(tmp_path / f"{name}.yaml", data)

    assert runner.invoke(app, ["finetune", str(recipe("full"))]).exit_code == 0
    stop_after_checkpoint(monkeypatch, 10)  # mid-epoch 2 (8 steps an epoch), after an evaluation at step 8
    with pytest.raises(Stopped):
        from finetune.recipes import load_recipe
        from finetune.stages.finetune import run_finetune

        run_finetune(load_recipe(recipe("resumed")))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")


TINY = {"vocab_size": 100, "pad_token_id": 0}
ENCODER = {**TINY, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.mark.parametrize(
    "model_type, keys",
    [
        ("bert", ENCODER),
        ("roberta", ENCODER),
        ("electra", {**ENCODER, "embedding_size": 16}),
        ("distilbert", {**TINY, "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}),
        ("deberta-v2", ENCODER),
        ("modernbert", ENCODER),
        ("gpt2", {**TINY, "n_embd": 32, "n_layer": 2, "n_head": 2}),
    ],
)
def test_each_family_with_layer_groups_has_a_multiple_choice_model_with_them(model_type, keys):
    from transformers import AutoConfig

    from finetune.kinds.choices.model import choice_model_skeleton
    from finetune.models.backbones import layer_groups

    model = choice_model_skeleton(AutoConfig.for_model(model_type, **keys), "tiny")
    groups = layer_groups(model)
    assert len(groups) == 4 and type(model).__name__.endswith("ForMultipleChoice")  # embeddings, 2 blocks, head


def test_deberta_v1_has_no_multiple_choice_head():
    from transformers import AutoConfig

    from finetune.kinds.choices.model import choice_model_skeleton

    with pytest.raises(InputError, match="is a 'deberta' model, which has no multiple-choice head:"):
        choice_model_skeleton(AutoConfig.for_model("deberta", **ENCODER), "tiny")
