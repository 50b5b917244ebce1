"""The same recipes on 2 CPU processes (torchrun, gloo): what `accelerate launch` does on several GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed

from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_wordpiece
from finetune.models.masked_lm import build_masked_lm
from finetune.recipes import MaskedLMModelConfig
from finetune.run_dir import read_metrics
from finetune.training.checkpoints import save_checkpoint
from tests.conftest import REPO_ROOT, finetune_recipe, pretrain_recipe, write_corpus, write_task, write_yaml

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

# Runs the CLI under torchrun; reports each process's view so the test can check all of them.
LAUNCHER = textwrap.dedent("""
    import hashlib, json, sys
    import finetune.stages.finetune as finetune_stage
    import finetune.stages.pretrain as pretrain_stage
    from finetune.cli import app

    make_accelerator, shared_tokenizer = pretrain_stage.make_accelerator, pretrain_stage.shared_tokenizer
    process = {}

    def reporting_make_accelerator(*args, **kwargs):
        accelerator = make_accelerator(*args, **kwargs)
        process["index"] = accelerator.process_index
        print(f"NUM_PROCESSES {accelerator.num_processes} {accelerator.distributed_type}", flush=True)
        return accelerator

    def reporting_shared_tokenizer(*args, **kwargs):
        tokenizer = shared_tokenizer(*args, **kwargs)
        vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
        print(f"VOCAB {process['index']} {hashlib.md5(vocab.encode()).hexdigest()}", flush=True)
        return tokenizer

    pretrain_stage.make_accelerator = finetune_stage.make_accelerator = reporting_make_accelerator
    pretrain_stage.shared_tokenizer = reporting_shared_tokenizer
    app(sys.argv[1:], prog_name="finetune")
""")


def torchrun(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(launcher), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=environment, cwd=tmp_path)


def check_two_processes(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    assert re.findall(r"NUM_PROCESSES (\d+) \S*MULTI_CPU", output) == ["2", "2"], output[-3000:]


def test_pretrain_on_two_processes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    data = pretrain_recipe(corpus, tmp_path / "run")
    data["training"]["max_steps"] = 4
    result = torchrun(tmp_path, "pretrain", str(write_yaml(tmp_path / "pretrain.yaml", data)))
    output = result.stdout + result.stderr
    check_two_processes(result)
    # Every process must tokenize the corpus identically, or their token ids mean different things.
    vocabularies = dict(re.findall(r"VOCAB (\d) ([0-9a-f]+)", output))
    assert len(vocabularies) == 2 and len(set(vocabularies.values())) == 1, \
        f"the processes trained different tokenizers: {vocabularies}"
    assert result.returncode == 0, output[-3000:]
    train = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "train"]
    assert train[-1]["step"] == 4


def test_finetune_with_gradual_unfreezing_on_two_processes(tmp_path):
    documents = read_documents([write_corpus(tmp_path / "corpus")])
    tokenizer = train_wordpiece(documents, vocab_size=200, min_frequency=1)
    torch.manual_seed(0)
    model = build_masked_lm(MaskedLMModelConfig(layers=2, hidden=32, heads=2, intermediate=64), len(tokenizer),
                            max_positions=32, pad_token_id=tokenizer.pad_token_id)
    checkpoint = save_checkpoint(model, tokenizer, tmp_path / "pretrained")
    data = finetune_recipe(checkpoint, write_task(tmp_path / "task"), tmp_path / "run")
    result = torchrun(tmp_path, "finetune", str(write_yaml(tmp_path / "finetune.yaml", data)))
    output = result.stdout + result.stderr
    check_two_processes(result)
    assert result.returncode == 0, output[-3000:]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["trainable_groups"] for r in records if r["phase"] == "unfreeze"] == [1, 2]
    # 40 examples over 2 processes of 8 per batch: 3 steps per epoch, written once (by the main process).
    assert [r["step"] for r in records if r["phase"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()


def test_awd_lstm_on_two_processes_matches_one_process_with_the_same_global_batch(tmp_path):
    """BPTT streams split by process: 2 x 4 rows train the same model as 1 x 8 rows (dropouts off, same data)."""
    from finetune.data.tokenizers import train_byte_level_bpe
    from finetune.recipes import load_recipe
    from finetune.stages.pretrain import run_pretrain
    from safetensors.torch import load_file

    corpus = write_corpus(tmp_path / "corpus", lines=300)
    tokenizer = train_byte_level_bpe(read_documents([corpus]), vocab_size=300, min_frequency=1)
    tokenizer.save_pretrained(tmp_path / "tokenizer")

    def recipe(run_dir: Path, batch_size: int) -> dict:
        data = pretrain_recipe(corpus, run_dir)
        data["model"] = {"family": "awd_lstm", "embedding_size": 16, "hidden": 24, "layers": 2, "output_dropout": 0,
                         "hidden_dropout": 0, "input_dropout": 0, "embedding_dropout": 0, "weight_dropout": 0}
        data["tokenizer"] = {"path": str(tmp_path / "tokenizer")}
        data["training"].update({"batch_size": batch_size, "max_steps": 6})
        return data

    single = load_recipe(write_yaml(tmp_path / "single.yaml", recipe(tmp_path / "single", 8)))
    run_pretrain(single)
    result = torchrun(tmp_path, "pretrain", str(write_yaml(tmp_path / "double.yaml", recipe(tmp_path / "double", 4))))
    check_two_processes(result)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]

    def final_validation_loss(run_dir: Path) -> float:
        return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "eval"][-1]["validation_loss"]

    assert final_validation_loss(tmp_path / "double") == pytest.approx(final_validation_loss(tmp_path / "single"),
                                                                       rel=1e-5)
    single_weights = load_file(tmp_path / "single" / "checkpoint" / "model.safetensors")
    double_weights = load_file(tmp_path / "double" / "checkpoint" / "model.safetensors")
    for name, weight in single_weights.items():
        assert torch.allclose(weight, double_weights[name], atol=1e-6), name
