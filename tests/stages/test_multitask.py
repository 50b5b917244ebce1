"""`finetune multitask`: one encoder shared by several tasks (two GLUE tasks, one a regression, and a tagger), through
the real CLI on a tiny BERT; its checkpoint in transformers, in `finetune predict`, `eval` (GLUE submission) and as
the start of one task's run; --resume; and the recipes it refuses."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.recipes import load_recipe
from finetune.stages.multitask import run_multitask
from tests.conftest import interrupted_at_step, one_error_line, save_tiny_masked_lm, two_processes, write_yaml
from tests.data.test_glue_data import write_glue_root
from tests.kinds.test_tagging import write_conll

runner = CliRunner()
TASKS = ("rte", "stsb", "tags")
ENCODER = "bert.encoder.layer.0.attention.self.query.weight"  # a shared block's weight, as each task's model names it


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("multitask")
    tags = folder / "tags"
    for split, count, seed in (("train", 24, 1), ("dev", 8, 2), ("test", 4, 3)):
        write_conll(tags / f"{split}.txt", count, seed)
    return {"checkpoint": save_tiny_masked_lm(folder / "base"), "glue": write_glue_root(folder / "glue"),
            "tags": tags, "folder": folder}  # fmt: skip


def multitask_recipe(inputs: dict[str, Path], run_dir: Path, **keys: Any) -> dict[str, Any]:
    """Two GLUE tasks (RTE, STS-B: a regression) and a tagger, a few steps on the tiny BERT."""
    glue = inputs["glue"]
    return {
        "stage": "multitask",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"checkpoint": str(inputs["checkpoint"])},
        "training": {"max_steps": 8, "batch_size": 2, "lr": 2e-3, "log_every": 1, "device": "cpu"},
        "tasks": [
            {"name": "rte", "data_dir": str(glue / "RTE"), "max_length": 24},
            {"name": "stsb", "data_dir": str(glue / "STS-B"), "max_length": 24},
            {"name": "tags", "kind": "tokens", "data_dir": str(inputs["tags"]), "max_length": 24},
        ],
        "sampling": {"rule": "equal"},
        "loss_weights": {"tags": 0.5},
        **keys,
    }


def run_cli(command: str, recipe: dict[str, Any], folder: Path, *arguments: str):
    return runner.invoke(app, [command, str(write_yaml(folder / f"{command}.yaml", recipe)), *arguments])


@pytest.fixture(scope="module")
def finished(inputs) -> Path:
    """The run once for the module; its run folder."""
    run_dir = inputs["folder"] / "run"
    result = run_cli("multitask", multitask_recipe(inputs, run_dir), inputs["folder"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "multi-task: 3 tasks share the encoder's" in output and "sampling equal: rte 33.3% of the steps" in output
    return run_dir


def test_every_task_is_a_checkpoint_transformers_loads_on_one_shared_encoder(finished):
    checkpoint = finished / "checkpoint"
    manifest = json.loads((checkpoint / "multitask.json").read_text())
    assert [entry["name"] for entry in manifest["tasks"]] == list(TASKS)
    weights = {name: load_file(checkpoint / name / "model.safetensors") for name in TASKS}
    # The encoder is one: every task's checkpoint holds the same trained blocks; each head is its own.
    base = load_file(Path(json.loads((checkpoint / "multitask.json").read_text())["base"]) / "model.safetensors")
    assert torch.equal(weights["rte"][ENCODER], weights["stsb"][ENCODER])
    assert torch.equal(weights["rte"][ENCODER], weights["tags"][ENCODER])
    assert not torch.equal(weights["rte"][ENCODER], base[ENCODER])  # trained, not the starting weights
    assert weights["rte"]["classifier.weight"].shape[0] == 2 and weights["stsb"]["classifier.weight"].shape[0] == 1
    assert weights["tags"]["classifier.weight"].shape[0] == 5  # O and four tags
    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "rte")
    inputs = tokenizer(["the film was great"], ["it was good"], return_tensors="pt")
    rte = AutoModelForSequenceClassification.from_pretrained(checkpoint / "rte").eval()
    tagger = AutoModelForTokenClassification.from_pretrained(checkpoint / "tags").eval()
    assert rte(**inputs).logits.shape == (1, 2)
    assert tagger(**tokenizer(["the film was great"], return_tensors="pt")).logits.shape[-1] == 5
    card = (checkpoint / "stsb" / "README.md").read_text()
    assert "## Multi-task training" in card and "| tags | tokens | f1" in card and "| stsb | regression |" in card


def test_result_scores_every_task_and_their_mean(finished):
    result = json.loads((finished / "result.json").read_text())
    assert result["main_metric"] == "mean"
    tasks = result["tasks"]
    assert set(tasks) == set(TASKS) and tasks["stsb"]["kind"] == "regression"
    mains = [tasks[name]["best"][f"dev_{tasks[name]['main_metric']}"] for name in TASKS]
    assert result["best"]["dev_mean"] == pytest.approx(sum(mains) / 3)
    records = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record for record in records if "dev_mean" in record]
    assert evaluations and all(f"dev_{name}_{tasks[name]['main_metric']}" in evaluations[-1] for name in TASKS)


def test_predict_on_a_task_folder_gives_what_transformers_gives(finished, tmp_path):
    folder = finished / "checkpoint" / "rte"
    source = tmp_path / "pairs.tsv"
    pairs = [("the film was great", "it was good"), ("a dull plot", "the plot was bad"), ("fine acting", "bad")]
    source.write_text("sentence1\tsentence2\n" + "".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    target = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["predict", str(folder), "--input", str(source), "--output", str(target)])
    assert result.exit_code == 0, result.output
    predicted = [json.loads(line)["label"] for line in target.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(
            **tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
        ).logits
    assert predicted == [model.config.id2label[index] for index in logits.argmax(-1).tolist()]


def test_resume_continues_bit_for_bit(inputs, tmp_path):
    def recipe(name: str):
        data = multitask_recipe(inputs, tmp_path / name, checkpoint_every=2, eval_every=3)
        return load_recipe(write_yaml(tmp_path / f"{name}.yaml", data))

    run_multitask(recipe("full"))
    interrupted = recipe("resumed")
    with interrupted_at_step(4):
        run_multitask(interrupted)
    run_multitask(interrupted, resume=True)
    for name in TASKS:
        full = load_file(tmp_path / "full" / "checkpoint" / name / "model.safetensors")
        resumed = load_file(tmp_path / "resumed" / "checkpoint" / name / "model.safetensors")
        assert full.keys() == resumed.keys() and all(torch.equal(full[key], resumed[key]) for key in full), name
    full, resumed = (json.loads((tmp_path / name / "result.json").read_text()) for name in ("full", "resumed"))
    assert full["best"] == resumed["best"] and full["best_step"] == resumed["best_step"]


def test_one_task_continues_from_the_multitask_checkpoint_with_its_own_head(finished, inputs, tmp_path):
    """MT-DNN's second step: `model.checkpoint` the multi-task folder, the task's head carries over."""
    recipe = {
        "stage": "finetune", "run_dir": str(tmp_path / "rte"), "seed": 0,
        "model": {"checkpoint": str(finished / "checkpoint")},
        "task": {"name": "rte", "data_dir": str(inputs["glue"] / "RTE"), "max_length": 24},
        "training": {"max_steps": 1, "batch_size": 2, "lr": 1e-9, "device": "cpu"}, "keep_best": False,
    }  # fmt: skip
    result = run_cli("finetune", recipe, tmp_path)
    assert result.exit_code == 0, result.output
    saved = load_recipe(tmp_path / "rte" / "recipe.yaml")
    assert Path(saved.model.checkpoint) == finished / "checkpoint" / "rte"
    head = load_file(finished / "checkpoint" / "rte" / "model.safetensors")["classifier.weight"]
    continued = load_file(tmp_path / "rte" / "checkpoint" / "model.safetensors")["classifier.weight"]
    assert torch.allclose(head, continued, atol=1e-6)  # the multi-task head, not a fresh one (lr 1e-9, one step)
    recipe["task"]["name"] = "mrpc"
    recipe["task"]["data_dir"] = str(inputs["glue"] / "MRPC")
    message = one_error_line(run_cli("finetune", recipe, tmp_path))
    assert "model.checkpoint:" in message and "without a head for task 'mrpc' (it has rte, stsb, tags)" in message


def test_eval_scores_each_task_and_writes_the_glue_submission(finished, inputs, tmp_path):
    recipe = {"stage": "eval", "run_dir": str(tmp_path / "eval"), "multitask_checkpoint": str(finished / "checkpoint"),
              "glue_dir": str(inputs["glue"]), "submission": True, "device": "cpu"}  # fmt: skip
    message = one_error_line(run_cli("eval", recipe, tmp_path))
    assert "submission: no test predictions for cola, sst2, mrpc" in message and "allow_incomplete" in message
    assert not (tmp_path / "eval").exists()
    result = run_cli("eval", recipe, tmp_path, "--allow-incomplete")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert set(report["tasks"]) == {"rte", "stsb"}  # the GLUE tasks it has a head for; tags is not GLUE
    with zipfile.ZipFile(tmp_path / "eval" / "submission.zip") as archive:
        assert {"RTE.tsv", "STS-B.tsv"} <= set(archive.namelist())


def test_per_task_continuations_make_the_submission_too(finished, inputs, tmp_path):
    """The GLUE map may name the multi-task folder for each task: each is its task's head."""
    checkpoint = str(finished / "checkpoint")
    recipe = {"stage": "eval", "run_dir": str(tmp_path / "eval"), "tasks": {"rte": checkpoint, "stsb": checkpoint},
              "glue_dir": str(inputs["glue"]), "device": "cpu"}  # fmt: skip
    result = run_cli("eval", recipe, tmp_path)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["tasks"]["rte"]["runs"][0]["checkpoint"].endswith("rte")


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda r: r["tasks"][1].update(name="rte"), "tasks.1.name: 'rte' is task 0's name too"),
        (
            lambda r: r.update(sampling={"rule": "temperature", "temperature": 0}),
            "sampling.temperature: Input should be greater than 0",
        ),
        (
            lambda r: r.update(sampling={"rule": "equal", "temperature": 3}),
            "sampling: temperature is read only with rule temperature (rule is equal)",
        ),
        (lambda r: r.update(loss_weights={"cola": 2}), "loss_weights.cola: not a task of the recipe (rte, stsb, tags)"),
        (lambda r: r.update(metric_for_best="cola"), "metric_for_best: 'cola' is not a task of the recipe"),
        (lambda r: r["training"].update(lr="fast"), "training.lr: Input should be a valid number"),
        (lambda r: r.update(seeds=[1, 2]), "seeds: not in a multitask recipe"),
        (lambda r: r["tasks"][0].update(dev_split=0.2), "tasks.0.dev_split: not in a multitask recipe"),
        (lambda r: r.update(tasks=r["tasks"][:1]), "tasks: List should have at least 2 items"),
    ],
)
def test_a_bad_recipe_is_one_line_and_leaves_no_run_folder(inputs, tmp_path, change, fragment):
    recipe = multitask_recipe(inputs, tmp_path / "run")
    change(recipe)
    message = one_error_line(run_cli("multitask", recipe, tmp_path))
    assert fragment in message
    assert not (tmp_path / "run").exists()


def test_a_kind_the_backbone_cannot_head_is_refused_before_the_run_folder(inputs, tmp_path):
    from finetune.models.ngram import NGramForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(inputs["checkpoint"])
    stream = torch.arange(2000).numpy() % 50
    NGramForCausalLM.count(stream, vocab_size=len(tokenizer), order=2, eos_token_id=0).save_pretrained(
        tmp_path / "ngram"
    )
    tokenizer.save_pretrained(tmp_path / "ngram")
    recipe = multitask_recipe(inputs, tmp_path / "run")
    recipe["model"]["checkpoint"] = str(tmp_path / "ngram")
    message = one_error_line(run_cli("multitask", recipe, tmp_path))
    assert "is a 'ngram' model, which has no" in message
    assert not (tmp_path / "run").exists()


def test_a_saved_recipe_loads_again_as_it_ran(finished):
    saved = load_recipe(finished / "recipe.yaml")
    assert saved.task_names() == list(TASKS) and saved.loss_weight("tags") == 0.5 and saved.sampling.rule == "equal"
    copy = shutil.copy(finished / "recipe.yaml", finished.parent / "again.yaml")
    assert load_recipe(copy).model_dump(mode="json") == saved.model_dump(mode="json")


def test_the_python_api_runs_the_stage_and_returns_every_tasks_scores(inputs, tmp_path):
    import finetune

    result = finetune.multitask(multitask_recipe(inputs, tmp_path / "api"), {"training.max_steps": 4})
    assert result.checkpoint == tmp_path / "api" / "checkpoint"
    assert json.loads((result.checkpoint / "multitask.json").read_text())["tasks"]
    assert {"dev_mean", "dev_rte_accuracy", "dev_stsb_pearson", "dev_tags_f1"} <= set(result.metrics)
    saved = json.loads((tmp_path / "api" / "result.json").read_text())["best"]
    assert result.metrics == saved
    with pytest.raises(UserError, match=r"sampling\.temperature"):  # the CLI's one line, raised
        finetune.multitask(multitask_recipe(inputs, tmp_path / "bad"), {"sampling.rule": "temperature",
                                                                        "sampling.temperature": 0})  # fmt: skip
    assert not (tmp_path / "bad").exists()


def test_profile_sizes_each_tasks_step_on_the_shared_encoder(inputs, tmp_path):
    path = write_yaml(tmp_path / "recipe.yaml", multitask_recipe(inputs, tmp_path / "run"))
    result = runner.invoke(app, ["profile", str(path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["stage"] == "multitask"
    assert [stage["section"] for stage in report["stages"]] == ["tasks.0 (rte)", "tasks.1 (stsb)", "tasks.2 (tags)"]
    assert all(stage["compute"]["flops_per_step"] > 0 and stage["memory_mb"] for stage in report["stages"]), report
    assert not (tmp_path / "run").exists()  # sized, nothing run or written


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
@pytest.mark.slow  # ranks started by torchrun (make test-slow; CI runs it too)
def test_resume_on_two_processes_continues_bit_for_bit(inputs, tmp_path):
    """2 processes x batch 2, one task a step (never mixed across the processes), stopped after step 4 of 8."""
    from tests.stages.test_pretrain_families import comparable_metrics
    from tests.training.test_resume_finetune import TWO_PROCESS_LAUNCHER

    data = multitask_recipe(inputs, tmp_path / "run", checkpoint_every=2, keep_checkpoints=4, eval_every=3)
    path = write_yaml(tmp_path / "recipe.yaml", data)
    folders = (str(tmp_path / "run"), str(tmp_path / "reference"))
    # tests/training/test_resume_finetune.py's launcher: the whole run, then one killed after step 4, resumed
    result = two_processes(tmp_path, TWO_PROCESS_LAUNCHER, "multitask", str(path), *folders, "4")
    output = result.stdout + result.stderr
    assert output.count("NUM_PROCESSES 2") == 2 and result.returncode == 0, output[-3000:]
    assert "resuming from" in output and "(step 4," in " ".join(output.split())
    for name in TASKS:
        full = load_file(tmp_path / "reference" / "checkpoint" / name / "model.safetensors")
        resumed = load_file(tmp_path / "run" / "checkpoint" / name / "model.safetensors")
        assert full.keys() == resumed.keys() and all(torch.equal(full[key], resumed[key]) for key in full), name
    assert comparable_metrics(tmp_path / "reference") == comparable_metrics(tmp_path / "run")
    full, resumed = (json.loads((tmp_path / name / "result.json").read_text()) for name in ("reference", "run"))
    assert full["best"] == resumed["best"] and full["tasks"] == resumed["tasks"]
