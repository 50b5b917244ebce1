"""LoRA adapters (model.adapter, through peft): what trains, the checkpoint, merging, resume, predict, eval, profile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification
from typer.testing import CliRunner

from finetune.cli import app
from finetune.kinds.registry import kind_named
from finetune.models.loading import load_model
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from finetune.training.techniques import describe_backbone, resolve_techniques
from tests.conftest import finetune_recipe, one_error_line, pretrain_recipe, write_corpus, write_task, write_yaml
from tests.stages.test_pretrain_families import comparable_metrics
from tests.tiny_families import save_tiny_checkpoint
from tests.training.test_resume_finetune import Stopped, resumable_recipe, stop_after_checkpoint

runner = CliRunner()
RANK, ALPHA = 4, 8.0
ADAPTER = {"rank": RANK, "alpha": ALPHA, "dropout": 0.0}
SENTENCES = ["the film was really great .", "the plot was so dull .", "the cast was quite awful ."]


def adapter_recipe(base: Path, task: Path, run_dir: Path, **adapter) -> dict:
    """The tests' tiny fine-tuning recipe with a LoRA adapter: 3 steps, every group trainable, the last weights kept."""
    data = finetune_recipe(base, task, run_dir)
    data["model"]["adapter"] = {**ADAPTER, **adapter}
    data["training"].update(max_steps=3, lr=5e-3)
    data.update(keep_best=False, unfreezing={"mode": "none"})
    return data


@pytest.fixture(scope="module")
def adapted(tmp_path_factory) -> dict[str, Path]:
    """One fine-tuning run with an adapter on a tiny bert, shared by the tests that read its checkpoint."""
    root = tmp_path_factory.mktemp("adapted")
    base, task = save_tiny_checkpoint(root / "bert", "bert"), write_task(root / "task")
    recipe = write_yaml(root / "recipe.yaml", adapter_recipe(base, task, root / "run"))
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "adapter: LoRA rank 4, alpha 8, dropout 0 on query, value (peft's choice for bert)" in result.output
    merged = root / "merged"
    result = runner.invoke(app, ["merge", str(root / "run" / "checkpoint"), str(merged)])
    assert result.exit_code == 0, result.output
    return {"root": root, "base": base, "task": task, "checkpoint": root / "run" / "checkpoint", "merged": merged}


def test_the_checkpoint_is_a_peft_adapter_with_the_head(adapted):
    checkpoint = adapted["checkpoint"]
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json", "tokenizer.json"} <= {
        path.name for path in checkpoint.iterdir()
    }
    assert not (checkpoint / "model.safetensors").exists()  # no copy of the backbone
    stored = json.loads((checkpoint / "adapter_config.json").read_text())
    assert stored["base_model_name_or_path"] == str(adapted["base"].resolve())
    assert (stored["r"], stored["lora_alpha"]) == (RANK, ALPHA)
    weights = load_file(checkpoint / "adapter_model.safetensors")
    assert all(("lora_" in name) or ("classifier" in name) or ("pooler" in name) for name in weights)
    assert any(name.endswith("classifier.weight") for name in weights)


def test_merged_weights_are_the_base_plus_the_scaled_product(adapted):
    """Each adapted weight of the merged model is W + (alpha / rank) B A of the saved matrices; the rest is the base's,
    but the head, which is the adapter file's."""
    adapter = load_file(adapted["checkpoint"] / "adapter_model.safetensors")
    base = load_file(adapted["base"] / "model.safetensors")
    merged = load_file(adapted["merged"] / "model.safetensors")
    adapted_layers = [
        name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        for name in adapter
        if name.endswith(".lora_A.weight")
    ]
    assert len(adapted_layers) == 4  # query and value of 2 blocks
    for layer in adapted_layers:
        a, b = adapter[f"base_model.model.{layer}.lora_A.weight"], adapter[f"base_model.model.{layer}.lora_B.weight"]
        assert b.abs().sum() > 0  # trained: B starts at zero
        expected = base[f"{layer}.weight"] + (ALPHA / RANK) * (b @ a)
        assert torch.allclose(merged[f"{layer}.weight"], expected, atol=1e-6), layer
    for name, weight in merged.items():
        head = name.startswith(("classifier.", "bert.pooler."))
        if head:
            assert torch.equal(weight, adapter[f"base_model.model.{name}"]), name
        elif name.removesuffix(".weight") not in adapted_layers:
            assert torch.equal(weight, base[name]), name


def test_peft_the_merged_folder_and_the_toolkit_give_the_same_logits(adapted):
    from transformers import AutoTokenizer

    checkpoint = adapted["checkpoint"]
    batch = AutoTokenizer.from_pretrained(checkpoint)(SENTENCES, return_tensors="pt", padding=True)
    config = AutoConfig.from_pretrained(checkpoint)  # the task's labels travel in config.json
    with_peft = PeftModel.from_pretrained(
        AutoModelForSequenceClassification.from_pretrained(adapted["base"], config=config), checkpoint
    )
    merged = AutoModelForSequenceClassification.from_pretrained(adapted["merged"])  # no peft involved
    toolkit = load_model(AutoModelForSequenceClassification, str(checkpoint))
    base = AutoModelForSequenceClassification.from_pretrained(adapted["base"], config=config)
    with torch.no_grad():
        logits = [model.eval()(**batch).logits for model in (with_peft, merged, toolkit, base)]
    assert torch.allclose(logits[0], logits[1], atol=1e-5) and torch.allclose(logits[0], logits[2], atol=1e-5)
    assert not torch.allclose(logits[0], logits[3], atol=1e-4)  # the adapter and head did change the model
    assert merged.config.id2label == {0: "0", 1: "1"}


def test_predict_and_eval_read_an_adapter_checkpoint_as_its_merged_model(adapted, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(SENTENCES) + "\n")
    outputs = {}
    for name in ("checkpoint", "merged"):
        result = runner.invoke(app, ["predict", str(adapted[name]), "--input", str(texts)])
        assert result.exit_code == 0, result.output
        outputs[name] = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert len(outputs["checkpoint"]) == len(SENTENCES)
    for ours, merged in zip(outputs["checkpoint"], outputs["merged"]):
        assert ours["label"] == merged["label"]
        assert ours["probabilities"]["1"] == pytest.approx(merged["probabilities"]["1"], abs=1e-6)
    recipe = adapted["root"] / "run" / "checkpoint" / "finetune_recipe.yaml"
    task = load_recipe(recipe, expected_stage="finetune", check_paths=False).task.model_dump(exclude_none=True)
    task["data_dir"] = str(adapted["task"])
    models = {"adapter": str(adapted["checkpoint"]), "merged": str(adapted["merged"])}
    data = {"stage": "eval", "run_dir": str(tmp_path / "eval"), "task": task, "split": "dev", "models": models}
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", data))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    scores = {name: {key: value for key, value in entry.items() if key not in ("checkpoint", "classes")} for name,
              entry in report["results"].items()}  # fmt: skip
    assert report["examples"] == 24 and scores["adapter"] == pytest.approx(scores["merged"])
    # the per-class report: the same predictions, so the same confusion matrix
    assert (
        report["results"]["adapter"]["classes"]["confusion_matrix"]
        == report["results"]["merged"]["classes"]["confusion_matrix"]
    )


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2"])
def test_only_lora_and_the_head_train_with_discriminative_lrs(family, tmp_path):
    """The optimizer holds exactly the LoRA matrices and the head's copy, one layer group per block and the head,
    each at lr / factor ** (its depth): the embeddings, without LoRA, are no group."""
    base, task = save_tiny_checkpoint(tmp_path / family, family), write_task(tmp_path / "task")
    data = adapter_recipe(base, task, tmp_path / "run")
    data["discriminative"]["factor"] = 2.0
    recipe = load_recipe(write_yaml(tmp_path / "recipe.yaml", data))
    recipe = resolve_techniques(recipe, describe_backbone(recipe.model.checkpoint)).recipe
    stage = kind_named("classification").fine_tuning(recipe)
    setup = stage.setup(stage.create_accelerator(), None)
    names = {id(parameter): name for name, parameter in setup.model.named_parameters()}
    trainable = {name for name, parameter in setup.model.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_" in name or "modules_to_save" in name for name in trainable)
    assert any("lora_" in name for name in trainable) and any("modules_to_save" in name for name in trainable)
    optimized = [names[id(p)] for group in setup.optimizer.param_groups for p in group["params"]]
    assert sorted(optimized) == sorted(trainable)  # each once
    assert len(stage.groups) == 2 + 1  # the 2 blocks and the head
    for group in setup.optimizer.param_groups:
        depth = len(stage.groups) - 1 - group["layer_group"]
        assert group["peak_lr"] == pytest.approx(5e-3 / 2.0**depth)


def test_resume_with_an_adapter_is_bit_exact(tmp_path, monkeypatch):
    """Stopped after the step-8 checkpoint (gradual unfreezing over the adapter's groups) and resumed: the same
    adapter file, metrics and result as the run that never stopped."""
    base, task = save_tiny_checkpoint(tmp_path / "bert", "bert"), write_task(tmp_path / "task")
    recipes = {}
    for name in ("full", "resumed"):
        data = resumable_recipe(base, task, tmp_path / name)
        data["model"]["adapter"] = ADAPTER
        recipes[name] = write_yaml(tmp_path / f"{name}.yaml", data)
    run_finetune(load_recipe(recipes["full"]))
    stop_after_checkpoint(monkeypatch, 8)
    with pytest.raises(Stopped):
        run_finetune(load_recipe(recipes["resumed"]))
    monkeypatch.undo()
    result = runner.invoke(app, ["finetune", str(recipes["resumed"]), "--resume"])
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output
    full, resumed = (load_file(tmp_path / name / "checkpoint" / "adapter_model.safetensors") for name in recipes)
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[name], resumed[name]) for name in full)
    assert comparable_metrics(tmp_path / "full") == comparable_metrics(tmp_path / "resumed")
    records = comparable_metrics(tmp_path / "full")
    thawed = [
        (record["trainable_groups"], record["total_groups"]) for record in records if record.get("phase") == "unfreeze"
    ]
    assert thawed == [(1, 3), (2, 3), (3, 3)]  # the adapter's groups: 2 blocks' LoRA and the head, one more per epoch


@pytest.mark.parametrize(("family", "auto_class"), [("bert", AutoModelForMaskedLM), ("gpt2", AutoModelForCausalLM)])
def test_continued_pretraining_with_an_adapter(family, auto_class, tmp_path):
    """2 steps of ULMFiT's stage 2 with LoRA: the adapter learns (so the fast training routes, which read weights
    directly, were not taken), the backbone stays as it was, and the checkpoint loads as a language model."""
    base = save_tiny_checkpoint(tmp_path / family, family)
    data = pretrain_recipe(write_corpus(tmp_path / "corpus"), tmp_path / "run")
    data["model"] = {"family": family, "checkpoint": str(base), "adapter": ADAPTER}
    data["training"].update(max_steps=2, lr=5e-3)
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "pretrain.yaml", data))])
    assert result.exit_code == 0, result.output
    assert f"(peft's choice for {family})" in result.output
    checkpoint = tmp_path / "run" / "checkpoint"
    adapter = load_file(checkpoint / "adapter_model.safetensors")
    assert all(adapter[name].abs().sum() > 0 for name in adapter if "lora_B" in name)
    merged, before = load_model(auto_class, str(checkpoint)), auto_class.from_pretrained(base)
    adapted_layers = {name.removeprefix("base_model.model.").split(".lora_")[0] for name in adapter if "lora_" in name}
    for name, weight in before.state_dict().items():
        trained = f"base_model.model.{name}" in adapter or name.rpartition(".")[0] in adapted_layers  # head, LoRA
        assert trained or torch.equal(weight, merged.state_dict()[name]), name
    assert any(name.startswith("base_model.model.cls.") for name in adapter) == (family == "bert")  # MLM head
    if family == "gpt2":
        result = runner.invoke(
            app, ["generate", str(checkpoint), "-p", "the film", "--greedy", "--max-new-tokens", "3"]
        )
        assert result.exit_code == 0, result.output


def test_profile_shows_the_adapter_and_its_optimizer_memory(adapted, tmp_path):
    recipe = adapted["root"] / "recipe.yaml"
    result = runner.invoke(app, ["profile", str(recipe), "--json", "--matmul-gflops", "100"])
    assert result.exit_code == 0, result.output
    adapted_profile = json.loads(result.output)
    result = runner.invoke(app, ["profile", str(recipe), "model.adapter=null", "--json", "--matmul-gflops", "100"])
    plain = json.loads(result.output)
    parameters = adapted_profile["parameters"]
    assert parameters["adapter"].startswith("adapter: LoRA rank 4")
    assert parameters["trainable"] < plain["parameters"]["trainable"] == plain["parameters"]["total"]
    memory = adapted_profile["memory_mb"]
    assert memory["adamw"] == pytest.approx(2 * parameters["trainable"] * 4 / 1e6)
    assert memory["adamw"] < plain["memory_mb"]["adamw"]
    assert adapted_profile["compute"]["flops_per_token"] < plain["compute"]["flops_per_token"]
    table = runner.invoke(app, ["profile", str(recipe), "--matmul-gflops", "100"])
    assert "│ adapter " in table.output and "LoRA rank 4" in table.output


def test_recipe_mistakes_are_one_line(adapted, tmp_path):
    recipe = str(
        write_yaml(tmp_path / "recipe.yaml", adapter_recipe(adapted["base"], adapted["task"], tmp_path / "run"))
    )
    line = one_error_line(runner.invoke(app, ["finetune", recipe, "model.adapter.r=4"]))
    assert "model.adapter.r: unknown key; did you mean model.adapter.rank?" in line
    line = one_error_line(runner.invoke(app, ["finetune", recipe, "model.adapter.rank=eight"]))
    assert "model.adapter.rank" in line
    line = one_error_line(runner.invoke(app, ["finetune", recipe, "model.init=random"]))
    assert "adapter trains beside pretrained weights" in line
    line = one_error_line(runner.invoke(app, ["finetune", recipe, "model.adapter.target_modules=[nowhere]"]))
    assert line.startswith("error: model.adapter: LoRA cannot adapt nowhere of this 'bert' model")
    assert "query" in line  # the layers it could have named
    data = pretrain_recipe(write_corpus(tmp_path / "corpus"), tmp_path / "run")
    data["model"]["adapter"] = "lora"
    line = one_error_line(runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "pretrain.yaml", data))]))
    assert "give model.checkpoint or remove model.adapter" in line
    keys = runner.invoke(app, ["recipes", "--keys", "finetune"]).output
    assert "model.adapter.rank" in keys and "model.adapter.target_modules" in keys


def test_commands_refuse_what_holds_no_adapter_or_lost_its_base(adapted, tmp_path):
    line = one_error_line(runner.invoke(app, ["merge", str(adapted["merged"]), str(tmp_path / "out")]))
    assert "holds no LoRA adapter" in line
    line = one_error_line(runner.invoke(app, ["merge", str(adapted["checkpoint"]), str(adapted["merged"])]))
    assert line.startswith("error: OUTPUT:")
    moved = tmp_path / "moved"
    shutil.copytree(adapted["checkpoint"], moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    line = one_error_line(runner.invoke(app, ["predict", str(moved), "--input", "-"], input="the film\n"))
    assert f"is a LoRA adapter on {tmp_path / 'gone'}, which cannot be read" in line


def other_kind_task(kind: str, folder: Path) -> dict:
    """A tiny task of `kind` (the other test modules' data) as a recipe's task section."""
    from tests.kinds.test_multiple_choice import write_questions
    from tests.kinds.test_question_answering import write_squad
    from tests.kinds.test_tagging import write_conll

    writers = {"tokens": (write_conll, "txt", 40), "choices": (write_questions, "jsonl", 24)}
    writer, extension, count = writers.get(kind, (write_squad, "json", 24))
    for seed, split in enumerate(("train", "dev"), start=1):
        writer(folder / f"{split}.{extension}", count, seed)
    return {"name": f"tiny-{kind}", "kind": kind, "data_dir": str(folder), "max_length": 32}


@pytest.mark.parametrize(
    ("kind", "head"),
    [("tokens", "trained fully: classifier;"), ("choices", "bert.pooler, classifier"), ("spans", "qa_outputs")],
)
def test_every_task_kind_trains_an_adapter_and_loads_it(kind, head, tmp_path):
    """2 steps of each other task kind with LoRA: the family's own head trains fully, and the adapter checkpoint loads
    (merged) with the kind's Auto class."""
    from finetune.kinds.registry import KINDS

    base = save_tiny_checkpoint(tmp_path / "bert", "bert")
    data = adapter_recipe(base, tmp_path, tmp_path / "run")
    data["task"] = other_kind_task(kind, tmp_path / "task")
    data["training"]["max_steps"] = 2
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 0, result.output
    assert head in " ".join(result.output.split())
    model = load_model(KINDS[kind].auto_class, str(tmp_path / "run" / "checkpoint"))
    assert type(model).__name__ == AutoConfig.from_pretrained(tmp_path / "run" / "checkpoint").architectures[0]


def test_an_adapter_on_a_language_model_adapter(tmp_path):
    """ULMFiT with LoRA at stages 2 and 3: the classifier's adapter records stage 2's adapter checkpoint as its base;
    the toolkit loads the chain (both merged), and `finetune merge` writes it flat."""
    from transformers import AutoTokenizer

    base = save_tiny_checkpoint(tmp_path / "bert", "bert")
    data = pretrain_recipe(write_corpus(tmp_path / "corpus"), tmp_path / "lm")
    data["model"] = {"family": "bert", "checkpoint": str(base), "adapter": ADAPTER}
    data["training"].update(max_steps=2, lr=5e-3)
    assert runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "lm.yaml", data))]).exit_code == 0
    language_model = tmp_path / "lm" / "checkpoint"
    recipe = write_yaml(
        tmp_path / "ft.yaml", adapter_recipe(language_model, write_task(tmp_path / "task"), tmp_path / "ft")
    )
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    checkpoint = tmp_path / "ft" / "checkpoint"
    assert json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        language_model
    )
    assert runner.invoke(app, ["merge", str(checkpoint), str(tmp_path / "merged")]).exit_code == 0
    batch = AutoTokenizer.from_pretrained(checkpoint)(SENTENCES, return_tensors="pt", padding=True)
    toolkit = load_model(AutoModelForSequenceClassification, str(checkpoint)).eval()
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert torch.allclose(toolkit(**batch).logits, merged(**batch).logits, atol=1e-5)


def test_evaluation_during_training_reads_the_adapter(tmp_path):
    """The dev scores a run records (and keep_best chooses by) come from the adapted model: the padding-free BERT
    route of prediction (models/packed_bert.py) reads weights directly, which would skip LoRA and the head's copy."""
    from accelerate import Accelerator

    from finetune.inference.predict import predict_logits
    from finetune.models.adapters import attach_adapter
    from finetune.models.backbones import layer_groups
    from finetune.recipes.adapters import AdapterConfig

    base = save_tiny_checkpoint(tmp_path / "bert", "bert")
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    attach_adapter(model, AdapterConfig(rank=4, alpha=8, dropout=0.0), layer_groups(model), str(base))
    torch.manual_seed(0)
    with torch.no_grad():  # a trained adapter and head: B is no longer zero, the head's copy differs
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter))
    model.eval()
    input_ids = torch.tensor([[2, 10, 11, 12, 3], [2, 13, 14, 3, 0]])
    batch = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}
    expected = model(**batch).logits
    found = predict_logits(Accelerator(cpu=True), model, [batch])
    torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-4, atol=1e-5)
