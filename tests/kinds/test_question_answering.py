"""Extractive question answering (task kind spans): SQuAD JSON read with every answer checked, long contexts in
overlapping windows labelled with the answer's tokens (or [CLS]), answers post-processed over windows (n-best,
length cap, start <= end, no-answer threshold), SQuAD's EM / F1 with the official normalisation, and a model
fine-tuned with the classifier's machinery, evaluated, predicting, loadable with AutoModelForQuestionAnswering."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import AutoModelForQuestionAnswering, AutoTokenizer
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.predict import predict
from finetune.errors import InputError
from finetune.kinds.spans.data import EncodedSpans, Question, SpanReading, SquadQuestions, read_squad
from finetune.kinds.spans.metrics import best_threshold, f1_score, normalize_answer, question_scores, squad_scores
from finetune.kinds.spans.training import best_answers
from tests.conftest import FILLERS, NEGATIVE, POSITIVE, SUBJECTS, one_error_line, save_tiny_masked_lm, write_yaml

runner = CliRunner()
ADJECTIVES = POSITIVE + NEGATIVE


def review_paragraph(rng: random.Random, identifier: str, unanswerable: bool) -> dict:
    """A context of subjects and fillers (9 to 28 words) with one adjective inserted, which is the answer; an
    unanswerable question's context has none."""
    words = []
    for _ in range(rng.randint(3, 7)):
        words += rng.choice(SUBJECTS).split() + ["was", rng.choice(FILLERS)]
    answers = []
    if not unanswerable:
        adjective = rng.choice(ADJECTIVES)
        position = rng.randrange(len(words) + 1)
        answers = [{"text": adjective, "answer_start": len(" ".join(words[:position] + [""]))}]
        words.insert(position, adjective)
    return {
        "context": " ".join(words) + " .",
        "qas": [{"id": identifier, "question": "was it good ?", "answers": answers, "is_impossible": unanswerable}],
    }


def write_squad(path: Path, questions: int, seed: int, unanswerable_share: float = 0.25) -> Path:
    rng = random.Random(seed)
    paragraphs = [
        review_paragraph(rng, f"s{seed}q{index}", rng.random() < unanswerable_share) for index in range(questions)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"version": "v2.0", "data": [{"title": "Reviews", "paragraphs": paragraphs}]}, indent=1),
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def qa_task(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qa") / "task"
    write_squad(folder / "train.json", 120, 1)
    write_squad(folder / "dev.json", 30, 2)
    write_squad(folder / "test.json", 20, 3)
    return folder


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return save_tiny_masked_lm(tmp_path_factory.mktemp("qa-lm"))


def qa_recipe(checkpoint: Path, task: Path, run_dir: Path, **task_keys) -> dict:
    return {
        "stage": "finetune",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"checkpoint": str(checkpoint)},
        "task": {
            "name": "tiny-qa",
            "kind": "spans",
            "data_dir": str(task),
            "max_length": 32,
            "doc_stride": 8,
            **task_keys,
        },
        "training": {"epochs": 6, "batch_size": 8, "lr": 3e-3, "log_every": 5, "device": "cpu"},
    }


# ---------------------------------------------------------------------------------------------
# Reading SQuAD files
# ---------------------------------------------------------------------------------------------

SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Normans",
            "paragraphs": [
                {
                    "context": "The Normans gave their name to Normandy, a region in France.",
                    "qas": [
                        {
                            "id": "n1",
                            "question": "In what country is Normandy?",
                            "is_impossible": False,
                            "answers": [
                                {"text": "France", "answer_start": 53},
                                {"text": "France.", "answer_start": 53},
                            ],
                        },
                        {"id": "n2", "question": "Who gave their name to Paris?", "is_impossible": True, "answers": []},
                    ],
                }
            ],
        }
    ],
}


def test_squad_questions_with_their_answers(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    read = read_squad(path)
    assert read.version == "v2.0" and [question.id for question in read.questions] == ["n1", "n2"]
    assert read.questions[0].answers == [("France", 53), ("France.", 53)] and read.questions[0].title == "Normans"
    assert read.questions[1].unanswerable and read.questions[1].answers == [] and read.has_unanswerable


def test_an_answer_not_at_its_answer_start_names_file_question_and_line(tmp_path):
    broken = json.loads(json.dumps(SQUAD))
    broken["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 50
    path = tmp_path / "train.json"
    path.write_text(json.dumps(broken, indent=1), encoding="utf-8")
    with pytest.raises(InputError) as error:
        read_squad(path)
    line = next(number for number, text in enumerate(path.read_text().splitlines(), start=1) if '"n1"' in text)
    assert (error.value.source, error.value.line, error.value.value) == (path, line, "n1")
    assert str(error.value) == (
        f'{path} line {line}: question n1: the answer "France" is not at answer_start 50 '
        'of its context (found there: "in Fra")'
    )


def test_an_answerable_question_without_answers_and_bad_json_are_one_line(tmp_path):
    missing = json.loads(json.dumps(SQUAD))
    missing["data"][0]["paragraphs"][0]["qas"][0]["answers"] = []
    path = tmp_path / "train.json"
    path.write_text(json.dumps(missing), encoding="utf-8")
    with pytest.raises(InputError, match="question n1: no answers"):
        read_squad(path)
    assert read_squad(path, with_answers=False).questions[0].answers == []  # a test file may leave them out
    path.write_text('{"data": [\n{"title": "x",}\n]}', encoding="utf-8")
    with pytest.raises(InputError) as error:
        read_squad(path)
    assert error.value.line == 2 and "not JSON" in str(error.value)


# ---------------------------------------------------------------------------------------------
# Windows and their labels
# ---------------------------------------------------------------------------------------------


def test_a_long_context_is_read_in_overlapping_windows_labelled_with_the_answer_or_cls(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    words = (
        ["the", "film", "was", "really", "the", "plot", "was", "so", "the", "cast", "was", "very"] * 3
        + ["great"]
        + ["the", "music"] * 4
    )
    context = " ".join(words)
    answered = Question("a", "was it good ?", context, [("great", context.index("great"))])
    unanswerable = Question("b", "was it good ?", context, [], unanswerable=True)
    encoded = EncodedSpans(
        SquadQuestions([answered, unanswerable], Path("x")), tokenizer, SpanReading(max_length=32, doc_stride=8)
    )
    windows = [index for index, question in enumerate(encoded.question_of) if question == 0]
    assert len(windows) > 2 and encoded.question_of.count(1) == len(windows)
    holding = []
    for window in windows:
        item, offsets = encoded[window], encoded.offsets[window]
        context_tokens = [position for position, offset in enumerate(offsets) if offset is not None]
        assert len(item["input_ids"]) <= 32 and offsets[0] is None  # [CLS] and the question are not context
        start, end = item["start_positions"], item["end_positions"]
        if start:
            holding.append(window)
            assert context[offsets[start][0] : offsets[end][1]] == "great"
            assert tokenizer.convert_ids_to_tokens(item["input_ids"][start : end + 1]) == ["great"]
        else:  # the answer is outside this window: [CLS] (position 0)
            assert end == 0 and "great" not in context[offsets[context_tokens[0]][0] : offsets[context_tokens[-1]][1]]
    assert holding  # the windows overlap by 8 tokens: at least one holds the answer whole
    for window in range(len(windows), len(encoded)):
        assert (encoded[window]["start_positions"], encoded[window]["end_positions"]) == (0, 0)
    # Consecutive windows share doc_stride tokens of the context.
    first, second = (encoded.offsets[window] for window in windows[:2])
    assert [offset for offset in first if offset][-8:] == [offset for offset in second if offset][:8]


def test_a_question_too_long_for_its_window_is_one_line(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    question = Question("long", "the film was " * 8, "the plot was great .", [("great", 13)])
    with pytest.raises(InputError, match="question long: its 24 tokens leave 5 of the window's 32 for the context"):
        EncodedSpans(SquadQuestions([question], Path("x")), tokenizer, SpanReading(max_length=32, doc_stride=8))


# ---------------------------------------------------------------------------------------------
# Post-processing on hand-made logits
# ---------------------------------------------------------------------------------------------

CONTEXT = "aa bb cc dd ee"  # tokens 1..5 of each window are these words; token 0 is [CLS]
OFFSETS = [None, (0, 2), (3, 5), (6, 8), (9, 11), (12, 14)]


def hand_made(windows: int = 1) -> SimpleNamespace:
    questions = SquadQuestions([Question("q", "?", CONTEXT)], Path("x"))
    return SimpleNamespace(
        questions=questions, question_of=[0] * windows, offsets=[OFFSETS] * windows, cls_positions=[0] * windows
    )


def logits(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_the_best_valid_span_wins():
    encoded = hand_made()
    # The best start (token 4) lies after the best end (token 2): invalid; the best valid pair is 1..2 (3 + 4).
    starts, ends = logits(0, 3, 0, 0, 5, 0), logits(0, 0, 4, 1, 0, 0)
    answer = best_answers(encoded, [starts], [ends], SpanReading(max_length=32), no_answer=False)[0]
    assert (answer.text, answer.start, answer.end, answer.score) == ("aa bb", 0, 5, 7.0)
    # A length cap of 1 token: only single tokens; start 4 with end 4 (5 + 0) beats 1..1 (3 + 0) and 2..2 (0 + 4).
    capped = best_answers(encoded, [starts], [ends], SpanReading(max_length=32, max_answer_length=1), False)[0]
    assert (capped.text, capped.score) == ("dd", 5.0)
    # n_best 1: only the best start (4) and the best end (2) are paired: no valid span, no answer.
    assert best_answers(encoded, [starts], [ends], SpanReading(max_length=32, n_best=1), False)[0].text == ""


def test_no_answer_wins_by_more_than_the_threshold_over_the_windows():
    encoded = hand_made(windows=2)
    # Window 1: a span 2..3 scoring 6, null 8; window 2: null 7 (the lowest null counts: 7 - 6 = 1 above).
    first = (logits(4, 0, 3, 0, 0, 0), logits(4, 0, 0, 3, 0, 0))
    second = (logits(3, 0, 0, 0, 0, 0), logits(4, 0, 0, 0, 0, 0))
    starts, ends = [first[0], second[0]], [first[1], second[1]]
    answer = best_answers(encoded, starts, ends, SpanReading(max_length=32), no_answer=True)[0]
    assert (answer.text, answer.start, answer.score, answer.span, answer.null_margin) == ("", None, 7.0, "bb cc", 1.0)
    assert best_answers(encoded, starts, ends, SpanReading(max_length=32, null_threshold=1.5), True)[0].text == "bb cc"
    assert best_answers(encoded, starts, ends, SpanReading(max_length=32), no_answer=False)[0].text == "bb cc"


# ---------------------------------------------------------------------------------------------
# SQuAD's scores
# ---------------------------------------------------------------------------------------------


def test_the_official_normalisation_exact_match_and_f1():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert question_scores(["Denver Broncos", "The Broncos"], "the broncos.") == (1, 1.0)
    assert f1_score("Denver Broncos", "Broncos won") == 0.5  # precision 1/2, recall 1/2
    assert f1_score("cat sat", "the cat sat on mat") == pytest.approx(2 / 3)  # precision 2/4, recall 2/2
    assert question_scores(["", "a"], "") == (1, 1.0)  # gold answers normalising to nothing: no answer
    assert question_scores([], "Broncos") == (0, 0.0)


def test_squad_2_scores_split_answerable_and_unanswerable():
    answers = [["Denver Broncos"], ["Carolina Panthers"], [], []]
    scores = squad_scores(answers, ["Denver Broncos", "Panthers", "", "Broncos"])
    assert scores == {
        "exact": 0.5,
        "f1": pytest.approx((1 + 2 / 3 + 1 + 0) / 4),
        "HasAns_exact": 0.5,
        "HasAns_f1": pytest.approx((1 + 2 / 3) / 2),
        "HasAns_total": 2,
        "NoAns_exact": 0.5,
        "NoAns_f1": 0.5,
        "NoAns_total": 2,
    }
    assert set(squad_scores([["a"]], ["a"])) == {"exact", "f1"}  # v1.1: no split
    # Null margins -2, -1, 1, 3: answering the two answerable questions (margins up to -1) and no others is best.
    best, threshold = best_threshold(answers, ["Denver Broncos", "Panthers", "x", "Broncos"], [-2.0, -1.0, 1.0, 3.0])
    assert (best, threshold) == (pytest.approx((1 + 2 / 3 + 1 + 1) / 4), -1.0)
    # Margins 2, -1, 1, 3: the first answer is lost above threshold -1, and answering it costs a wrong answer (x).
    assert best_threshold(answers, ["Denver Broncos", "Panthers", "x", "Broncos"], [2.0, -1.0, 1.0, 3.0]) == (
        pytest.approx((2 / 3 + 1 + 1) / 4),
        -1.0,
    )


# ---------------------------------------------------------------------------------------------
# Fine-tune, evaluate, predict
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory, tiny_bert, qa_task) -> Path:
    folder = tmp_path_factory.mktemp("qa-run")
    recipe = write_yaml(folder / "recipe.yaml", qa_recipe(tiny_bert, qa_task, folder / "run"))
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    return folder / "run"


def test_a_reader_learns_and_saves_a_question_answering_checkpoint(qa_run):
    result = json.loads((qa_run / "result.json").read_text())
    assert result["main_metric"] == "f1" and set(result["best"]) == {"dev_f1", "dev_exact"}
    assert result["best"]["dev_f1"] > 0.9  # the answer is the context's adjective, or none
    records = [json.loads(line) for line in (qa_run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record for record in records if record["phase"] == "eval"]
    assert len(evaluations) == 6 and evaluations[0]["dev_f1"] < result["best"]["dev_f1"]
    assert {"dev_HasAns_f1", "dev_NoAns_f1", "validation_loss"} <= set(evaluations[-1])
    model = AutoModelForQuestionAnswering.from_pretrained(qa_run / "checkpoint")
    assert model.config.version_2_with_negative is True  # trained with unanswerable questions
    card = (qa_run / "checkpoint" / "README.md").read_text()
    assert "pipeline_tag: question-answering" in card and "AutoModelForQuestionAnswering" in card


def test_the_checkpoint_answers_with_transformers_alone(qa_run):
    """Loaded by AutoModelForQuestionAnswering, without finetune: the best start and end are the answer's token."""
    import torch

    tokenizer = AutoTokenizer.from_pretrained(qa_run / "checkpoint")
    model = AutoModelForQuestionAnswering.from_pretrained(qa_run / "checkpoint").eval()
    inputs = tokenizer("was it good ?", "the plot was so dreadful .", return_tensors="pt")
    with torch.no_grad():
        output = model(**inputs)
    start, end = int(output.start_logits.argmax()), int(output.end_logits.argmax())
    assert tokenizer.decode(inputs["input_ids"][0, start : end + 1]) == "dreadful"


def test_eval_scores_em_f1_and_writes_squad_predictions(qa_run, qa_task, tmp_path):
    recipe = write_yaml(
        tmp_path / "eval.yaml",
        {
            "stage": "eval",
            "run_dir": str(tmp_path / "eval"),
            "split": "test",
            "write_predictions": True,
            "task": {"name": "tiny-qa", "kind": "spans", "data_dir": str(qa_task)},
            "models": {"reader": str(qa_run / "checkpoint")},
        },
    )
    result = runner.invoke(app, ["eval", str(recipe)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    scores = report["results"]["reader"]
    assert report["examples"] == 20 and scores["f1"] > 0.9 and scores["HasAns_total"] + scores["NoAns_total"] == 20
    assert report["metrics"] == ["f1", "exact", "HasAns_f1", "HasAns_exact", "NoAns_f1", "NoAns_exact"]
    assert scores["null_threshold"] == 0.0 and "best_f1_thresh" in scores  # read from the checkpoint's recipe
    predictions = json.loads((tmp_path / "eval" / "predictions" / "reader.json").read_text())
    test = read_squad(qa_task / "test.json")
    assert list(predictions) == [question.id for question in test.questions]
    assert (
        squad_scores(
            [[text for text, _ in question.answers] for question in test.questions], list(predictions.values())
        )["f1"]
        == scores["f1"]
    )


def test_predict_answers_a_question_from_its_context(qa_run, tmp_path):
    rows = predict(
        str(qa_run / "checkpoint"),
        [("was it good ?", "the cast was really superb ."), ("was it good ?", "the film was so the plot was very .")],
    )
    assert rows[0] == {"answer": "superb", "score": rows[0]["score"], "start": 20, "end": 26}
    assert rows[1]["answer"] == "" and rows[1]["start"] is None  # no adjective: no answer
    source = tmp_path / "questions.jsonl"
    source.write_text(json.dumps({"question": "was it good ?", "context": "the music was truly dull ."}) + "\n")
    result = runner.invoke(
        app, ["predict", str(qa_run / "checkpoint"), "--input", str(source), "--output", str(tmp_path / "answers.tsv")]
    )
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "answers.tsv").read_text().splitlines()
    assert lines[0] == "question\tcontext\tanswer\tscore\tstart\tend" and lines[1].split("\t")[2:3] == ["dull"]


# ---------------------------------------------------------------------------------------------
# Bad input and refusals: one line each
# ---------------------------------------------------------------------------------------------


def test_a_dev_answer_off_its_context_is_one_line_and_no_run(tiny_bert, qa_task, tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "train.json").write_text((qa_task / "train.json").read_text())
    broken = json.loads(json.dumps(SQUAD))
    broken["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = "Spain"
    (task / "dev.json").write_text(json.dumps(broken, indent=1))
    recipe = write_yaml(tmp_path / "recipe.yaml", qa_recipe(tiny_bert, task, tmp_path / "run"))
    message = one_error_line(runner.invoke(app, ["finetune", str(recipe)]))
    line = next(
        number for number, text in enumerate((task / "dev.json").read_text().splitlines(), start=1) if '"n1"' in text
    )
    assert message.startswith(f'error: {task / "dev.json"} line {line}: question n1: the answer "Spain" is not at')
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"text_columns": ["question"]}, "text_columns: not for kind spans"),
        ({"format": "jsonl"}, "task.format: not for kind spans (a key of kind classification, regression, multilabel"),
        ({"doc_stride": 16}, "doc_stride 16: windows of max_length 32 tokens need a doc_stride below half of it"),
    ],
)
def test_other_kinds_keys_are_refused_for_question_answering(tiny_bert, qa_task, tmp_path, keys, expected):
    recipe = write_yaml(tmp_path / "recipe.yaml", qa_recipe(tiny_bert, qa_task, tmp_path / "run", **keys))
    assert expected in one_error_line(runner.invoke(app, ["finetune", str(recipe)]))


def test_span_keys_need_kind_spans_and_pooling_is_refused(tiny_bert, qa_task, tmp_path):
    data = qa_recipe(tiny_bert, qa_task, tmp_path / "run")
    data["task"].update({"kind": "tokens"})
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "a.yaml", data))]))
    assert "task.doc_stride: not for kind tokens (a key of kind spans)" in message
    data = {**qa_recipe(tiny_bert, qa_task, tmp_path / "run"), "pooling": "mean"}
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "b.yaml", data))]))
    assert "pooling: mean pools a text into one vector for a class; question answering" in message


def test_an_awd_lstm_is_refused_for_question_answering_in_one_line(qa_task, tmp_path):
    from tests.commands.test_profile import save_tiny_awd_lstm

    checkpoint = save_tiny_awd_lstm(tmp_path / "lm")
    recipe = write_yaml(tmp_path / "recipe.yaml", qa_recipe(checkpoint, qa_task, tmp_path / "run"))
    message = one_error_line(runner.invoke(app, ["finetune", str(recipe)]))
    assert "is a 'awd_lstm' model, which has no question-answering head" in message


def test_profile_counts_the_question_answering_model(tiny_bert, qa_task, tmp_path):
    data = qa_recipe(tiny_bert, qa_task, tmp_path / "run")
    result = runner.invoke(
        app, ["profile", str(write_yaml(tmp_path / "recipe.yaml", data)), "--json", "--matmul-gflops", "100"]
    )
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)
    real = AutoModelForQuestionAnswering.from_pretrained(tiny_bert)
    assert profile["parameters"]["total"] == sum(parameter.numel() for parameter in real.parameters())
    assert profile["model"]["kind"].startswith("question answering")


def test_a_stopped_question_answering_run_resumes_bit_for_bit(tiny_bert, qa_task, tmp_path, monkeypatch):
    from tests.training.test_resume_finetune import Stopped, assert_same_run, stop_after_checkpoint

    def recipe(name: str) -> Path:
        data = qa_recipe(tiny_bert, qa_task, tmp_path / name)
        data.update({"checkpoint_every": 7, "eval_every": 5})
        data["training"]["epochs"] = 2
        return write_yaml(tmp_path / f"{name}.yaml", data)

    assert runner.invoke(app, ["finetune", str(recipe("full"))]).exit_code == 0
    stop_after_checkpoint(monkeypatch, 28)  # mid-epoch 2, after an evaluation at step 25
    with pytest.raises(Stopped):
        from finetune.recipes import load_recipe
        from finetune.stages.finetune import run_finetune

        run_finetune(load_recipe(recipe("resumed")))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(tmp_path / "resumed.yaml"), "--resume"])
    assert result.exit_code == 0, result.output
    assert_same_run(tmp_path / "full", tmp_path / "resumed")
