"""The `finetune` command through typer's CliRunner: help, recipe listing, user errors, and a tiny end-to-end run."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

from finetune import __version__
from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.training.schedules import slanted_triangular
from finetune.training.techniques import describe_backbone, resolve_techniques
from tests.conftest import (
    REPO_ROOT,
    eval_recipe,
    finetune_recipe,
    pretrain_recipe,
    write_corpus,
    write_task,
    write_yaml,
)

runner = CliRunner()


def invoke(*arguments: str, **kwargs):
    return runner.invoke(app, [str(argument) for argument in arguments], **kwargs)


def assert_user_error(result, *fragments: str) -> str:
    """Exit code 2 and a single `error:` line naming every fragment, without a traceback."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    output = result.output.strip()
    assert output.startswith("error: "), output
    assert "\n" not in output, f"more than one line: {output!r}"
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in {output!r}"
    return output


# ---------------------------------------------------------------------------------------------
# Help, version, recipe listing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "purpose"),
    [
        ("pretrain", "Pretrain a language model"),
        ("finetune", "Fine-tune a pretrained checkpoint"),
        ("eval", "Score fine-tuned checkpoints"),
        ("validate-submission", "Check a GLUE leaderboard archive"),
        ("recipes", "List the recipes"),
    ],
)
def test_command_help(command, purpose):
    result = invoke(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert purpose in result.output
    assert "Usage" in result.output


def test_app_help_lists_the_commands():
    result = invoke("--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("pretrain", "finetune", "eval", "validate-submission", "recipes"):
        assert command in result.output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"finetune {__version__}"


def test_recipes_lists_the_shipped_recipes():
    recipes_dir = REPO_ROOT / "recipes"
    result = invoke("recipes", "--dir", recipes_dir, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    shipped = sorted(recipes_dir.glob("**/*.yaml"))
    assert shipped
    for path in shipped:
        assert str(path) in result.output
        assert load_recipe(path, check_paths=False).description[:20] in result.output
    for stage in ("pretrain", "finetune", "eval"):
        assert stage in result.output


def test_recipes_shows_a_broken_recipe_without_failing(tmp_path):
    (tmp_path / "good.yaml").write_text("stage: eval\ndescription: a fine one\n", encoding="utf-8")
    (tmp_path / "broken.yaml").write_text("stage: [\n", encoding="utf-8")
    result = invoke("recipes", "--dir", tmp_path, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "a fine one" in result.output and "invalid YAML" in result.output


def test_recipes_keys_finetune():
    result = invoke("recipes", "--keys", "finetune")
    assert result.exit_code == 0, result.output
    for key in ("discriminative.factor", "unfreezing.mode", "schedule.cut_frac", "training.lr"):
        assert key in result.output
    assert "corpus.block_size" not in result.output  # a pretrain key


def test_recipes_keys_piped_prints_every_value_whole():
    """Not a terminal (a pipe, a file): one tab-separated line per key, nothing cut."""
    result = invoke("recipes", "--keys", "finetune")
    assert result.exit_code == 0, result.output
    lines = {line.split("\t")[0]: line.split("\t") for line in result.output.splitlines()}
    assert lines["key"] == ["key", "type", "default", "meaning"]
    assert lines["pooling"][1] == "model|mean|scalar_mix or null"
    assert lines["pooling"][3].endswith("so unfreezing.schedule [1] gives ELMo's frozen backbone")


@pytest.mark.parametrize(
    "stage, recipe, override, suggestion",
    [
        ("finetune", "quickstart/finetune.yaml", "training.learning_rate=1e-3", "training.lr"),
        ("finetune", "quickstart/finetune.yaml", "training.epoch=3", "training.epochs"),
        ("finetune", "quickstart/finetune.yaml", "training.cut_frac=0.2", "schedule.cut_frac"),
        ("finetune", "quickstart/finetune.yaml", "task.max_seq_length=64", "task.max_length"),
        ("pretrain", "quickstart/pretrain.yaml", "model.hiden=64", "model.hidden"),
        ("ulmfit", "quickstart/ulmfit.yaml", "classifier.training.num_train_epochs=3", "classifier.training.epochs"),
        # The flow's top-level task fills two sections: its mistake is reported once, under task.
        ("ulmfit", "quickstart/ulmfit.yaml", "task.labelz=[0, 1]", "task.labels"),
    ],
)
def test_an_unknown_key_suggests_the_nearest_one(stage, recipe, override, suggestion):
    key = override.split("=")[0]
    output = assert_user_error(invoke(stage, REPO_ROOT / "recipes" / recipe, override), key)
    assert output.endswith(f"{key}: unknown key; did you mean {suggestion}?"), output


def test_an_unknown_key_far_from_every_key_gets_no_guess():
    output = assert_user_error(
        invoke("finetune", REPO_ROOT / "recipes" / "quickstart" / "finetune.yaml", "training.zebra=1"), "training.zebra"
    )
    assert output.endswith("training.zebra: unknown key"), output


def test_recipes_keys_unknown_stage():
    assert_user_error(invoke("recipes", "--keys", "distill"), "--keys", "distill")


def test_recipes_missing_dir(tmp_path):
    assert_user_error(invoke("recipes", "--dir", tmp_path / "nowhere"), "--dir", "nowhere")


# ---------------------------------------------------------------------------------------------
# User mistakes: one line, exit code 2, nothing written
# ---------------------------------------------------------------------------------------------


def test_unknown_key_exits_2_and_creates_nothing(pretrain_recipe_data, write_recipe):
    pretrain_recipe_data["training"]["lrr"] = 0.1
    path = write_recipe(pretrain_recipe_data)
    assert_user_error(invoke("pretrain", path), "training.lrr", "unknown key", str(path))
    assert not Path(pretrain_recipe_data["run_dir"]).exists()


def test_bad_override_exits_2(pretrain_recipe_data, write_recipe):
    path = write_recipe(pretrain_recipe_data)
    assert_user_error(invoke("pretrain", path, "training.batch_size=abc"), "training.batch_size")
    assert_user_error(invoke("pretrain", path, "training.lr"), "override")
    assert not Path(pretrain_recipe_data["run_dir"]).exists()


def test_stage_mismatch_exits_2(pretrain_recipe_data, write_recipe):
    path = write_recipe(pretrain_recipe_data)
    assert_user_error(invoke("finetune", path), "stage", "finetune pretrain")


def test_missing_recipe_file_exits_2(tmp_path):
    assert_user_error(invoke("eval", tmp_path / "absent.yaml"), "absent.yaml")


def test_missing_corpus_file_exits_2(pretrain_recipe_data, write_recipe, tmp_path):
    pretrain_recipe_data["corpus"]["train_files"] = [str(tmp_path / "nope.txt")]
    assert_user_error(invoke("pretrain", write_recipe(pretrain_recipe_data)), "corpus.train_files", "nope.txt")
    assert not Path(pretrain_recipe_data["run_dir"]).exists()


def test_bad_corpus_exits_2_before_creating_the_run(pretrain_recipe_data, write_recipe, corpus_file):
    """A corpus problem found while reading it is a user error; fixing it and re-running must just work.

    The finetune stage reads all user input before creating its run directory; pretrain should too,
    or the second attempt fails with "run_dir ... already holds a run".
    """
    good = corpus_file.read_bytes()
    corpus_file.write_bytes(good + b"broken \xff line\n")
    path = write_recipe(pretrain_recipe_data)
    assert_user_error(invoke("pretrain", path), str(corpus_file), "line 201", "UTF-8")
    assert not Path(pretrain_recipe_data["run_dir"]).exists(), "a failed pretrain left its run_dir behind"


def test_missing_checkpoint_exits_2_before_creating_the_run(finetune_recipe_data, write_recipe):
    assert_user_error(invoke("finetune", write_recipe(finetune_recipe_data)), "model.checkpoint")
    assert not Path(finetune_recipe_data["run_dir"]).exists()


def test_eval_with_missing_model_exits_2(eval_recipe_data, write_recipe):
    assert_user_error(invoke("eval", write_recipe(eval_recipe_data)), "models.model")
    assert not Path(eval_recipe_data["run_dir"]).exists()


# ---------------------------------------------------------------------------------------------
# End to end: pretrain -> finetune (pretrained and random init) -> eval, on tiny data
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Run the three stages once for the whole module; return the paths and recipe dicts."""
    root = tmp_path_factory.mktemp("pipeline")
    corpus, task = write_corpus(root / "corpus"), write_task(root / "task")
    runs = root / "runs"
    recipes = {
        "pretrain": pretrain_recipe(corpus, runs / "pretrain"),
        "finetune": finetune_recipe(runs / "pretrain" / "checkpoint", task, runs / "finetune"),
    }
    recipes["finetune"]["keep_best"] = False  # the checkpoint after both epochs, for the unfreezing checks
    paths = {stage: write_yaml(root / f"{stage}.yaml", data) for stage, data in recipes.items()}
    results = {}
    results["pretrain"] = invoke("pretrain", paths["pretrain"])
    assert results["pretrain"].exit_code == 0, results["pretrain"].output
    results["finetune"] = invoke("finetune", paths["finetune"])
    assert results["finetune"].exit_code == 0, results["finetune"].output
    results["finetune_random"] = invoke(
        "finetune", paths["finetune"], "model.init=random", f"run_dir={runs / 'finetune-random'}"
    )
    assert results["finetune_random"].exit_code == 0, results["finetune_random"].output
    models = {
        "pretrained": str(runs / "finetune" / "checkpoint"),
        "random": str(runs / "finetune-random" / "checkpoint"),
    }
    recipes["eval"] = eval_recipe(task, runs / "eval", models)
    paths["eval"] = write_yaml(root / "eval.yaml", recipes["eval"])
    results["eval"] = invoke("eval", paths["eval"])
    assert results["eval"].exit_code == 0, results["eval"].output
    return {"root": root, "runs": runs, "task": task, "recipes": recipes, "paths": paths, "results": results}


def test_every_stage_exits_0(pipeline):
    for name, result in pipeline["results"].items():
        assert result.exit_code == 0 and result.exception is None, (name, result.output)


def test_run_dirs_hold_the_resolved_recipe(pipeline):
    runs = pipeline["runs"]
    for stage, folder in (("pretrain", "pretrain"), ("finetune", "finetune"), ("eval", "eval")):
        saved = load_recipe(runs / folder / "recipe.yaml", check_paths=False)
        original = load_recipe(pipeline["paths"][stage], check_paths=False)
        if stage == "finetune":  # saved with the techniques it left open as its backbone decided them
            original = resolve_techniques(original, describe_backbone(original.model.checkpoint)).recipe
        assert saved.model_dump() == original.model_dump()
    random_run = load_recipe(runs / "finetune-random" / "recipe.yaml", check_paths=False)
    assert random_run.model.init == "random" and random_run.run_dir == runs / "finetune-random"


def test_pretrain_metrics(pipeline):
    records = read_metrics(pipeline["runs"] / "pretrain" / "metrics.jsonl")
    train = [record for record in records if record["phase"] == "train"]
    assert [record["step"] for record in train] == [2, 4, 6, 8, 10]  # log_every 2, max_steps 10
    for record in train:
        assert record["epoch"] == 0
        assert math.isfinite(record["loss"]) and record["loss"] > 0
        assert record["tokens_per_s"] > 0
        assert len(record["lr"]) == 4 and len(set(record["lr"].values())) == 1  # one LR for every group
    evaluations = [record for record in records if record["phase"] == "eval"]
    assert len(evaluations) == 1 and evaluations[0]["step"] == 10
    assert {"validation_loss", "validation_perplexity", "masked_accuracy"} <= set(evaluations[0])
    assert evaluations[0]["validation_perplexity"] == pytest.approx(math.exp(evaluations[0]["validation_loss"]))
    assert 0 <= evaluations[0]["masked_accuracy"] <= 1


def test_pretrain_checkpoint(pipeline):
    checkpoint = pipeline["runs"] / "pretrain" / "checkpoint"
    model = AutoModelForMaskedLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert model.config.num_attention_heads == 2
    assert model.config.vocab_size == len(tokenizer) <= 200
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "finetune_recipe.yaml").is_file()
    assert not (checkpoint.parent / "checkpoint.partial").exists()


def test_finetune_metrics(pipeline):
    records = read_metrics(pipeline["runs"] / "finetune" / "metrics.jsonl")
    factor = pipeline["recipes"]["finetune"]["discriminative"]["factor"]
    peak = pipeline["recipes"]["finetune"]["training"]["lr"]
    train = [record for record in records if record["phase"] == "train"]
    total_steps = 10  # 40 examples / batch 8 = 5 steps per epoch, 2 epochs
    assert [record["step"] for record in train] == list(range(1, total_steps + 1))
    assert [record["epoch"] for record in train] == [0] * 5 + [1] * 5
    for record in train:
        assert {"step", "epoch", "loss", "lr", "examples_per_s"} <= set(record)
        assert math.isfinite(record["loss"]) and record["examples_per_s"] > 0
        lrs = [record["lr"][f"group_{index}"] for index in range(4)]
        assert len(record["lr"]) == 4
        for lower, upper in itertools.pairwise(lrs):
            assert upper / lower == pytest.approx(factor)
        # The step-k record shows the LR of the k-th optimizer step: STLR at step k-1.
        assert lrs[-1] == pytest.approx(peak * slanted_triangular(record["step"] - 1, total_steps, 0.1, 32))
    unfreeze = [record for record in records if record["phase"] == "unfreeze"]
    assert [(record["epoch"], record["trainable_groups"]) for record in unfreeze] == [(0, 1), (1, 2)]
    assert all(record["total_groups"] == 4 for record in unfreeze)
    evaluations = [record for record in records if record["phase"] == "eval"]
    assert [record["epoch"] for record in evaluations] == [0, 1]
    for record in evaluations:
        assert 0 <= record["dev_accuracy"] <= 1 and 0 <= record["dev_f1"] <= 1
    # Records come in order: unfreeze, train steps, eval, per epoch.
    assert [record["phase"] for record in records] == (["unfreeze"] + ["train"] * 5 + ["eval"]) * 2


def test_finetune_checkpoint_has_the_label_mapping(pipeline):
    for run in ("finetune", "finetune-random"):
        checkpoint = pipeline["runs"] / run / "checkpoint"
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
        assert model.config.id2label == {0: "0", 1: "1"}
        assert model.config.label2id == {"0": 0, "1": 1}
        assert model.num_labels == 2
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        with torch.no_grad():
            logits = model(**tokenizer(["the film was great ."], return_tensors="pt")).logits
        assert logits.shape == (1, 2)
        assert all(parameter.requires_grad for parameter in model.parameters())


def _state(path: Path, loader) -> dict[str, torch.Tensor]:
    return {
        name: tensor
        for name, tensor in loader.from_pretrained(path).state_dict().items()
        if name.startswith(("bert.embeddings.", "bert.encoder."))
    }


def test_gradual_unfreezing_left_the_lower_groups_untouched(pipeline):
    runs = pipeline["runs"]
    pretrained = _state(runs / "pretrain" / "checkpoint", AutoModelForMaskedLM)
    finetuned = _state(runs / "finetune" / "checkpoint", AutoModelForSequenceClassification)
    assert set(pretrained) == set(finetuned)
    # Two epochs of gradual unfreezing train the head, then block 1: embeddings and block 0 never change.
    frozen = [name for name in pretrained if name.startswith(("bert.embeddings.", "bert.encoder.layer.0."))]
    assert frozen and all(torch.equal(pretrained[name], finetuned[name]) for name in frozen)
    thawed = [name for name in pretrained if name.startswith("bert.encoder.layer.1.")]
    assert any(not torch.equal(pretrained[name], finetuned[name]) for name in thawed)


def test_random_init_does_not_use_the_pretrained_weights(pipeline):
    runs = pipeline["runs"]
    pretrained = _state(runs / "pretrain" / "checkpoint", AutoModelForMaskedLM)
    random_init = _state(runs / "finetune-random" / "checkpoint", AutoModelForSequenceClassification)
    name = "bert.embeddings.word_embeddings.weight"
    assert pretrained[name].shape == random_init[name].shape
    assert not torch.equal(pretrained[name], random_init[name])


def test_eval_report(pipeline):
    run_dir = pipeline["runs"] / "eval"
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    assert report["task"] == "tiny-sentiment" and report["split"] == "dev" and report["examples"] == 24
    assert report["metrics"] == ["accuracy", "f1"]
    assert set(report["results"]) == {"pretrained", "random"}
    for name, result in report["results"].items():
        assert 0 <= result["accuracy"] <= 1 and 0 <= result["f1"] <= 1
        assert result["checkpoint"] == pipeline["recipes"]["eval"]["models"][name]
    markdown = (run_dir / "report.md").read_text(encoding="utf-8")
    scores = markdown.split("\n## ")[0]  # the scores' table; the per-class sections follow
    rows = [line for line in scores.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == "| model | accuracy | f1 |"
    assert sorted(row.split(" | ")[0].removeprefix("| ") for row in rows[1:]) == ["pretrained", "random"]
    for row in rows[1:]:
        name = row.split(" | ")[0].removeprefix("| ")
        expected = f"{100 * report['results'][name]['accuracy']:.1f}"
        assert row.split(" | ")[1] == expected


def test_eval_agrees_with_the_last_finetune_evaluation(pipeline):
    """The eval stage and the fine-tune stage's own dev evaluation score the same model identically."""
    report = json.loads((pipeline["runs"] / "eval" / "report.json").read_text(encoding="utf-8"))
    for run, name in (("finetune", "pretrained"), ("finetune-random", "random")):
        records = read_metrics(pipeline["runs"] / run / "metrics.jsonl")
        last = [record for record in records if record["phase"] == "eval"][-1]
        assert report["results"][name]["accuracy"] == pytest.approx(last["dev_accuracy"])
        assert report["results"][name]["f1"] == pytest.approx(last["dev_f1"])


def test_pretrain_again_without_overwrite_exits_2(pipeline):
    run_dir = pipeline["runs"] / "pretrain"
    before = sorted(path.name for path in run_dir.iterdir())
    metrics_before = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    assert_user_error(invoke("pretrain", pipeline["paths"]["pretrain"]), "run_dir", str(run_dir), "overwrite")
    assert sorted(path.name for path in run_dir.iterdir()) == before
    assert (run_dir / "metrics.jsonl").read_text(encoding="utf-8") == metrics_before


def test_eval_label_mismatch_exits_2(pipeline, tmp_path):
    """A checkpoint whose labels differ from the task's is refused with a one-line error."""
    data = eval_recipe(
        pipeline["task"], tmp_path / "eval", {"pretrained": pipeline["recipes"]["eval"]["models"]["pretrained"]}
    )
    data["task"]["labels"] = ["1", "0"]  # the same labels in the other order: predictions would be flipped
    assert_user_error(invoke("eval", write_yaml(tmp_path / "eval.yaml", data)), "models.pretrained", "labels")
    assert not (tmp_path / "eval").exists()


def test_finetune_examples_longer_than_the_pretraining_blocks(pipeline, tmp_path):
    """task.max_length above the checkpoint's position limit must not crash with a traceback.

    The pretrain stage sizes the position embeddings to corpus.block_size (16 here); fine-tuning
    with the default-looking max_length 64 on longer examples should either truncate to what the
    model supports or refuse the recipe with a one-line error.
    """
    task = tmp_path / "long-task"
    task.mkdir()
    sentence = " ".join(["the film was really great and the music was lovely"] * 3) + " ."
    for split in ("train", "dev"):
        rows = "".join(f"{sentence}\t{index % 2}\n" for index in range(8))
        (task / f"{split}.tsv").write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    data = finetune_recipe(pipeline["runs"] / "pretrain" / "checkpoint", task, tmp_path / "run")
    data["task"]["max_length"] = 64
    data["training"]["epochs"] = 1
    result = invoke("finetune", write_yaml(tmp_path / "long.yaml", data))
    assert result.exit_code in (0, 2), f"crashed: {result.exception!r}"
    if result.exit_code == 2:
        assert_user_error(result, "max_length")


def test_pretrain_reuses_a_saved_tokenizer(pipeline, tmp_path):
    """tokenizer.path skips training: the new checkpoint has exactly the earlier run's vocabulary.

    Training a WordPiece tokenizer twice on the same text can give different ids
    (huggingface/tokenizers#1794); reusing the saved one is how a run is reproduced.
    """
    earlier = pipeline["runs"] / "pretrain" / "checkpoint"
    result = invoke(
        "pretrain", pipeline["paths"]["pretrain"], f"tokenizer.path={earlier}", f"run_dir={tmp_path / 'again'}"
    )
    assert result.exit_code == 0, result.output
    assert "training a WordPiece tokenizer" not in result.output
    reused = AutoTokenizer.from_pretrained(tmp_path / "again" / "checkpoint")
    assert reused.get_vocab() == AutoTokenizer.from_pretrained(earlier).get_vocab()
