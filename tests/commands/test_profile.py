"""`finetune profile`: exact parameter counts, FLOPs against hand counts, the JSON form, one-line errors, no writes.

The matmul rate is given (--matmul-gflops) wherever the test is not about measuring it: the figures stay
deterministic, and the tests do not spend the machine's cores on matrix products.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.backbones import layer_groups
from finetune.models.flops import matmul_gflops, training_flops_per_token
from finetune.models.heads import load_classifier
from finetune.models.hub import load_tokenizer
from finetune.models.language_models import build_language_model
from finetune.models.sizes import language_model_parameters
from finetune.recipes import load_recipe
from finetune.tasks.specs import task_spec
from finetune.training.checkpoints import save_checkpoint
from finetune.training.unfreezing import freeze_below
from tests.conftest import REPO_ROOT, save_tiny_masked_lm, write_corpus

runner = CliRunner()
RATE = ["--matmul-gflops", "100"]
KEYS = {"stage", "model", "parameters", "compute", "memory_mb", "time_estimate"}


def invoke(*arguments):
    return runner.invoke(app, ["profile", *(str(argument) for argument in arguments)])


def profile_json(*arguments) -> dict:
    result = invoke(*arguments, *RATE, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def lm_recipe(corpus: Path, run_dir: Path, model: dict, **sections) -> dict:
    """A tiny pretrain recipe of any family (vocabulary 200 unless a section says otherwise)."""
    return {
        "stage": "pretrain",
        "run_dir": str(run_dir),
        "model": model,
        "tokenizer": {"vocab_size": 200, "min_frequency": 1},
        "corpus": {"train_files": [str(corpus)], "block_size": 16, "cache_dir": None},
        "training": {"batch_size": 8, "device": "cpu"},
        **sections,
    }


BERT = {"family": "bert", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 128}
GPT2 = {"family": "gpt2", "layers": 2, "hidden": 32, "heads": 4, "intermediate": 64}
AWD_LSTM = {"family": "awd_lstm", "embedding_size": 16, "hidden": 24, "layers": 3}


def save_tiny_awd_lstm(folder: Path) -> Path:
    """A tiny AWD-LSTM language model with a byte-level BPE tokenizer, saved as a checkpoint."""
    tokenizer = train_byte_level_bpe(read_documents([write_corpus(folder / "corpus")]), 300, min_frequency=1)
    config = AWDLSTMConfig(
        vocab_size=len(tokenizer), embedding_size=16, hidden_size=24, num_layers=2, pad_token_id=tokenizer.pad_token_id
    )
    torch.manual_seed(0)  # the same weights whichever tests ran before in this process (pytest-xdist deals them out)
    return save_checkpoint(AWDLSTMForCausalLM(config), tokenizer, folder / "checkpoint")


# ---------------------------------------------------------------------------------------------
# Parameters: the counts of the models a run really builds
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [BERT, GPT2, AWD_LSTM], ids=["bert", "gpt2", "awd_lstm"])
def test_pretraining_parameters_are_those_of_the_built_model(model, tmp_path, corpus_file, write_recipe):
    tokenizer = (
        train_byte_level_bpe(read_documents([corpus_file]), 150, min_frequency=1) if model["family"] != "bert" else None
    )
    if tokenizer is None:
        tokenizer_dir = save_tiny_masked_lm(tmp_path / "bert")  # its checkpoint folder holds the tokenizer
    else:
        tokenizer_dir = tmp_path / "tokenizer"
        tokenizer.save_pretrained(tokenizer_dir)
    data = lm_recipe(corpus_file, tmp_path / "run", model, tokenizer={"path": str(tokenizer_dir)})
    profile = profile_json(write_recipe(data))
    recipe = load_recipe(write_recipe(data))
    real = build_language_model(
        recipe.model, load_tokenizer(str(tokenizer_dir)), None if model["family"] == "awd_lstm" else 16
    )
    total = sum(parameter.numel() for parameter in real.parameters())
    embeddings = sum(module.weight.numel() for module in real.modules() if isinstance(module, torch.nn.Embedding))
    assert profile["parameters"]["total"] == total
    assert profile["parameters"]["embeddings"] == embeddings
    assert profile["parameters"]["other"] == total - embeddings
    assert profile["parameters"]["trainable_at_start"] == total  # pretraining freezes nothing
    assert profile["model"]["sizes"]["vocabulary"] == len(load_tokenizer(str(tokenizer_dir)))


def test_the_memory_check_counts_the_same_parameters(tmp_path, corpus_file, write_recipe):
    profile = profile_json(write_recipe(lm_recipe(corpus_file, tmp_path / "run", BERT)))
    recipe = load_recipe(write_recipe(lm_recipe(corpus_file, tmp_path / "run", BERT)))
    assert profile["parameters"]["total"] == language_model_parameters(recipe.model, 200, 16)
    assert profile["memory_mb"]["weights"] == pytest.approx(profile["parameters"]["total"] * 4 / 1e6)
    assert profile["memory_mb"]["adamw"] == pytest.approx(2 * profile["memory_mb"]["gradients"])


@pytest.mark.parametrize("pooling", ["model", "mean", "scalar_mix"])
def test_classifier_parameters_and_gradual_unfreezing(pooling, tmp_path, finetune_recipe_data, write_recipe):
    checkpoint = save_tiny_masked_lm(tmp_path / "lm")
    finetune_recipe_data["model"]["checkpoint"] = str(checkpoint)
    finetune_recipe_data["pooling"] = pooling
    path = write_recipe(finetune_recipe_data)
    profile = profile_json(path)
    recipe = load_recipe(path)
    real = load_classifier(recipe.model, task_spec(recipe.task), None, pooling)
    groups = layer_groups(real)
    freeze_below(groups, 1)  # the recipe: gradual unfreezing from one group
    assert profile["parameters"]["total"] == sum(parameter.numel() for parameter in real.parameters())
    assert profile["parameters"]["trainable_at_start"] == sum(
        parameter.numel() for parameter in real.parameters() if parameter.requires_grad
    )
    assert (profile["parameters"]["layer_groups"], profile["parameters"]["trainable_groups_at_start"]) == (
        len(groups),
        1,
    )
    kinds = {"model": "", "mean": ", mean pooling", "scalar_mix": ", scalar mix of every layer"}
    assert profile["model"]["kind"] == "2-label classifier" + kinds[pooling]


@pytest.mark.parametrize("pooling", ["model", "scalar_mix"])
def test_awd_lstm_classifier_parameters(pooling, tmp_path, finetune_recipe_data, write_recipe):
    finetune_recipe_data["model"]["checkpoint"] = str(save_tiny_awd_lstm(tmp_path / "lm"))
    finetune_recipe_data["unfreezing"] = {"mode": "gradual", "every_steps": 5, "initial_groups": 2}
    finetune_recipe_data["pooling"] = pooling
    path = write_recipe(finetune_recipe_data)
    profile = profile_json(path)
    recipe = load_recipe(path)
    real = load_classifier(recipe.model, task_spec(recipe.task), None, pooling)
    assert (real.scalar_mix is not None) == (pooling == "scalar_mix")
    freeze_below(layer_groups(real), 2)
    assert profile["parameters"]["total"] == sum(parameter.numel() for parameter in real.parameters())
    assert profile["parameters"]["trainable_at_start"] == sum(
        parameter.numel() for parameter in real.parameters() if parameter.requires_grad
    )


def test_ulmfit_profiles_each_stage_from_the_one_before():
    profile = profile_json(REPO_ROOT / "recipes" / "quickstart" / "ulmfit.yaml")
    assert profile["stage"] == "ulmfit"
    general, target, classifier = profile["stages"]
    assert [stage["section"] for stage in profile["stages"]] == ["general_lm", "target_lm", "classifier"]
    assert [stage["stage"] for stage in profile["stages"]] == ["pretrain", "pretrain", "finetune"]
    assert general["parameters"]["total"] == target["parameters"]["total"]  # same sizes and vocabulary (1,000)
    assert "previous stage" in target["model"]["source"] and "previous stage" in classifier["model"]["source"]
    assert classifier["parameters"]["trainable_groups_at_start"] == 1 < classifier["parameters"]["layer_groups"]
    assert general["compute"]["steps"] == 150 and general["compute"]["total_flops"] == pytest.approx(
        150 * general["compute"]["flops_per_step"]
    )


def test_intermediate_profiles_the_target_on_the_intermediate_stages_model(tmp_path):
    from tests.conftest import write_task, write_yaml
    from tests.stages.test_intermediate_flow import intermediate_recipe

    checkpoint = save_tiny_masked_lm(tmp_path / "base")
    data = intermediate_recipe(checkpoint, write_task(tmp_path / "a"), write_task(tmp_path / "b"), tmp_path / "run")
    data["target"]["task"] |= {"labels": ["0", "1", "2"], "metrics": ["accuracy"]}  # a head of 3: 33 more weights
    profile = profile_json(write_yaml(tmp_path / "flow.yaml", data))
    assert profile["stage"] == "intermediate"
    assert [stage["section"] for stage in profile["stages"]] == ["intermediate", "target", "target_alone"]
    first, target, alone = profile["stages"]
    assert "previous stage" in target["model"]["source"] and str(checkpoint) in alone["model"]["source"]
    assert target["parameters"]["total"] == alone["parameters"]["total"] == first["parameters"]["total"] + 33


# ---------------------------------------------------------------------------------------------
# FLOPs against hand counts
# ---------------------------------------------------------------------------------------------


def transformer_layer(hidden: int, intermediate: int, seq_len: int) -> int:
    """Multiply-adds per token of one block: Q, K, V, output (4h^2), feed-forward (2hi), attention (2sh)."""
    return 4 * hidden**2 + 2 * hidden * intermediate + 2 * seq_len * hidden


def test_masked_lm_flops_by_hand(tmp_path, corpus_file, write_recipe):
    profile = profile_json(write_recipe(lm_recipe(corpus_file, tmp_path / "run", BERT)))
    h, i, s, vocab, masked = 32, 128, 16, 200, 0.15
    # The head's transform (h^2) and the tied decoder (h V) only at the masked positions.
    by_hand = 6 * (2 * transformer_layer(h, i, s) + masked * (h * h + h * vocab))
    compute = profile["compute"]
    assert compute["flops_per_token"] == pytest.approx(by_hand)
    assert compute["flops_per_token"] == pytest.approx(training_flops_per_token(2, h, s, vocab, masked, True))
    assert compute["decoded_fraction"] == masked
    assert compute["tokens_per_step"] == 8 * 16
    assert compute["flops_per_step"] == pytest.approx(by_hand * 8 * 16)
    assert compute["steps"] is None and compute["total_flops"] is None  # steps depend on the data: not counted


def test_the_masked_lm_decodes_only_the_masked_fraction(tmp_path, corpus_file, write_recipe):
    flops = {}
    for probability in (0.15, 0.3):
        data = lm_recipe(corpus_file, tmp_path / "run", BERT, masking={"probability": probability})
        flops[probability] = profile_json(write_recipe(data))["compute"]["flops_per_token"]
    h, vocab = 32, 200
    assert flops[0.3] - flops[0.15] == pytest.approx(6 * 0.15 * (h * h + h * vocab))


def test_causal_transformer_flops_by_hand(tmp_path, corpus_file, write_recipe):
    data = lm_recipe(
        corpus_file,
        tmp_path / "run",
        GPT2,
        training={"batch_size": 4, "max_steps": 10, "gradient_accumulation_steps": 2},
    )
    compute = profile_json(write_recipe(data))["compute"]
    h, i, s, vocab = 32, 64, 16, 200
    by_hand = 6 * (2 * transformer_layer(h, i, s) + h * vocab)  # the tied decoder at every position
    assert compute["flops_per_token"] == pytest.approx(by_hand)
    assert compute["tokens_per_step"] == 4 * 2 * 16
    assert compute["total_flops"] == pytest.approx(by_hand * 4 * 2 * 16 * 10)


def test_awd_lstm_flops_by_hand(tmp_path, corpus_file, write_recipe):
    compute = profile_json(write_recipe(lm_recipe(corpus_file, tmp_path / "run", AWD_LSTM)))["compute"]
    sizes, vocab = [16, 24, 24, 16], 200
    gates = sum(4 * (inputs * outputs + outputs * outputs) for inputs, outputs in itertools.pairwise(sizes))
    assert compute["flops_per_token"] == pytest.approx(6 * (gates + 16 * vocab))  # LSTM gates + tied decoder


def test_frozen_groups_cost_only_their_forward(tmp_path, finetune_recipe_data, write_recipe):
    finetune_recipe_data["model"]["checkpoint"] = str(save_tiny_masked_lm(tmp_path / "lm"))  # 2 x 32, ffn 64
    compute = profile_json(write_recipe(finetune_recipe_data))["compute"]
    h, i, s, labels = 32, 64, 16, 2
    blocks = 2 * transformer_layer(h, i, s)
    head = (h * h + h * labels) / s  # pooler and classifier, once per example
    assert compute["flops_per_token"] == pytest.approx(6 * (blocks + head))
    assert compute["flops_per_token_at_start"] == pytest.approx(2 * blocks + 6 * head)  # only the head trains
    assert compute["decoded_fraction"] is None and compute["sequence_length"] == 16


def test_draws_x_seeds_count_every_run(tmp_path, finetune_recipe_data, write_recipe):
    finetune_recipe_data["model"]["checkpoint"] = str(save_tiny_masked_lm(tmp_path / "lm"))
    finetune_recipe_data["task"]["labels_per_class"] = 4
    finetune_recipe_data.update({"draws": 3, "seeds": [0, 1]})
    path = write_recipe(finetune_recipe_data)
    assert profile_json(path, "training.max_steps=5")["compute"]["runs"] == 6
    words = [word for word in invoke(path, "training.max_steps=5", *RATE).output.split() if word != "│"]
    assert "5 steps (training.max_steps, whatever the epochs) x 6 runs:" in " ".join(words)  # the table's text


# ---------------------------------------------------------------------------------------------
# The command: table, JSON, time, errors, nothing written
# ---------------------------------------------------------------------------------------------


def test_json_has_every_section(tmp_path, corpus_file, write_recipe):
    profile = profile_json(write_recipe(lm_recipe(corpus_file, tmp_path / "run", BERT)), "training.max_steps=20")
    assert profile.keys() >= KEYS and profile["recipe"].endswith(".yaml")
    assert {"total", "trainable_at_start", "embeddings", "other"} <= profile["parameters"].keys()
    assert {"flops_per_token", "tokens_per_step", "flops_per_step", "total_flops"} <= profile["compute"].keys()
    assert {"weights", "gradients", "adamw", "activations_estimate"} <= profile["memory_mb"].keys()
    time = profile["time_estimate"]
    assert time["matmul_gflops"] == 100 and not time["matmul_measured"] and time["mfu_assumed"] == 0.5
    assert time["seconds_per_step"] == pytest.approx(profile["compute"]["flops_per_step"] / 50e9)
    assert time["seconds_total"] == pytest.approx(20 * time["seconds_per_step"])


def test_table_and_measured_rate(tmp_path, corpus_file, write_recipe):
    result = invoke(write_recipe(lm_recipe(corpus_file, tmp_path / "run", AWD_LSTM)), "--mfu", "0.4")
    assert result.exit_code == 0, result.output
    for fragment in (
        "parameters",
        "FLOPs per token",
        "per step",
        "activations",
        "estimate",
        "40% MFU assumed",
        "measured here",
    ):
        assert fragment in result.stdout, fragment


def test_matmul_rate_is_measured_quickly():
    assert matmul_gflops(size=256, repeats=2) > 0


def test_nothing_is_written(tmp_path, corpus_file, write_recipe, monkeypatch):
    path = write_recipe(lm_recipe(corpus_file, tmp_path / "runs" / "pretrain", BERT))
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert invoke(path, *RATE).exit_code == 0
    assert sorted(tmp_path.rglob("*")) == before
    assert not (tmp_path / "runs").exists()


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    output = result.output.strip()
    assert output.startswith("error: ") and "\n" not in output and "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in output, (fragment, output)


def test_unknown_key_is_one_line(tmp_path, corpus_file, write_recipe):
    path = write_recipe(lm_recipe(corpus_file, tmp_path / "run", BERT))
    assert_one_line_error(invoke(path, "training.lrr=1"), "training.lrr", "unknown key")
    assert_one_line_error(invoke(tmp_path / "absent.yaml"), "absent.yaml")


def test_eval_recipe_is_refused(eval_recipe_data, write_recipe):
    assert_one_line_error(invoke(write_recipe(eval_recipe_data)), "training recipes", "eval")


def test_missing_checkpoint_is_one_line(finetune_recipe_data, write_recipe):
    assert_one_line_error(invoke(write_recipe(finetune_recipe_data)), "model.checkpoint", "no such model folder")


def test_a_hub_name_outside_the_cache_is_one_line(finetune_recipe_data, write_recipe):
    finetune_recipe_data["model"]["checkpoint"] = "someone/not-cached-model"
    assert_one_line_error(
        invoke(write_recipe(finetune_recipe_data)), "someone/not-cached-model", "local Hugging Face cache"
    )


@pytest.mark.parametrize(
    ("family", "says"),
    [("gpt2", "(an encoder with a masked-LM head): set model.family: bert"), ("awd_lstm", "model.family awd_lstm")],
)
def test_continuing_a_checkpoint_of_another_family_is_one_line(family, says, tmp_path, corpus_file, write_recipe):
    """Profiling a pretraining run that continues a checkpoint of another family says so, as the run would (this
    refusal once crashed on a name it had not defined)."""
    bert = save_tiny_masked_lm(tmp_path / "bert")
    data = lm_recipe(corpus_file, tmp_path / "run", {"family": family, "checkpoint": str(bert)})
    assert_one_line_error(invoke(write_recipe(data)), "model.checkpoint", f"{bert} is a 'bert' model", says)
