"""The gpt2 family's own model: Transformer-XL memory (relative positions, segments carried across batches) and the
Sparse Transformer's strided and fixed attention, from the attention mask up to `finetune pretrain` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2LMHeadModel
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.errors import UserError
from finetune.inference.language_model_validation import segment_validation
from finetune.models.causal_attention import attention_pattern, relative_shift
from finetune.models.causal_lm import MemoryNextTokenLM, load_causal_lm
from finetune.models.causal_transformer import CausalTransformerConfig, CausalTransformerForCausalLM
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.pretrain import run_pretrain
from finetune.training.checkpoints import TRAINING_STATE_DIR
from tests.conftest import finetune_recipe, interrupted_at_step, pretrain_recipe, write_corpus, write_task, write_yaml
from tests.stages.test_pretrain_families import Interrupted, comparable_metrics

VOCAB = 40
runner = CliRunner()


def tiny_model(layers: int = 1, seed: int = 0, **options) -> CausalTransformerForCausalLM:
    """A small model without dropout, in eval mode: outputs are a deterministic function of the input."""
    torch.manual_seed(seed)
    config = CausalTransformerConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        dropout=0.0,
        attention_dropout=0.0,
        max_position_embeddings=64,
        **options,
    )
    return CausalTransformerForCausalLM(config).eval()


def tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# The attention patterns
# ---------------------------------------------------------------------------------------------


def allowed_by_definition(pattern: str, stride: int, i: int, j: int) -> bool:
    """The patterns as the papers write them (j may be negative: a remembered position); Python's % and //."""
    if j > i:
        return False
    if pattern == "strided":
        return (i - j) < stride or (i - j) % stride == 0
    if pattern == "fixed":
        return j // stride == i // stride or j % stride >= stride - 1  # c = 1 summary column
    return True


@pytest.mark.parametrize("pattern", ["dense", "strided", "fixed"])
@pytest.mark.parametrize("memory", [0, 8])
def test_the_mask_is_the_pattern_of_the_papers(pattern, memory):
    stride = None if pattern == "dense" else 4
    mask = attention_pattern(pattern, stride, 1, 12, memory)
    expected = [[allowed_by_definition(pattern, stride, i, j) for j in range(-memory, 12)] for i in range(12)]
    assert mask.tolist() == expected


PATTERN_MODELS = {  # (model options, segments): one segment alone, or a second one reading the first from memory
    "strided, learned positions": (
        {"attention_pattern": "strided", "attention_stride": 4, "relative_positions": False},
        1,
    ),
    "fixed, learned positions": ({"attention_pattern": "fixed", "attention_stride": 4, "relative_positions": False}, 1),
    "strided, relative positions and memory": (
        {"attention_pattern": "strided", "attention_stride": 4, "memory_length": 12},
        2,
    ),
    "fixed, relative positions and memory": (
        {"attention_pattern": "fixed", "attention_stride": 4, "memory_length": 12},
        2,
    ),
}


@pytest.mark.parametrize("options, segments", PATTERN_MODELS.values(), ids=PATTERN_MODELS.keys())
def test_each_position_sees_exactly_its_pattern(options, segments):
    """In a 1-layer model, changing token j changes the output at i exactly when j is in i's pattern (j <= i)."""
    model, length = tiny_model(**options), 12
    config = model.config
    stream = tokens(1, segments * length)

    def last_segment(ids: torch.Tensor) -> torch.Tensor:  # read segment by segment, the memory carried
        memory = None
        for start in range(0, ids.shape[1], length):
            output = model(ids[:, start : start + length], memory=memory)
            memory = output.memory
        return output.logits[0]

    with torch.no_grad():
        reference = last_segment(stream)
        offset = (segments - 1) * length  # positions of the last segment in the stream
        for j in range(stream.shape[1]):
            changed = stream.clone()
            changed[0, j] = (changed[0, j] + 1) % VOCAB
            moved = (last_segment(changed) - reference).abs().amax(dim=-1)
            for i in range(length):
                expected = allowed_by_definition(config.attention_pattern, config.attention_stride, i, j - offset)
                assert bool(moved[i] > 1e-6) == expected, (i, j - offset, moved[i].item())
                if not expected:
                    assert moved[i] == 0, (i, j - offset)  # exactly nothing, not merely little


# ---------------------------------------------------------------------------------------------
# Transformer-XL: memory and relative positions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["dense", "strided", "fixed"])
def test_a_segment_read_after_its_memory_is_the_joint_reading_of_both(pattern):
    """Memory of the whole first segment (M = L): every layer of segment 2 sees what a reading of 1+2 in one piece
    sees, so the outputs agree, though segment 2 sits at offsets 0..L-1 here and L..2L-1 there: no absolute
    position enters (a position table would break this)."""
    options = {} if pattern == "dense" else {"attention_pattern": pattern, "attention_stride": 4}
    model = tiny_model(layers=3, memory_length=8, **options)
    stream = tokens(2, 16)
    with torch.no_grad():
        first = model(stream[:, :8])
        second = model(stream[:, 8:], memory=first.memory)
        joint = model(stream, memory_length=0)
    torch.testing.assert_close(second.logits, joint.logits[:, 8:], atol=1e-5, rtol=1e-5)
    assert not any("position_embedding" in name for name, _ in model.named_parameters())


def test_the_memory_matters_and_memory_length_zero_is_a_model_without_it():
    model = tiny_model(layers=2, memory_length=8)
    stream = tokens(2, 16)
    with torch.no_grad():
        alone = model(stream[:, 8:]).logits
        remembering, forgetting = MemoryNextTokenLM(model), MemoryNextTokenLM(model, memory_length=0)
        for network in (remembering, forgetting):
            network(stream[:, :8], stream[:, 1:9])
        assert forgetting.state is None and len(remembering.state) == 2
        after_memory = model(stream[:, 8:], memory=remembering.state).logits
        without_memory = model(stream[:, 8:], memory=forgetting.state).logits
    assert not torch.allclose(after_memory, alone, atol=1e-4)  # segment 2 depends on segment 1
    torch.testing.assert_close(without_memory, alone)


def test_no_gradient_reaches_the_remembered_states():
    """The memory is read under a stop-gradient: segment 2's loss trains the weights, never segment 1's states."""
    model = tiny_model(layers=2, memory_length=8).train()
    remembered = tuple(torch.randn(2, 8, 16, requires_grad=True) for _ in range(2))
    output = model(tokens(2, 8), labels=tokens(2, 8, seed=1), memory=remembered)
    output.loss.backward()
    assert all(state.grad is None for state in remembered)
    assert model.transformer.layers[0].attention.query_key_value.weight.grad is not None
    assert all(not state.requires_grad for state in output.memory)  # the next memory is cut from the graph too


def test_the_relative_shift_puts_the_distance_of_each_key_in_place():
    """Scores against keys ordered farthest first (column k: distance K-1-k) land where key j has distance M+i-j."""
    queries, memory = 5, 3
    keys = queries + memory
    by_distance = torch.tensor([[100.0 * i + (keys - 1 - k) for k in range(keys)] for i in range(queries)])
    shifted = relative_shift(by_distance[None, None])[0, 0]
    for i in range(queries):
        for j in range(memory + i + 1):  # the causal part; the rest is masked
            assert shifted[i, j] == 100 * i + (memory + i - j)


def test_memory_is_dropped_for_a_batch_of_another_size():
    model = tiny_model(memory_length=8)
    with torch.no_grad():
        memory = model(tokens(4, 8)).memory
        short = model(tokens(2, 8, seed=1), memory=memory).logits
        torch.testing.assert_close(short, model(tokens(2, 8, seed=1)).logits)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{"memory_length": 8}, {"attention_pattern": "fixed", "attention_stride": 4, "relative_positions": False}],
    ids=["xl", "fixed"],
)
def test_save_and_reload_gives_the_same_model(options, tmp_path):
    model = tiny_model(layers=2, **options)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "finetune_causal_transformer"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is CausalTransformerForCausalLM
    assert reloaded.config.to_diff_dict() | {"_name_or_path": ""} == model.config.to_diff_dict() | {"_name_or_path": ""}
    ids = tokens(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    # Never silently a dense GPT-2: continuing it as one is refused.
    with pytest.raises(UserError, match="finetune_causal_transformer"):
        load_causal_lm(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# `finetune pretrain`, segment validation, refusals
# ---------------------------------------------------------------------------------------------

OPTIONS = {
    "memory": {"memory_length": 8},
    "strided": {"attention": "strided", "attention_stride": 4},
    "fixed with memory": {"attention": "fixed", "attention_stride": 8, "memory_length": 16},
}


def causal_recipe(tmp_path: Path, options: dict, run: str = "run", tokenizer: Path | None = None) -> Path:
    """A tiny gpt2 recipe with the given model options: 12 steps, checkpoints every 4, validation every 6."""
    corpus = write_corpus(tmp_path / "corpus", lines=300)
    validation = write_corpus(tmp_path / "validation", lines=40)
    data = pretrain_recipe(corpus, tmp_path / run)
    data["model"] = {
        "family": "gpt2",
        "layers": 2,
        "hidden": 32,
        "heads": 2,
        "intermediate": 64,
        "dropout": 0.1,
        **options,
    }
    data["corpus"].update(validation_files=[str(validation)])
    data["corpus"].pop("validation_fraction")
    data["training"].update({"epochs": 2, "max_steps": 12, "log_every": 1})
    data.update(checkpoint_every=4, eval_every=6)
    if tokenizer is not None:
        data["tokenizer"] = {"path": str(tokenizer)}
    return write_yaml(tmp_path / f"{run}.yaml", data)


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_pretrain_trains_it_and_its_checkpoint_loads_with_transformers(options, tmp_path):
    result = runner.invoke(app, ["pretrain", str(causal_recipe(tmp_path, options))])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    evaluations = [record for record in read_metrics(run / "metrics.jsonl") if record["phase"] == "eval"]
    assert [record["step"] for record in evaluations] == [6, 12]
    assert all(0 < record["validation_loss"] < 10 for record in evaluations)
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoint")
    assert type(model) is CausalTransformerForCausalLM
    assert model.config.memory_length == options.get("memory_length", 0)
    assert model.config.attention_pattern == options.get("attention", "dense")
    assert "finetune.models.causal_transformer" in (run / "checkpoint" / "README.md").read_text()
    carried = load_file(run / "checkpoints" / "step-00000008" / TRAINING_STATE_DIR / "process_tensors_0.safetensors")
    memory = sorted(name for name in carried if name.startswith("memory_"))
    assert memory == (["memory_0", "memory_1"] if "memory_length" in options else [])
    if memory:  # rows of the BPTT batch, remembered positions, hidden
        assert carried["memory_0"].shape == (8, options["memory_length"], 32)


def test_plain_gpt2_recipes_keep_gpt2(tmp_path):
    result = runner.invoke(app, ["pretrain", str(causal_recipe(tmp_path, {})), "training.max_steps=2"])
    assert result.exit_code == 0, result.output
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint")) is GPT2LMHeadModel


def test_resume_with_memory_continues_exactly(tmp_path, monkeypatch):
    """Interrupted at the step-4 checkpoint and resumed: the same weights and metrics as the uninterrupted run,
    so the memory carried across batches was saved and put back."""
    tokenizer = train_byte_level_bpe(read_documents([write_corpus(tmp_path / "corpus", lines=300)]), 200, False, 1)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    options = {"memory_length": 8}
    run_pretrain(load_recipe(causal_recipe(tmp_path, options, "full", tmp_path / "tokenizer")))
    resumed = load_recipe(causal_recipe(tmp_path, options, "resumed", tmp_path / "tokenizer"))
    with interrupted_at_step(4, Interrupted):
        run_pretrain(resumed)
    run_pretrain(resumed, resume=True)
    full_weights = load_file(tmp_path / "full" / "checkpoint" / "model.safetensors")
    resumed_weights = load_file(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    assert full_weights.keys() == resumed_weights.keys()
    assert all(torch.equal(full_weights[name], resumed_weights[name]) for name in full_weights)
    assert comparable_metrics(tmp_path / "full") == comparable_metrics(tmp_path / "resumed")


def test_segment_validation_reads_longer_contexts_than_training(tmp_path):
    result = runner.invoke(app, ["pretrain", str(causal_recipe(tmp_path, {"memory_length": 8}))])
    assert result.exit_code == 0, result.output
    checkpoint, validation = tmp_path / "run" / "checkpoint", [tmp_path / "validation" / "train.txt"]
    final = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "eval"][-1]
    # As the run validated (segments of 16, memory 8, 8 rows): the same loss.
    as_trained = segment_validation(checkpoint, validation, segment_length=16, rows=8)
    assert as_trained["validation_loss"] == pytest.approx(final["validation_loss"], rel=1e-6)
    longer = segment_validation(checkpoint, validation, segment_length=32, memory_length=64, rows=4)
    no_memory = segment_validation(checkpoint, validation, segment_length=32, memory_length=0, rows=4)
    assert 0 < longer["validation_loss"] < 10 and longer["validation_loss"] != no_memory["validation_loss"]


def test_segment_validation_refusals(tmp_path):
    result = runner.invoke(app, ["pretrain", str(causal_recipe(tmp_path, OPTIONS["strided"]))])
    assert result.exit_code == 0, result.output
    checkpoint, validation = tmp_path / "run" / "checkpoint", [tmp_path / "validation" / "train.txt"]
    with pytest.raises(UserError, match=r"memory_length: .* without memory"):
        segment_validation(checkpoint, validation, segment_length=16, memory_length=8)
    with pytest.raises(UserError, match="stride 4 must divide it"):
        segment_validation(checkpoint, validation, segment_length=18)
    with pytest.raises(UserError, match="exceeds the 16 positions"):
        segment_validation(checkpoint, validation, segment_length=32)


REMOVED = object()  # a corpus key the case takes out
STREAM = {
    "dataset": "json",
    "streaming": True,
    "validation_documents": 10,
    "train_files": REMOVED,
    "validation_fraction": REMOVED,
}
BAD_MODELS = {  # model section, changes to the corpus section, fragments the one error line must name
    "stride does not divide the block": (
        {"attention": "strided", "attention_stride": 5},
        {},
        ("model.attention_stride (5)", "corpus.block_size (16)"),
    ),
    "sparse attention without a stride": (
        {"attention": "fixed"},
        {},
        ("model", "attention fixed needs attention_stride"),
    ),
    "a stride with dense attention": ({"attention_stride": 4}, {}, ("model", "takes no attention_stride")),
    "unknown pattern": ({"attention": "diagonal"}, {}, ("model.attention", "diagonal")),
    "negative memory": ({"memory_length": -1}, {}, ("model.memory_length",)),
    "memory with a position table": ({"memory_length": 8, "max_positions": 64}, {}, ("max_positions",)),
    "memory on a stream": ({"memory_length": 8}, STREAM, ("corpus.streaming", "model.memory_length")),
    "memory on bert": ({"family": "bert", "memory_length": 8}, {}, ("model.memory_length", "unknown key")),
    "attention on awd_lstm": ({"family": "awd_lstm", "attention": "strided"}, {}, ("model.attention", "unknown key")),
    "memory with a checkpoint": ({"checkpoint": "gpt2", "memory_length": 8}, {}, ("model.checkpoint",)),
}


@pytest.mark.parametrize("model, corpus, named", BAD_MODELS.values(), ids=BAD_MODELS.keys())
def test_bad_options_are_one_line_and_exit_code_2(model, corpus, named, tmp_path):
    data = pretrain_recipe(write_corpus(tmp_path / "corpus"), tmp_path / "run")
    data["model"] = {"family": "gpt2", **model}
    data["corpus"].update(corpus)
    data["corpus"] = {key: value for key, value in data["corpus"].items() if value is not REMOVED}
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    output = result.output.strip()
    assert result.exit_code == 2 and output.startswith("error: ") and "\n" not in output, output
    assert all(fragment in output for fragment in named), output
    assert not (tmp_path / "run").exists()


def test_finetune_refuses_these_checkpoints_in_one_line(tmp_path):
    model = tiny_model(memory_length=8)
    model.save_pretrained(tmp_path / "lm")
    train_byte_level_bpe(["the film was great ."] * 20, 300, False, 1).save_pretrained(tmp_path / "lm")
    task = write_task(tmp_path / "task")
    for pooling in ("model", "mean", "scalar_mix"):
        data = {**finetune_recipe(tmp_path / "lm", task, tmp_path / "run"), "pooling": pooling}
        result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
        output = result.output.strip()
        assert result.exit_code == 2 and output.startswith("error: ") and "\n" not in output, output
        assert "finetune_causal_transformer" in output and "not supported yet" in output
        assert not (tmp_path / "run").exists()


def test_the_ulmfit_flow_refuses_them_before_training(tmp_path):
    from tests.stages.test_ulmfit_flow import ulmfit_recipe

    data = ulmfit_recipe(write_corpus(tmp_path / "corpus"), write_task(tmp_path / "task"), tmp_path / "run")
    data["general_lm"]["model"] = {"family": "gpt2", "layers": 1, "hidden": 16, "heads": 2, "memory_length": 8}
    data["target_lm"].pop("tokenizer")  # new_vocabulary is the AWD-LSTM's
    result = runner.invoke(app, ["ulmfit", str(write_yaml(tmp_path / "recipe.yaml", data))])
    output = result.output.strip()
    assert result.exit_code == 2 and output.startswith("error: ") and "\n" not in output, output
    assert "general_lm.model: memory_length and attention" in output
    assert not (tmp_path / "run").exists()
