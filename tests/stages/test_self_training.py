"""Self-training end to end on a tiny model: round folders, the records of the rows that joined, the last round's
model as the run's (loadable in transformers), --resume after round 0, each run of seeds with its rounds, the auto
rule's lines, and every refusal in one line with nothing left behind. Nothing here depends on what a tiny model
learns: the assertions are of structure, counts and the same rows chosen again."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.kinds import method
from finetune.recipes import load_recipe
from finetune.reporting.compare import compare_runs
from finetune.run_dir import is_own_entry, read_metrics, remove_own_entries
from finetune.stages import self_training
from finetune.stages.finetune import run_finetune
from finetune.training import loop as loop_module
from tests.conftest import make_sentence, one_error_line, write_task, write_yaml
from tests.recipes.test_backbone_defaults import minimal_recipe
from tests.training.test_resume_finetune import Stopped

runner = CliRunner()
PER_CLASS = 6  # a round's rows per class, small enough for the cap to matter on 30 unlabelled rows


def task_texts(task: Path, split: str) -> list[str]:
    return [line.split("\t")[0] for line in (task / f"{split}.tsv").read_text().splitlines()[1:]]


def write_unlabelled(task: Path, path: Path) -> Path:
    """30 generated reviews, then a labelled training text, a dev text and the first review again (none may join)."""
    rng = random.Random(7)
    texts = [make_sentence(rng, rng.random() < 0.5) for _ in range(30)]
    path.write_text("\n".join([*texts, task_texts(task, "train")[0], task_texts(task, "dev")[0], texts[0]]) + "\n")
    return path


def recipe(checkpoint: Path, task: Path, run_dir: Path, unlabelled: Path, **extra) -> dict:
    """The tiny classifier on 20 labelled rows per class, 2 steps a round; threshold 0.5, which the top class of two
    always reaches, so every row not left out is confident whatever the model learnt. keep: last, since which round
    a tiny model's dev scores favour is chance (keep: best is tested with the scores set)."""
    section = {"threshold": 0.5, "per_class": PER_CLASS, "keep": "last", **extra.pop("self_training", {})}
    data = minimal_recipe(checkpoint, task, run_dir, unlabelled_text=str(unlabelled), self_training=section, **extra)
    data["training"] = {"max_steps": 2, "batch_size": 8, "device": "cpu"}
    return data


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_one_round_joins_the_confident_rows_and_its_model_is_the_runs(pretrained, task_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForSequenceClassification

    monkeypatch.setattr(method, "SELF_TRAINING_ROUNDS", 1)  # auto's rounds, fewer for a test
    monkeypatch.setattr(method, "SELF_TRAINING_MEASURED_GAIN", True)  # auto's rule where it runs rounds
    unlabelled = write_unlabelled(task_dir, tmp_path / "unlabelled.txt")
    run = tmp_path / "run"
    data = recipe(pretrained, task_dir, run, unlabelled)
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert (
        "self-training: 1 round (auto: 33 unlabelled rows and 20 labelled rows per class (median), at most 100 "
        "(finetune/kinds/method.py))" in output
    )
    # The tiny checkpoint is a masked LM with its head: stage 2 is not run here, and the line says how to run it.
    assert "stage 2 (a language-model pass over unlabelled_text): not run by a finetune run; ULMFiT's" in output
    assert sorted(entry.name for entry in run.iterdir()) == [
        ".finetune-run", "checkpoint", "dev_predictions.jsonl", "metrics.jsonl", "recipe.yaml", "result.json",
        "round-0", "round-1", "self_training.json", "self_training.md",
    ]  # fmt: skip
    assert all(is_own_entry(entry) for folder in (run, run / "round-0", run / "round-1") for entry in folder.iterdir())

    # The rows that may join: each unlabelled text once, none of the labelled training rows or the dev rows.
    excluded = set(task_texts(task_dir, "train")) | set(task_texts(task_dir, "dev"))
    eligible = {text for text in unlabelled.read_text().splitlines() if text not in excluded}
    joined = jsonl(run / "round-1" / "pseudo_labelled.jsonl")
    assert {row["sentence"] for row in joined} <= eligible and len({row["sentence"] for row in joined}) == len(joined)
    selection = next(record for record in read_metrics(run / "round-1" / "metrics.jsonl") if "added" in record)
    assert sum(selection["confident"].values()) == len(eligible)  # threshold 0.5: every row left in is confident
    for label in ("0", "1"):
        assert selection["added"][label] == min(PER_CLASS, selection["confident"][label])
        assert selection["added"][label] == sum(row["label"] == label for row in joined)
    assert not (run / "round-0" / "pseudo_labelled.jsonl").exists()
    # Every round trains from model.checkpoint, not from the round before.
    assert load_recipe(run / "round-1" / "recipe.yaml", check_paths=False).model.checkpoint == str(pretrained)

    rounds = [record for record in read_metrics(run / "metrics.jsonl") if record["phase"] == "self_training"]
    round_results = [json.loads((run / f"round-{number}" / "result.json").read_text()) for number in (0, 1)]
    assert [record["round"] for record in rounds] == [0, 1]
    assert [record["dev_accuracy"] for record in rounds] == [result["best"]["dev_accuracy"] for result in round_results]
    assert rounds[1]["added"] == selection["added"] and rounds[1]["training_rows"] == 40 + len(joined)
    assert f"self-training round 1: {len(joined)} pseudo-labelled rows (0 " in output
    summary = json.loads((run / "self_training.json").read_text())
    assert (summary["final_round"], summary["stopped"], summary["per_class"]) == (1, None, PER_CLASS)
    top = json.loads((run / "result.json").read_text())
    assert top.pop("self_training")["pseudo_labelled_rows"] == len(joined) and top == round_results[1]
    assert (run / "dev_predictions.jsonl").read_text() == (run / "round-1" / "dev_predictions.jsonl").read_text()

    # The run's checkpoint is round 1's weights, loads in transformers, and its card says it was self-trained.
    final, last_round = (
        load_file(run / "checkpoint" / "model.safetensors"),
        load_file(run / "round-1" / "checkpoint" / "model.safetensors"),
    )
    assert all(torch.equal(final[name], last_round[name]) for name in final)
    model = AutoModelForSequenceClassification.from_pretrained(run / "checkpoint")
    assert model.config.num_labels == 2
    card = (run / "checkpoint" / "README.md").read_text()
    assert "## Self-training" in card and f"| 1 | {selection['added']['0']} |" in card
    assert "## Self-training" not in (run / "round-1" / "checkpoint" / "README.md").read_text()  # its own copy
    # runs compare reads a self-training run as its last round's training, and pairs its dev rows with another run's.
    report, _ = compare_runs([run / "round-0", run], tmp_path / "compare.md")
    assert next(line for line in report.splitlines() if line.startswith(f"| {run} |")).split(" | ")[1] == "2"
    assert "## Paired test on the same 24 dev rows" in report
    remove_own_entries(run)
    assert list(run.iterdir()) == []


def stop_in_round_1(step: int):
    """A TrainingLoop.__init__ that raises Stopped in round 1 after its periodic checkpoint of `step`; and the
    rounds that started a loop."""
    original_init = loop_module.TrainingLoop.__init__
    started: list[str] = []

    def init_that_stops(self, *arguments, **keywords):
        original_init(self, *arguments, **keywords)
        save, folder = self.save_checkpoint, Path(self.metrics_log.path).parent.name
        started.append(folder)

        def save_then_stop(progress):
            saved = save(progress)
            if folder == "round-1" and progress.step == step:
                raise Stopped
            return saved

        self.save_checkpoint = save_then_stop

    return init_that_stops, started


def test_resume_keeps_round_0_and_continues_round_1_as_an_unstopped_run(pretrained, task_dir, tmp_path, monkeypatch):
    unlabelled = write_unlabelled(task_dir, tmp_path / "unlabelled.txt")
    extra = {"checkpoint_every": 1, "self_training": {"rounds": 1}}
    full = recipe(pretrained, task_dir, tmp_path / "full", unlabelled, **extra)
    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", full)))
    data = recipe(pretrained, task_dir, tmp_path / "resumed", unlabelled, **extra)
    path = write_yaml(tmp_path / "resumed.yaml", data)
    init_that_stops, started = stop_in_round_1(1)
    monkeypatch.setattr(loop_module.TrainingLoop, "__init__", init_that_stops)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(path))
    resumed = tmp_path / "resumed"
    assert (resumed / "round-0" / "result.json").is_file() and not (resumed / "result.json").exists()
    round_0 = (resumed / "round-0" / "metrics.jsonl").read_text()

    again = runner.invoke(app, ["finetune", str(path)])  # not resumed: the stopped run is not replaced
    assert "holds a stopped run that --resume continues" in one_error_line(again)
    original = unlabelled.read_text()
    unlabelled.write_text(original.replace("the", "a"))  # other texts: round 0's model labels other rows
    changed = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert "unlabelled_text: the previous round's model now labels other rows than" in one_error_line(changed)
    unlabelled.write_text(original)

    result = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert "round 0 finished before: kept" in " ".join(result.output.split()) and "resuming from" in result.output
    assert started == ["round-0", "round-1", "round-1"]  # resumed: round 1 alone, and only once (not refused)
    assert (resumed / "round-0" / "metrics.jsonl").read_text() == round_0
    full = tmp_path / "full"
    assert (full / "round-1" / "pseudo_labelled.jsonl").read_text() == (
        resumed / "round-1" / "pseudo_labelled.jsonl"
    ).read_text()
    final, expected = (
        load_file(resumed / "checkpoint" / "model.safetensors"),
        load_file(full / "checkpoint" / "model.safetensors"),
    )
    assert all(torch.equal(final[name], expected[name]) for name in expected)
    assert json.loads((full / "result.json").read_text()) == json.loads((resumed / "result.json").read_text())
    assert [record["round"] for record in read_metrics(resumed / "metrics.jsonl")] == [0, 1]
    finished = runner.invoke(app, ["finetune", str(path), "--resume"])
    assert finished.exit_code == 0 and "finished before: nothing to resume" in " ".join(finished.output.split())


def test_each_seed_runs_its_own_rounds_from_python(pretrained, task_dir, tmp_path):
    import finetune

    texts = write_unlabelled(task_dir, tmp_path / "unlabelled.txt").read_text().splitlines()
    unlabelled = tmp_path / "unlabelled.jsonl"  # a table of the task's text column
    unlabelled.write_text("".join(json.dumps({"sentence": text, "source": "web"}) + "\n" for text in texts))
    data = recipe(pretrained, task_dir, tmp_path / "seeds", unlabelled, seeds=[0, 1], self_training={"rounds": 1})
    result = finetune.finetune(data)
    run = tmp_path / "seeds"
    for seed in ("seed-0", "seed-1"):
        assert (run / seed / "round-1" / "pseudo_labelled.jsonl").is_file()
        assert (run / seed / "checkpoint" / "README.md").read_text().count("## Self-training") == 1
    summary = json.loads((run / "seeds.json").read_text())
    last_rounds = [json.loads((run / seed / "round-1" / "result.json").read_text()) for seed in ("seed-0", "seed-1")]
    values = [result["best"]["dev_accuracy"] for result in last_rounds]
    assert summary["metrics"]["dev_accuracy"]["values"] == values  # the seeds' final rounds
    assert result.metrics["metrics"]["dev_accuracy"]["values"] == values


def test_auto_stays_off_with_many_labels_per_class_and_says_so(pretrained, task_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(method, "SELF_TRAINING_UP_TO", 10)  # 20 labelled rows per class count as many here
    monkeypatch.setattr(method, "SELF_TRAINING_MEASURED_GAIN", True)
    unlabelled = write_unlabelled(task_dir, tmp_path / "unlabelled.txt")
    data = recipe(pretrained, task_dir, tmp_path / "run", unlabelled)
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    assert "self-training: off (auto: 20 labelled rows per class (median), more than 10" in " ".join(
        result.output.split()
    )
    assert (tmp_path / "run" / "checkpoint").is_dir() and not (tmp_path / "run" / "round-0").exists()
    # Without unlabelled text, the common case, not a word about self-training.
    plain = load_recipe(write_yaml(tmp_path / "plain.yaml", minimal_recipe(pretrained, task_dir, tmp_path / "plain")))
    capsys.readouterr()
    assert self_training.self_training_plan(plain, self_training.read_unlabelled(plain)) is None
    assert "self-training" not in capsys.readouterr().out


def pair_task(folder: Path) -> dict:
    """A custom task of two text columns (first, second)."""
    write_task(folder)
    for split in ("train", "dev"):
        path = folder / f"{split}.tsv"
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        path.write_text("\n".join(["first\tsecond\tlabel", *(f"{a}\t{a}\t{b}" for a, b in rows[1:])]) + "\n")
    columns = {"text_columns": ["first", "second"], "label_column": "label", "labels": ["0", "1"]}
    return {"name": "pairs", "data_dir": str(folder), **columns}


REFUSALS = {
    "rounds without text": (
        {"unlabelled_text": [], "self_training": {"rounds": 2}},
        "self_training.rounds: 2 round(s) label unlabelled_text, which the recipe does not give",
    ),
    "missing file": ({"unlabelled_text": "absent.txt"}, "unlabelled_text: no such file: absent.txt"),
    "empty file": ({"unlabelled_text": "empty.txt"}, "unlabelled_text: empty.txt: no text (every line is empty)"),
    "no text column": ({"unlabelled_text": "other.tsv"}, "unlabelled_text: other.tsv: missing column(s) sentence"),
    "a line without the column": ({"unlabelled_text": "bad.jsonl"}, "unlabelled_text: bad.jsonl line 2: missing key"),
    "plain text for a pair task": (
        {"unlabelled_text": "lines.txt", "task": "pairs"},
        "unlabelled_text: lines.txt: plain text holds one text a line, and task 'pairs' reads 2 text columns",
    ),
    "another kind": (
        {"unlabelled_text": "lines.txt", "task": "regression"},
        "unlabelled_text: self-training labels text with the classes of kind classification",
    ),
    "keep without text": (
        {"unlabelled_text": [], "self_training": {"keep": "last"}},
        "self_training.keep is read with unlabelled_text, which the recipe does not give",
    ),
    "keep unknown": ({"self_training": {"keep": "first"}}, "self_training.keep: Input should be 'best' or 'last'"),
    "threshold 0": ({"self_training": {"threshold": 0}}, "self_training.threshold: Input should be greater than 0"),
    "threshold above 1": ({"self_training": {"threshold": 1.5}}, "self_training.threshold: Input should be less than"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_each_refusal_is_one_line_and_leaves_no_run_folder(pretrained, task_dir, tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lines.txt").write_text("the film was great .\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "other.tsv").write_text("text\nthe film was great .\n")
    (tmp_path / "bad.jsonl").write_text('{"sentence": "a good film"}\n{"text": "a bad film"}\n')
    change, expected = dict(REFUSALS[case][0]), REFUSALS[case][1]
    data = minimal_recipe(pretrained, task_dir, tmp_path / "run", unlabelled_text="lines.txt")
    task = change.pop("task", None)
    if task == "pairs":
        data["task"] = pair_task(tmp_path / "pairs")
    elif task == "regression":
        data["task"] = {**data["task"], "labels": None, "metrics": ["pearson"]}
    data.update(change)
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert expected in one_error_line(result)
    assert not (tmp_path / "run").exists()


def test_a_round_that_would_teach_nothing_new_is_not_trained(tmp_path):
    from types import SimpleNamespace

    import numpy as np

    from finetune.training.self_training import PseudoLabelled

    spec = SimpleNamespace(text_columns=("sentence",), labels=("0", "1"))
    recipe = SimpleNamespace(run_dir=tmp_path, self_training=SimpleNamespace(min_rows=2))
    plan = SimpleNamespace(spec=spec)
    rows = PseudoLabelled([("a film",)], [("a film",)], np.array([1]), np.array([0.95]))
    assert self_training.stop_reason(recipe, plan, 2, rows) == (
        "1 row(s) would join, fewer than self_training.min_rows 2"
    )
    recipe.self_training.min_rows = 1
    assert self_training.stop_reason(recipe, plan, 2, rows) is None  # round 1 took no rows of its own
    (tmp_path / "round-1").mkdir()
    PseudoLabelled([("a film",)], [("a film",)], np.array([1]), np.array([0.91])).write(
        tmp_path / "round-1", spec.text_columns, spec.labels
    )
    assert self_training.stop_reason(recipe, plan, 2, rows) == (
        "the rows round 1 trained on would join again, with the same labels"
    )
    relabelled = PseudoLabelled([("a film",)], [("a film",)], np.array([0]), np.array([0.95]))
    assert self_training.stop_reason(recipe, plan, 2, relabelled) is None


def test_keep_best_keeps_the_round_of_the_best_dev_score(pretrained, task_dir, tmp_path, monkeypatch):
    """Round 1 scored below round 0 on dev (set here, as SST-2's pseudo-labels did at 8 labels per class): the run's
    model, result and dev predictions are round 0's, and every record says why."""
    scores = {0: 0.75, 1: 0.5}
    original = self_training.round_summary

    def summary_with_set_score(plan, number, folder):
        return {**original(plan, number, folder), "dev_accuracy": scores[number]}

    monkeypatch.setattr(self_training, "round_summary", summary_with_set_score)
    unlabelled = write_unlabelled(task_dir, tmp_path / "unlabelled.txt")
    run = tmp_path / "run"
    data = recipe(pretrained, task_dir, run, unlabelled, self_training={"rounds": 1, "keep": "best"})
    del data["self_training"]["keep"]  # best is the default
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    why = "round 0's, the best dev accuracy (0.7500)"
    assert f"self-training: the run's model is {why}" in " ".join(result.output.split())
    summary = json.loads((run / "self_training.json").read_text())
    assert (summary["final_round"], summary["kept_round"], summary["kept_because"]) == (1, 0, why)
    kept, round_0 = (load_file(run / folder / "model.safetensors") for folder in ("checkpoint", "round-0/checkpoint"))
    assert all(torch.equal(kept[name], round_0[name]) for name in round_0)
    top = json.loads((run / "result.json").read_text())
    assert top.pop("self_training")["pseudo_labelled_rows"] == 0
    assert top == json.loads((run / "round-0" / "result.json").read_text())
    assert (run / "dev_predictions.jsonl").read_text() == (run / "round-0" / "dev_predictions.jsonl").read_text()
    assert f"the model is {why}" in " ".join((run / "checkpoint" / "README.md").read_text().split())


def test_the_kept_round_rule():
    def rounds(*values, metric="accuracy"):
        return [{"round": number, "main_metric": metric, f"dev_{metric}": value} for number, value in enumerate(values)]

    assert self_training.kept_round(rounds(0.6, 0.7, 0.65), "best", False) == (
        1,
        "round 1's, the best dev accuracy (0.7000)",
    )
    assert self_training.kept_round(rounds(0.7, 0.7), "best", False)[0] == 0  # the earliest of equal scores
    assert self_training.kept_round(rounds(0.4, 0.5, metric="f1_macro"), "best", False)[0] == 1
    assert self_training.kept_round(rounds(0.7, 0.6), "last", False) == (
        1,
        "the last round's (self_training.keep: last)",
    )
    assert self_training.kept_round(rounds(0.7, 0.6), "best", True) == (
        1,
        "the last round's: every dev row is a training row, so dev cannot rank the rounds",
    )
    assert self_training.kept_round(rounds(0.7), "best", False) == (0, "round 0's, the only round trained")


def test_a_dev_file_of_training_rows_cannot_rank_the_rounds(pretrained, task_dir, tmp_path):
    unlabelled = write_unlabelled(task_dir, tmp_path / "unlabelled.txt")
    data = recipe(pretrained, task_dir, tmp_path / "run", unlabelled, self_training={"rounds": 1})
    separate = load_recipe(write_yaml(tmp_path / "a.yaml", data))
    plan = self_training.self_training_plan(separate, self_training.read_unlabelled(separate))
    assert plan is not None and not plan.dev_is_training
    (task_dir / "dev.tsv").write_text((task_dir / "train.tsv").read_text())  # the few-label habit: dev = the rows
    same = load_recipe(write_yaml(tmp_path / "b.yaml", data))
    plan = self_training.self_training_plan(same, self_training.read_unlabelled(same))
    assert plan is not None and plan.dev_is_training
