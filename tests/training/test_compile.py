"""`training.compile: true`: torch.compile (Inductor, which writes fused C++ kernels on the CPU) on the prepared
model, in place. The run computes what the eager run computes, to float rounding; checkpoints and training state keep
the uncompiled model's parameter names. Dropout is off in these runs: Inductor draws its own random numbers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from finetune.stages.pretrain import run_pretrain
from tests.conftest import finetune_recipe, write_yaml
from tests.stages.test_pretrain_families import family_recipe
from tests.training.test_mixed_precision import train_losses

pytestmark = [
    pytest.mark.skipif(not hasattr(torch.nn.Module, "compile"), reason="nn.Module.compile needs torch >= 2.2"),
    pytest.mark.slow,  # torch.compile compiles each model (make test-slow; CI runs it too)
]
# Fused kernels sum in another order than eager's; a dozen steps of a tiny model keep the loss within this.
COMPILED_TOLERANCE = 1e-3


def test_compiled_pretraining_matches_eager_and_saves_plain_names(tmp_path, corpus_file, tokenizers):
    for compiled in (False, True):
        data = family_recipe("bert", corpus_file, tmp_path / str(compiled), tokenizers["bert"])
        data["model"]["dropout"] = 0.0
        data["training"].update({"compile": compiled, "max_steps": 6})
        data.update({"checkpoint_every": None, "eval_every": None})
        run_pretrain(load_recipe(write_yaml(tmp_path / f"{compiled}.yaml", data)))
    assert train_losses(tmp_path / "True") == pytest.approx(train_losses(tmp_path / "False"), rel=COMPILED_TOLERANCE)
    eager = load_file(tmp_path / "False" / "checkpoint" / "model.safetensors")
    compiled_weights = load_file(tmp_path / "True" / "checkpoint" / "model.safetensors")
    assert compiled_weights.keys() == eager.keys()  # no `_orig_mod.` prefix
    AutoModelForMaskedLM.from_pretrained(tmp_path / "True" / "checkpoint")


def test_compiled_finetuning_with_gradual_unfreezing_matches_eager(pretrained_without_dropout, task_dir, tmp_path):
    for compiled in (False, True):
        data = finetune_recipe(pretrained_without_dropout, task_dir, tmp_path / str(compiled))
        data["classifier_dropout"] = 0.0
        data["training"]["compile"] = compiled  # each thawed group changes what backward computes: a recompile
        # Eager runs the model's own forward too (compiled ones never skip padding), on the same batches.
        data["training"]["skip_padding"] = False
        run_finetune(load_recipe(write_yaml(tmp_path / f"{compiled}.yaml", data)))
    assert train_losses(tmp_path / "True") == pytest.approx(train_losses(tmp_path / "False"), rel=COMPILED_TOLERANCE)
    assert load_file(tmp_path / "True" / "checkpoint" / "model.safetensors").keys() == (
        load_file(tmp_path / "False" / "checkpoint" / "model.safetensors").keys()
    )
