"""`finetune finetune` hygiene: keep-best, early stopping, multi-seed summaries, warm starts, predictions."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from finetune.commands.evaluate import run_eval
from finetune.data.corpus import read_documents
from finetune.models.heads import load_classifier
from finetune.recipes import BackboneConfig, load_recipe, task_config
from finetune.run_dir import read_metrics
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.tasks.specs import task_spec
from finetune.training.checkpoints import save_checkpoint
from finetune.training.unfreezing import trainable_group_count
from tests.conftest import (
    FILLERS,
    assert_split_trains_like_whole,
    assert_unpadded_trains_like_padded,
    custom_task_section,
    eval_recipe,
    finetune_recipe,
    make_sentence,
    write_corpus,
    write_task,
    write_yaml,
)


def run(recipe_data: dict, tmp_path: Path, name: str = "recipe") -> Path:
    return run_finetune(load_recipe(write_yaml(tmp_path / f"{name}.yaml", recipe_data)))


def evaluations(run_dir: Path) -> list[dict]:
    return [record for record in read_metrics(run_dir / "metrics.jsonl") if record["phase"] == "eval"]


def test_keep_best_saves_the_best_evaluation(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data.update({"eval_every": 2, "unfreezing": {"mode": "none"}})
    data["training"].update({"epochs": 3, "lr": 5e-3})
    run(data, tmp_path)
    records = evaluations(tmp_path / "run")
    assert len(records) >= 6  # every 2 steps and at each of the 3 epoch ends (3 steps an epoch)
    best = max(records, key=lambda record: record["dev_accuracy"])  # the first of equal bests counts
    result = json.loads((tmp_path / "run" / RESULT_FILE).read_text())
    assert result["saved"] == "best" and result["best_step"] == best["step"]
    assert result["best"]["dev_accuracy"] == best["dev_accuracy"]
    assert [record["step"] for record in records if record["best_so_far"]][-1] == best["step"]
    # The saved checkpoint scores what the best evaluation scored.
    report = run_eval(
        load_recipe(
            write_yaml(
                tmp_path / "eval.yaml",
                eval_recipe(task_dir, tmp_path / "eval", {"best": str(tmp_path / "run" / "checkpoint")}),
            )
        )
    )
    assert report["results"]["best"]["accuracy"] == pytest.approx(best["dev_accuracy"])


def test_early_stopping_ends_the_run_when_patience_runs_out(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    # A learning rate too small to change any prediction: the dev score never improves after the first evaluation.
    data.update({"eval_every": 1, "early_stopping_patience": 2, "unfreezing": {"mode": "none"}})
    data["training"].update({"epochs": 5, "lr": 1e-12})
    run(data, tmp_path)
    records = evaluations(tmp_path / "run")
    assert [record["step"] for record in records] == [1, 2, 3]
    train_steps = [
        record["step"] for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "train"
    ]
    assert max(train_steps) == 3  # of the 15 planned


@pytest.mark.usefixtures("plots_drawn")
def test_multi_seed_runs_each_seed_and_summarises(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data["seeds"] = [3, 4, 5]
    data["training"]["epochs"] = 1
    assert run(data, tmp_path) == tmp_path / "run"
    summary = json.loads((tmp_path / "run" / "seeds.json").read_text())
    values = [
        json.loads((tmp_path / "run" / f"seed-{seed}" / RESULT_FILE).read_text())["best"]["dev_accuracy"]
        for seed in (3, 4, 5)
    ]
    accuracy = summary["metrics"]["dev_accuracy"]
    assert summary["seeds"] == [3, 4, 5] and accuracy["values"] == values
    assert accuracy["mean"] == pytest.approx(statistics.fmean(values))
    assert accuracy["median"] == statistics.median(values) and accuracy["std"] == pytest.approx(
        statistics.stdev(values)
    )
    for seed in (3, 4, 5):
        assert (tmp_path / "run" / f"seed-{seed}" / "checkpoint" / "model.safetensors").is_file()
        assert load_recipe(tmp_path / "run" / f"seed-{seed}" / "recipe.yaml", check_paths=False).seed == seed
    assert "| accuracy |" in (tmp_path / "run" / "seeds.md").read_text()
    # Each seed's folder has its own calibration record (calibration: none measures it), summarised across seeds.
    eces = [
        json.loads((tmp_path / "run" / f"seed-{seed}" / RESULT_FILE).read_text())["calibration"]["dev"]["ece_before"]
        for seed in (3, 4, 5)
    ]
    assert summary["calibration"]["method"] == "none" and summary["calibration"]["ece_before"]["values"] == eces
    assert summary["calibration"]["temperature"]["values"] == [1.0, 1.0, 1.0]
    assert "calibration (none; dev):" in (tmp_path / "run" / "seeds.md").read_text()
    assert (tmp_path / "run" / "seed-3" / "plots" / "reliability.png").is_file()


def test_repeated_seeds_are_refused(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data["seeds"] = [1, 1]
    with pytest.raises(Exception, match="repeats a seed"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))


def three_label_task(folder: Path) -> Path:
    """The generated task relabelled into three classes (a different head than the 2-class task)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = write_task(folder.parent / "source")
    for split in ("train", "dev"):
        lines = (source / f"{split}.tsv").read_text().splitlines()
        relabelled = [lines[0]] + [f"{line.rsplit(chr(9), 1)[0]}\t{index % 3}" for index, line in enumerate(lines[1:])]
        (folder / f"{split}.tsv").write_text("\n".join(relabelled) + "\n")
    return folder


def test_warm_start_keeps_the_backbone_and_replaces_a_head_with_other_labels(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "first")
    data["training"]["epochs"] = 1
    first = run(data, tmp_path, "first")
    stored = load_file(first / "model.safetensors")
    # Three labels instead of two: the head's shape changes; the fine-tuned encoder is kept.
    section = custom_task_section(three_label_task(tmp_path / "three"))
    section.update({"labels": ["0", "1", "2"], "metrics": ["accuracy"]})
    model = load_classifier(BackboneConfig(checkpoint=str(first)), task_spec(task_config(**section)), 0.1)
    weights = model.state_dict()
    assert model.classifier.out_features == 3
    assert torch.equal(
        weights["bert.encoder.layer.1.output.dense.weight"], stored["bert.encoder.layer.1.output.dense.weight"]
    )
    # Two labels with other names: same shape, but the old head would mean the wrong classes, so it is renewed.
    section = custom_task_section(task_dir)
    section["labels"] = ["1", "0"]
    model = load_classifier(BackboneConfig(checkpoint=str(first)), task_spec(task_config(**section)), 0.1)
    assert not torch.equal(model.classifier.weight, stored["classifier.weight"])
    assert torch.equal(model.bert.pooler.dense.weight, stored["bert.pooler.dense.weight"])
    # The same labels: the head carries on (continued fine-tuning).
    model = load_classifier(
        BackboneConfig(checkpoint=str(first)), task_spec(task_config(**custom_task_section(task_dir))), 0.1
    )
    assert torch.equal(model.classifier.weight, stored["classifier.weight"])


def test_warm_started_run_trains_the_new_head(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "first")
    data["training"]["epochs"] = 1
    first = run(data, tmp_path, "first")
    data = finetune_recipe(first, three_label_task(tmp_path / "three"), tmp_path / "second")
    data["task"].update({"labels": ["0", "1", "2"], "metrics": ["accuracy"]})
    data["training"]["epochs"] = 1
    second = run(data, tmp_path, "second")
    model = AutoModelForSequenceClassification.from_pretrained(second)
    assert model.config.id2label == {0: "0", 1: "1", 2: "2"}


def test_unfreezing_schedule_lists_groups_per_epoch():
    assert [trainable_group_count(epoch, 5, "gradual", schedule=[1, 3, 4]) for epoch in range(5)] == [1, 3, 4, 4, 4]
    assert [trainable_group_count(epoch, 3, "gradual", schedule=[2, 9]) for epoch in range(3)] == [2, 3, 3]
    assert trainable_group_count(0, 5, "none", schedule=[1]) == 5


def test_metrics_must_fit_the_task(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, three_label_task(tmp_path / "three"), tmp_path / "run")
    data["task"]["labels"] = ["0", "1", "2"]  # metrics: accuracy, f1
    with pytest.raises(Exception, match=r"task: metric f1 .* needs 2 labels, not 3; f1_macro"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))
    data["task"].update({"labels": None, "metrics": ["accuracy"]})
    with pytest.raises(Exception, match="metric accuracy is for classification"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))


@pytest.mark.parametrize("schedule", [[2, 1], [0, 1]])
def test_bad_unfreezing_schedules_are_refused(pretrained, task_dir, tmp_path, schedule):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data["unfreezing"] = {"mode": "gradual", "schedule": schedule}
    with pytest.raises(Exception, match=r"unfreezing.schedule"):
        load_recipe(write_yaml(tmp_path / "recipe.yaml", data))


def test_eval_writes_predictions_with_label_names_for_an_unlabeled_split(pretrained, task_dir, tmp_path):
    data = finetune_recipe(pretrained, task_dir, tmp_path / "run")
    data["training"]["epochs"] = 1
    checkpoint = run(data, tmp_path)
    recipe = eval_recipe(task_dir, tmp_path / "eval", {"tiny": str(checkpoint)})
    recipe.update({"split": "test", "write_predictions": True})
    report = run_eval(load_recipe(write_yaml(tmp_path / "eval.yaml", recipe)))
    assert set(report["results"]["tiny"]) == {"checkpoint"}  # nothing to score on a test split
    lines = (tmp_path / "eval" / "predictions" / "tiny.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 11
    assert [line.split("\t")[0] for line in lines[1:]] == [str(index) for index in range(10)]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    recipe["write_predictions"] = False
    recipe["run_dir"] = str(tmp_path / "eval2")
    with pytest.raises(Exception, match="no labels to score against"):
        run_eval(load_recipe(write_yaml(tmp_path / "eval2.yaml", recipe)))


def test_gradient_accumulation_equals_the_larger_batch(pretrained_without_dropout, task_dir, tmp_path):
    """16 examples a step as 1 x 16 or 2 x 8 micro-batches; 40 examples, so the last step holds 8 (one micro-batch)."""
    weights = {}
    for batch_size, accumulation in ((16, 1), (8, 2)):
        data = finetune_recipe(pretrained_without_dropout, task_dir, tmp_path / f"run-{accumulation}")
        data.update({"classifier_dropout": 0.0, "keep_best": False})
        data["training"].update(
            {"batch_size": batch_size, "gradient_accumulation_steps": accumulation, "epochs": 2, "max_grad_norm": None}
        )
        checkpoint = run(data, tmp_path, f"run-{accumulation}")
        weights[accumulation] = load_file(checkpoint / "model.safetensors")
        train = [r for r in read_metrics(tmp_path / f"run-{accumulation}" / "metrics.jsonl") if r["phase"] == "train"]
        assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    changed = [
        name
        for name in weights[1]
        if not torch.equal(
            weights[1][name],
            load_file(pretrained_without_dropout / "model.safetensors").get(name, weights[1][name] + 1),
        )
    ]
    assert changed, "training changed nothing: the comparison would prove nothing"
    for name, weight in weights[1].items():
        assert torch.allclose(weight, weights[2][name], atol=1e-6, rtol=1e-5), name


@pytest.mark.parametrize("compare", [assert_split_trains_like_whole, assert_unpadded_trains_like_padded])
def test_batches_split_or_unpadded_train_like_padded_whole_ones(
    pretrained_without_dropout, tmp_path, monkeypatch, compare
):
    """Pieces of a batch, a backward each, weighed by their examples, or the real tokens of whole batches only: the
    gradient and the weights of padded whole batches."""

    rng = random.Random(0)
    rows = ["sentence\tlabel"]
    for index in range(40):  # sentences of 7 to 15 tokens, so that batches have lengths to cut at
        words = make_sentence(rng, index % 2 == 0).split()
        rows.append(" ".join(words[:3] + rng.choices(FILLERS, k=rng.randint(0, 8)) + words[3:]) + f"\t{index % 2}")
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "task" / "dev.tsv").write_text("\n".join(rows[:9]) + "\n", encoding="utf-8")

    def recipe(run_dir: Path) -> dict:
        data = finetune_recipe(pretrained_without_dropout, tmp_path / "task", run_dir)
        data.update({"classifier_dropout": 0.0, "keep_best": False})
        data["training"].update({"batch_size": 16, "epochs": 2})
        return data

    compare(pretrained_without_dropout, tmp_path, monkeypatch, recipe)


def test_gpt2_checkpoint_without_a_pad_token_fine_tunes(tmp_path, task_dir):
    """Hub GPT-2 checkpoints have no pad token: batches pad with end-of-text and the head pools the last real token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from finetune.data.tokenizers import train_byte_level_bpe

    tokenizer = train_byte_level_bpe(read_documents([write_corpus(tmp_path / "corpus")]), 300, min_frequency=1)
    tokenizer.pad_token = None
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=32,
            n_embd=32,
            n_layer=2,
            n_head=2,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    )
    checkpoint = save_checkpoint(model, tokenizer, tmp_path / "gpt2")
    assert AutoModelForSequenceClassification.from_pretrained(checkpoint).config.pad_token_id is None
    data = finetune_recipe(checkpoint, task_dir, tmp_path / "run")
    data["training"]["epochs"] = 1
    saved = run(data, tmp_path)
    model = AutoModelForSequenceClassification.from_pretrained(saved)
    assert model.config.pad_token_id == tokenizer.eos_token_id
