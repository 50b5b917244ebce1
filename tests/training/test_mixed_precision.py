"""The GPU path, run on the CPU: every stage under `training.mixed_precision=bf16` (what `auto` picks on a GPU that
has bf16), on tiny models. bf16 matmuls are slow on this CPU at real sizes, not at these.

What holds: losses finite and within BF16_TOLERANCE of the fp32 run's at every logged step; checkpoints written in
fp32 (the weights are fp32 masters, autocast only computes in bf16); `--resume` exact under bf16; the fast routes
(sparse MLM head, fused decoder + loss, packed BERT prediction) step aside under autocast, and what runs instead is
what fp32 computes, to bf16's precision. `eval` and `predict` have no precision setting: they read the fp32
checkpoint in fp32. fp16 needs a gradient scaler, which accelerate makes only on CUDA: the CPU refuses it (tested).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.cli import app
from finetune.recipes import load_recipe
from finetune.run_dir import read_metrics
from finetune.stages.finetune import run_finetune
from finetune.stages.pretrain import run_pretrain
from tests.conftest import eval_recipe, finetune_recipe, pretrain_recipe, write_yaml
from tests.stages.test_pretrain_families import AUTO_CLASS, family_recipe
from tests.stages.test_ulmfit_flow import ulmfit_recipe
from tests.training.test_resume_finetune import Stopped, assert_same_run, resumable_recipe, stop_after_checkpoint

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:mixed_precision=bf16 on a CPU is usually far slower")  # it is asked for
# bf16 keeps 8 bits of mantissa (~0.4% per rounding); over a dozen steps of a tiny model the training loss stays
# within a few percent of fp32's. A broken path (a loss in the wrong dtype, a cast lost) is off by far more.
BF16_TOLERANCE = 0.05


def train_losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in read_metrics(run_dir / "metrics.jsonl") if record["phase"] == "train"]


def assert_tracks_fp32(bf16_run: Path, fp32_run: Path) -> None:
    bf16, fp32 = train_losses(bf16_run), train_losses(fp32_run)
    assert len(bf16) == len(fp32) > 0
    assert all(math.isfinite(loss) for loss in bf16), bf16
    assert bf16 == pytest.approx(fp32, rel=BF16_TOLERANCE), (bf16, fp32)
    assert bf16 != fp32  # autocast really computed in bf16


def assert_fp32_checkpoint(checkpoint: Path) -> None:
    weights = load_file(checkpoint / "model.safetensors")
    assert {tensor.dtype for tensor in weights.values() if tensor.is_floating_point()} == {torch.float32}
    assert json.loads((checkpoint / "config.json").read_text()).get("torch_dtype", "float32") == "float32"


def with_precision(data: dict, precision: str) -> dict:
    data["training"]["mixed_precision"] = precision
    return data


@pytest.mark.parametrize("family", ["bert", "gpt2", "awd_lstm"])
def test_pretraining_under_bf16_tracks_fp32_and_saves_fp32(family, tmp_path, corpus_file, tokenizers):
    for precision in ("no", "bf16"):
        data = with_precision(family_recipe(family, corpus_file, tmp_path / precision, tokenizers[family]), precision)
        run_pretrain(load_recipe(write_yaml(tmp_path / f"{precision}.yaml", data)))
    assert_tracks_fp32(tmp_path / "bf16", tmp_path / "no")
    assert_fp32_checkpoint(tmp_path / "bf16" / "checkpoint")
    AUTO_CLASS[family].from_pretrained(tmp_path / "bf16" / "checkpoint")


@pytest.mark.parametrize("options", [{"memory_length": 8}, {"attention": "strided", "attention_stride": 4}])
def test_transformer_xl_and_sparse_pretraining_under_bf16(options, tmp_path):
    from tests.models.test_causal_transformer import causal_recipe

    for precision in ("no", "bf16"):
        recipe = causal_recipe(tmp_path, options, run=precision)
        run_pretrain(load_recipe(recipe, overrides=[f"training.mixed_precision={precision}"]))
    assert_tracks_fp32(tmp_path / "bf16", tmp_path / "no")
    assert_fp32_checkpoint(tmp_path / "bf16" / "checkpoint")


def test_finetune_eval_and_predict_under_bf16(pretrained, task_dir, tmp_path):
    for precision in ("no", "bf16"):
        data = with_precision(finetune_recipe(pretrained, task_dir, tmp_path / precision), precision)
        # fp32 runs the model's own forward too (bf16 never skips padding): the same batches and dropout draws.
        data["training"]["skip_padding"] = False
        run_finetune(load_recipe(write_yaml(tmp_path / f"{precision}.yaml", data)))
    assert_tracks_fp32(tmp_path / "bf16", tmp_path / "no")
    checkpoint = tmp_path / "bf16" / "checkpoint"
    assert_fp32_checkpoint(checkpoint)
    recipe = write_yaml(tmp_path / "eval.yaml", eval_recipe(task_dir, tmp_path / "eval", {"bf16": str(checkpoint)}))
    evaluated = runner.invoke(app, ["eval", str(recipe)])
    assert evaluated.exit_code == 0, evaluated.output
    (tmp_path / "input.txt").write_text("a fine film\na dull film\n", encoding="utf-8")
    predicted = runner.invoke(
        app, ["predict", str(checkpoint), "--input", str(tmp_path / "input.txt"), "--output", str(tmp_path / "p.jsonl")]
    )
    assert predicted.exit_code == 0, predicted.output
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isclose(sum(row["probabilities"].values()), 1, rel_tol=1e-5) for row in rows)


def test_resume_is_exact_under_bf16(pretrained, task_dir, tmp_path, monkeypatch):
    full = with_precision(resumable_recipe(pretrained, task_dir, tmp_path / "full"), "bf16")
    run_finetune(load_recipe(write_yaml(tmp_path / "full.yaml", full)))
    stopped = with_precision(resumable_recipe(pretrained, task_dir, tmp_path / "resumed"), "bf16")
    recipe = load_recipe(write_yaml(tmp_path / "resumed.yaml", stopped))
    with monkeypatch.context() as patch:
        stop_after_checkpoint(patch, 8)
        with pytest.raises(Stopped):
            run_finetune(recipe)
    run_finetune(recipe, resume=True)
    assert_same_run(tmp_path / "full", tmp_path / "resumed")


def test_ulmfit_under_bf16(tmp_path, corpus_file, task_dir):
    data = ulmfit_recipe(corpus_file, task_dir, tmp_path / "flow")
    for stage in ("general_lm", "target_lm", "classifier"):
        data[stage]["training"]["mixed_precision"] = "bf16"
    result = runner.invoke(app, ["ulmfit", str(write_yaml(tmp_path / "flow.yaml", data))])
    assert result.exit_code == 0, result.output
    for stage in ("1-general-lm", "2-target-lm", "3-classifier"):
        assert all(math.isfinite(loss) for loss in train_losses(tmp_path / "flow" / stage))
        assert_fp32_checkpoint(tmp_path / "flow" / stage / "checkpoint")


def test_lr_find_under_bf16(pretrained, task_dir, tmp_path):
    data = with_precision(finetune_recipe(pretrained, task_dir, tmp_path / "runs" / "ft"), "bf16")
    result = runner.invoke(app, ["lr-find", str(write_yaml(tmp_path / "recipe.yaml", data)), "--steps", "8"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "runs" / "ft-lr-find" / "lr_find.json").read_text())
    assert len(saved["losses"]) >= 5 and all(math.isfinite(loss) for loss in saved["losses"])


def test_fp16_is_refused_on_the_cpu_in_one_line(pretrained, task_dir, tmp_path):
    data = with_precision(finetune_recipe(pretrained, task_dir, tmp_path / "run"), "fp16")
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "training.mixed_precision" in errors[0] and "fp16" in errors[0], result.output
    assert not (tmp_path / "run").exists()


def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def assert_bf16_close(under_autocast: torch.Tensor, fp32: torch.Tensor) -> None:
    assert torch.isfinite(under_autocast).all()
    torch.testing.assert_close(under_autocast.float(), fp32, rtol=BF16_TOLERANCE, atol=BF16_TOLERANCE)


def forbid(monkeypatch, owner, name: str) -> None:
    """Make `owner.name` (a fast route's entry) fail if it is called."""

    def refused(*arguments, **keywords):
        raise AssertionError(f"{name} ran under autocast")

    monkeypatch.setattr(owner, name, refused)


def test_the_sparse_mlm_head_steps_aside_under_autocast_for_the_same_loss(monkeypatch):
    import finetune.models.masked_lm as masked_lm_module
    from finetune.models.masked_lm import SparseMaskedLM
    from tests.models.test_masked_lm import masked_batch, masked_lm

    model, (input_ids, labels) = SparseMaskedLM(masked_lm(dropout=0.0)).train(), masked_batch()
    fp32 = model(input_ids, labels)[0]  # the fast route: the hand-written encoder
    forbid(monkeypatch, masked_lm_module, "encode")
    with autocast():
        assert_bf16_close(model(input_ids, labels)[0], fp32)


def test_the_fused_decoder_and_loss_steps_aside_under_autocast_for_the_same_loss(monkeypatch):
    import finetune.models.causal_lm as causal_lm_module
    import finetune.models.linear_cross_entropy as linear_cross_entropy_module
    from finetune.models.causal_lm import NextTokenLM
    from tests.models.test_causal_lm_route import causal_lm, next_token_batch

    model, (input_ids, labels) = NextTokenLM(causal_lm(dropout=0.0)).train(), next_token_batch()
    fp32 = model(input_ids, labels)[0]
    forbid(monkeypatch, causal_lm_module, "decode")
    forbid(monkeypatch, linear_cross_entropy_module, "_chunked_loss")
    forbid(monkeypatch, linear_cross_entropy_module._ChunkedLinearCrossEntropy, "apply")
    with autocast():
        assert_bf16_close(model(input_ids, labels)[0], fp32)


def test_packed_bert_prediction_steps_aside_under_autocast_for_the_same_logits():
    from finetune.models.packed_bert import packed_logits
    from tests.models.test_packed_bert import bert_classifier, padded_pairs

    model, batch = bert_classifier(), padded_pairs()
    with torch.inference_mode():
        fp32 = packed_logits(model, **batch)
        assert fp32 is not None  # fp32 evaluation takes the packed route
        with autocast():
            assert packed_logits(model, **batch) is None  # under autocast it declines ...
            assert_bf16_close(model(**batch).logits, fp32)  # ... and the model's own forward gives the same logits


def test_a_bare_no_is_the_word_no(tmp_path, corpus_file):
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    (tmp_path / "recipe.yaml").write_text(
        yaml.safe_dump(data).replace("device: cpu", "device: cpu\n  mixed_precision: no"), encoding="utf-8"
    )
    assert "mixed_precision: no" in (tmp_path / "recipe.yaml").read_text()  # YAML reads it as false
    assert load_recipe(tmp_path / "recipe.yaml").training.mixed_precision == "no"
    overridden = load_recipe(tmp_path / "recipe.yaml", overrides=["training.mixed_precision=no"])
    assert overridden.training.mixed_precision == "no"
