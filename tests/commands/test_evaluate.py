"""`finetune eval` over GLUE: every task from its files through the metrics to the submission archive.

The checkpoints are tiny BERT classifiers whose head ignores the input and always gives one class (or
one score), so every dev score and every submitted value is known by hand.
"""

from __future__ import annotations

import json
import statistics
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from transformers import BertConfig, BertForSequenceClassification
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.evaluate import run_eval
from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_wordpiece
from finetune.errors import UserError
from finetune.glue.specs import GLUE_TASKS
from finetune.glue.submission import glue_test_ids, validate_submission
from finetune.models.heads import label_config
from finetune.recipes import load_recipe, recipe_to_yaml
from finetune.tasks.specs import TaskSpec
from finetune.training.checkpoints import save_checkpoint
from tests.conftest import eval_recipe, write_corpus, write_task, write_yaml
from tests.data.test_glue_data import TEST_ROWS, write_glue_root

runner = CliRunner()

# The class index (or score) each task's checkpoint always predicts; rte has two runs.
OUTPUTS = {"cola": 1, "sst2": 0, "mrpc": 1, "stsb": 7.25, "qqp": 1, "mnli": 1, "qnli": 1, "rte": [0, 1], "wnli": 0}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    return train_wordpiece(read_documents([write_corpus(folder / "corpus")]), vocab_size=120, min_frequency=1)


def constant_classifier(tokenizer, spec: TaskSpec, output: float, folder: Path) -> str:
    """A tiny BERT classifier for `spec` whose logits are the same for every input: class `output` wins."""
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        **label_config(spec),
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        if spec.is_regression:
            model.classifier.bias.fill_(output)
        else:
            model.classifier.bias[int(output)] = 1.0
    return str(save_checkpoint(model, tokenizer, folder))


@pytest.fixture(scope="module")
def checkpoints(tokenizer, tmp_path_factory) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("checkpoints")
    made = {}
    for name, outputs in OUTPUTS.items():
        outputs = outputs if isinstance(outputs, list) else [outputs]
        made[name] = [
            constant_classifier(tokenizer, GLUE_TASKS[name], output, folder / f"{name}-{run}")
            for run, output in enumerate(outputs)
        ]
    return made


def glue_recipe(run_dir: Path, tasks: dict, **keys) -> dict:
    return {
        "stage": "eval",
        "run_dir": str(run_dir),
        "tasks": tasks,
        "batch_size": 4,
        "device": "cpu",
        "max_length": 16,
        **keys,
    }


def evaluate(tmp_path: Path, data: dict) -> dict:
    return run_eval(load_recipe(write_yaml(tmp_path / "eval.yaml", data)))


@pytest.fixture(scope="module")
def full_run(checkpoints, tmp_path_factory) -> dict:
    """Every GLUE task scored and submitted from a complete GLUE root."""
    folder = tmp_path_factory.mktemp("full")
    root = write_glue_root(folder / "glue")
    report = evaluate(folder, glue_recipe(folder / "run", checkpoints, glue_dir=str(root), submission=True))
    return {"report": report, "run_dir": folder / "run", "root": root}


def test_dev_scores_of_every_task_by_hand(full_run):
    tasks = full_run["report"]["tasks"]
    assert list(tasks) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli"]
    means = {
        name: {metric: summary["mean"] for metric, summary in task["summary"].items()} for name, task in tasks.items()
    }
    # Dev labels in tests/data/test_glue_data.py; each checkpoint predicts one class for everything.
    assert means["cola"] == {"mcc": 0.0, "accuracy": 0.75}  # predicts 1; labels 1 0 1 1
    assert means["sst2"] == {"accuracy": 0.5}  # predicts 0; labels 1 0 0 1
    assert means["mrpc"] == pytest.approx({"f1": 0.75, "accuracy": 0.6})  # predicts 1; tp 3 fp 2: F1 6/8
    assert means["stsb"] == {"pearson": 0.0, "spearman": 0.0}  # a constant score correlates with nothing
    assert means["qqp"] == pytest.approx({"f1": 0.4, "accuracy": 0.25})  # predicts 1; tp 1 fp 3: F1 2/5
    assert means["mnli"] == {"accuracy": 0.5}  # predicts entailment; 2 of 4
    assert means["mnli-mm"] == pytest.approx({"accuracy": 2 / 3})  # 2 of 3
    assert means["qnli"] == {"accuracy": 0.75}  # predicts not_entailment; 3 of 4
    assert means["wnli"] == pytest.approx({"accuracy": 1 / 3})  # predicts 0; 1 of 3
    assert tasks["mnli"]["display_name"] == "MNLI-m" and tasks["stsb"]["examples"] == 4


def test_runs_of_a_task_are_aggregated(full_run, checkpoints):
    rte = full_run["report"]["tasks"]["rte"]
    assert [run["checkpoint"] for run in rte["runs"]] == checkpoints["rte"]
    summary = rte["summary"]["accuracy"]
    # run 0 predicts entailment (3 of 4 right), run 1 not_entailment (1 of 4)
    assert summary["values"] == [0.75, 0.25]
    assert (summary["mean"], summary["median"], summary["min"], summary["max"]) == (0.5, 0.5, 0.25, 0.75)
    assert summary["std"] == pytest.approx(statistics.stdev([0.75, 0.25]))


def test_glue_scores_of_the_report(full_run):
    scores = full_run["report"]["glue_scores"]
    # CoLA 0, SST-2 .5, MRPC (.75 + .6) / 2, STS-B 0, QQP (.4 + .25) / 2, MNLI (.5 + 2/3) / 2, QNLI .75,
    # RTE .5 (mean of the runs), WNLI 1/3
    leaderboard = [0, 0.5, 0.675, 0, 0.325, (0.5 + 2 / 3) / 2, 0.75, 0.5, 1 / 3]
    assert scores["leaderboard"]["score"] == pytest.approx(sum(leaderboard) / 9)
    bert_paper = [0, 0.5, 0.75, 0, 0.4, 0.5, 2 / 3, 0.75, 0.5]  # MRPC/QQP F1, STS-B Spearman, MNLI m and mm
    assert scores["bert-paper"]["score"] == pytest.approx(sum(bert_paper) / 9)
    assert scores["one-metric-per-task"]["score"] == pytest.approx((sum(bert_paper) + 1 / 3) / 10)
    assert full_run["report"]["missing_tasks"] == []


def test_submission_archive_of_every_task(full_run, checkpoints):
    archive = full_run["run_dir"] / "submission.zip"
    with zipfile.ZipFile(archive) as opened:
        files = {name: opened.read(name).decode("utf-8").splitlines() for name in opened.namelist()}
    assert len(files) == 11
    expected = {
        "CoLA.tsv": "1",
        "SST-2.tsv": "0",
        "MRPC.tsv": "1",
        "STS-B.tsv": "5.000",
        "QQP.tsv": "1",
        "MNLI-m.tsv": "entailment",
        "MNLI-mm.tsv": "entailment",
        "AX.tsv": "entailment",
        "QNLI.tsv": "not_entailment",
        "RTE.tsv": "entailment",
        "WNLI.tsv": "0",
    }
    for name, value in expected.items():
        spec = next(spec for spec in GLUE_TASKS.values() if spec.submission_file == name)
        assert files[name] == ["index\tprediction"] + [f"{index}\t{value}" for index in range(TEST_ROWS[spec.name])]
    submission = full_run["report"]["submission"]
    assert submission["missing"] == [] and submission["files"]["RTE.tsv"]["checkpoint"] == checkpoints["rte"][0]
    assert submission["files"]["AX.tsv"] == {"task": "ax", "checkpoint": checkpoints["mnli"][0], "rows": 3}
    assert validate_submission(archive, glue_test_ids(full_run["root"])).accepted()


def test_report_files(full_run):
    run_dir = full_run["run_dir"]
    assert json.loads((run_dir / "report.json").read_text(encoding="utf-8")) == full_run["report"]
    markdown = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "| RTE | accuracy | 2 | 50.0 | 50.0 | 35.4 | 25.0 | 75.0 |" in markdown
    assert "| leaderboard | 40.7 | 9 of 9 | - |" in markdown
    assert "none: every GLUE task is scored" in markdown and "Complete" in markdown
    saved = load_recipe(run_dir / "recipe.yaml", check_paths=False)  # the resolved recipe loads again
    runs = full_run["report"]["tasks"]["rte"]["runs"]
    assert saved.submission and saved.tasks["rte"].checkpoints == [run["checkpoint"] for run in runs]


def test_some_tasks_missing(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue", skip=("qqp", "mnli", "ax", "qnli"))
    tasks = {name: checkpoints[name] for name in ("cola", "rte", "stsb")}
    data = glue_recipe(tmp_path / "run", tasks, glue_dir=str(root), submission=True)
    with pytest.raises(UserError, match="no test predictions for sst2, mrpc, qqp, mnli, mnli-mm, qnli, wnli, ax"):
        evaluate(tmp_path, data)
    assert not (tmp_path / "run").exists()
    data["allow_incomplete"] = True
    report = evaluate(tmp_path, data)
    assert report["missing_tasks"] == ["sst2", "mrpc", "qqp", "mnli", "mnli-mm", "qnli", "wnli", "ax"]
    assert report["glue_scores"]["leaderboard"]["score"] is None
    assert report["glue_scores"]["leaderboard"]["missing"] == ["SST-2", "MRPC", "QQP", "MNLI", "QNLI", "WNLI"]
    assert report["submission"]["missing"] == ["sst2", "mrpc", "qqp", "mnli", "mnli-mm", "qnli", "wnli", "ax"]
    with zipfile.ZipFile(tmp_path / "run" / "submission.zip") as opened:
        assert sorted(opened.namelist()) == ["CoLA.tsv", "RTE.tsv", "STS-B.tsv"]
    markdown = (tmp_path / "run" / "report.md").read_text(encoding="utf-8")
    assert "| leaderboard | incomplete (mean of the 3 present:" in markdown
    assert "Missing from the archive: sst2, mrpc" in markdown


def test_allow_incomplete_scores_the_tasks_present_and_says_what_it_left_out(checkpoints, tmp_path, capsys):
    """The README's GLUE folder holds 6 of the 9 tasks and the user trained some of them: the listed tasks with both
    their dev data and their checkpoints are scored, the others are named with the reason, in one line and in the
    report; without a submission as well as with one."""
    root = write_glue_root(tmp_path / "glue", skip=("qqp", "mnli", "ax", "qnli"))
    tasks = {
        "cola": checkpoints["cola"],
        "rte": checkpoints["rte"],
        "qqp": checkpoints["qqp"],  # a checkpoint, but no QQP folder
        "sst2": [str(tmp_path / "runs" / "sst2" / "checkpoint")],  # data, but not trained yet
    }
    data = glue_recipe(tmp_path / "run", tasks, glue_dir=str(root))
    with pytest.raises(UserError, match=r"task .qqp.: no dev file"):  # without the key: the first absence is an error
        evaluate(tmp_path, data)
    report = evaluate(tmp_path, {**data, "allow_incomplete": True})
    assert list(report["tasks"]) == ["cola", "rte"] and report["submission"] is None
    assert report["left_out"] == {
        "sst2": f"no checkpoint {tmp_path / 'runs' / 'sst2' / 'checkpoint'}",
        "qqp": f"no dev file {root / 'QQP' / 'dev.tsv'}",
    }
    note = [line for line in capsys.readouterr().err.splitlines() if line.startswith("allow_incomplete: left out")]
    assert len(note) == 1 and "sst2 (no checkpoint" in note[0] and "qqp (no dev file" in note[0]
    markdown = (tmp_path / "run" / "report.md").read_text(encoding="utf-8")
    assert "Listed but left out (allow_incomplete): sst2 (no checkpoint" in markdown
    with_archive = evaluate(
        tmp_path, {**data, "run_dir": str(tmp_path / "zip"), "allow_incomplete": True, "submission": True}
    )
    assert sorted(with_archive["submission"]["files"]) == ["CoLA.tsv", "RTE.tsv"]


def test_allow_incomplete_with_nothing_present_or_a_broken_checkpoint(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue", skip=("rte",))
    nothing = glue_recipe(tmp_path / "run", {"rte": checkpoints["rte"]}, glue_dir=str(root), allow_incomplete=True)
    with pytest.raises(UserError, match="no task has both its dev data and its checkpoints"):
        evaluate(tmp_path, nothing)
    broken = tmp_path / "broken"  # a folder that is there but holds no model: a mistake, never left out quietly
    broken.mkdir()
    data = glue_recipe(tmp_path / "run", {"cola": [str(broken)]}, glue_dir=str(root), allow_incomplete=True)
    with pytest.raises(UserError, match=r"tasks.cola: .*broken has no config.json"):
        evaluate(tmp_path, data)
    assert not (tmp_path / "run").exists()


def test_task_folder_of_its_own_and_dev_only(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue")
    (root / "diagnostic" / "diagnostic.tsv").rename(root / "MNLI" / "diagnostic.tsv")  # AX beside MNLI's files
    tasks = {"mnli": {"checkpoints": checkpoints["mnli"], "data_dir": str(root / "MNLI")}}
    report = evaluate(tmp_path, glue_recipe(tmp_path / "run", tasks, submission=True, allow_incomplete=True))
    assert list(report["tasks"]) == ["mnli", "mnli-mm"]
    assert sorted(report["submission"]["files"]) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    dev_only = evaluate(tmp_path, glue_recipe(tmp_path / "dev", {"rte": checkpoints["rte"][1]}, glue_dir=str(root)))
    assert dev_only["submission"] is None and dev_only["tasks"]["rte"]["summary"]["accuracy"]["mean"] == 0.25
    assert not (tmp_path / "dev" / "submission.zip").exists()


def test_hub_source(checkpoints, tmp_path, fake_hub):
    data = glue_recipe(
        tmp_path / "run", {"mnli": checkpoints["mnli"]}, source="hub", submission=True, allow_incomplete=True
    )
    report = evaluate(tmp_path, data)
    # hub dev labels: matched entailment, neutral, contradiction; mismatched contradiction twice
    assert report["tasks"]["mnli"]["summary"]["accuracy"]["mean"] == pytest.approx(1 / 3)
    assert report["tasks"]["mnli-mm"]["summary"]["accuracy"]["mean"] == 0.0
    with zipfile.ZipFile(tmp_path / "run" / "submission.zip") as opened:
        assert opened.read("MNLI-m.tsv").decode() == "index\tprediction\n7\tentailment\n8\tentailment\n"
        assert len(opened.read("AX.tsv").decode().splitlines()) == 4


def test_checkpoint_with_other_labels_is_refused(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue")
    data = glue_recipe(tmp_path / "run", {"qnli": checkpoints["mnli"]}, glue_dir=str(root))
    with pytest.raises(UserError, match=r"tasks.qnli.*predicts labels"):
        evaluate(tmp_path, data)
    assert not (tmp_path / "run").exists()


def test_missing_checkpoint_fails_before_any_model_runs(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue")
    data = glue_recipe(
        tmp_path / "run", {"cola": checkpoints["cola"], "rte": [str(tmp_path / "absent")]}, glue_dir=str(root)
    )
    with pytest.raises(UserError, match=r"tasks.rte: no such model folder"):
        evaluate(tmp_path, data)


def test_missing_dev_file(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue")
    (root / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(UserError, match=r"task 'mnli-mm': no dev file .*dev_mismatched.tsv"):
        evaluate(tmp_path, glue_recipe(tmp_path / "run", {"mnli": checkpoints["mnli"]}, glue_dir=str(root)))


# ---------------------------------------------------------------------------------------------
# The eval recipe's two shapes
# ---------------------------------------------------------------------------------------------


def recipe_error(tmp_path: Path, data: dict) -> str:
    with pytest.raises(UserError) as info:
        load_recipe(write_yaml(tmp_path / "eval.yaml", data), check_paths=False)
    return str(info.value)


def test_shorthand_task_entries(tmp_path):
    data = glue_recipe(
        tmp_path / "run", {"rte": "a", "mrpc": ["b", "c"], "mnli": {"checkpoints": ["d"]}}, glue_dir=str(tmp_path)
    )
    recipe = load_recipe(write_yaml(tmp_path / "eval.yaml", data))
    assert {name: entry.checkpoints for name, entry in recipe.tasks.items()} == {
        "rte": ["a"],
        "mrpc": ["b", "c"],
        "mnli": ["d"],
    }
    resolved = write_yaml(tmp_path / "resolved.yaml", yaml.safe_load(recipe_to_yaml(recipe)))
    assert load_recipe(resolved).tasks == recipe.tasks


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"tasks": {"mnli-mm": "a"}}, "tasks.mnli-mm: predicted by the mnli model"),
        ({"tasks": {"ax": "a"}}, "tasks.ax: predicted by the mnli model"),
        ({"tasks": {"sst5": "a"}}, "tasks.sst5: not a GLUE task"),
        ({"glue_dir": None}, "tasks.rte: no data: give its data_dir, or glue_dir"),
        ({"split": "test"}, "split: only with task"),
        ({"models": {"a": "b"}}, "models: only with task"),
        ({"source": "hub"}, "source hub reads no folders"),
        ({"tasks": {"rte": ["a", "a"]}}, "tasks.rte: checkpoint a is listed twice"),
        ({"tasks": {"rte": []}}, "tasks.rte.checkpoints"),
        ({"task": {"name": "rte", "data_dir": "."}}, "not both"),
    ],
)
def test_bad_glue_recipes(tmp_path, change, fragment):
    data = glue_recipe(tmp_path / "run", {"rte": "a"}, glue_dir=str(tmp_path))
    data.update(change)
    assert fragment in recipe_error(tmp_path, data)


def test_single_task_recipes_keep_working_and_refuse_glue_keys(tmp_path):
    task = write_task(tmp_path / "task")
    data = eval_recipe(task, tmp_path / "run", {"model": "somewhere"})
    assert load_recipe(write_yaml(tmp_path / "eval.yaml", data), check_paths=False).task.name == "tiny-sentiment"
    assert "submission: only with tasks" in recipe_error(tmp_path, {**data, "submission": True})
    assert "models: required key is missing" in recipe_error(tmp_path, {**data, "models": None})
    assert "give task and models (one task) or tasks" in recipe_error(
        tmp_path, {key: value for key, value in data.items() if key not in ("task", "models")}
    )


def test_cli_eval_and_validate(checkpoints, tmp_path):
    root = write_glue_root(tmp_path / "glue", skip=("qqp",))
    tasks = {name: checkpoints[name] for name in ("cola", "mnli")}
    path = write_yaml(tmp_path / "eval.yaml", glue_recipe(tmp_path / "run", tasks, glue_dir=str(root), submission=True))
    result = runner.invoke(app, ["eval", str(path)])
    assert result.exit_code == 2 and result.output.startswith("error: submission: no test predictions for sst2")
    result = runner.invoke(app, ["eval", str(path), "allow_incomplete=true"])
    assert result.exit_code == 0, result.output
    archive = tmp_path / "run" / "submission.zip"
    result = runner.invoke(app, ["validate-submission", str(archive), "--glue-dir", str(root), "--allow-incomplete"])
    assert result.exit_code == 0 and "valid, 7 task(s) missing" in result.output
    assert "AX.tsv: 3 rows (checked against the test file)" in result.output
