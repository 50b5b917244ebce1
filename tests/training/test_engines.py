"""accelerate's engines a launch names (training/engines.py): DeepSpeed ZeRO 2-3 and FSDP without use_orig_params
are refused in one line before anything is built; what passes is left to accelerate."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.training.engines import (
    check_distributed_engine,
    deepspeed_zero_stage,
    is_lost_process,
    lost_process_message,
)
from tests.conftest import finetune_recipe, write_yaml

runner = CliRunner()


@pytest.mark.parametrize(
    "environ, stage",
    [
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, 3),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}, 1),
        ({}, 2),  # accelerate's default
    ],
)
def test_the_zero_stage_is_read_as_accelerate_reads_it(environ, stage):
    assert deepspeed_zero_stage(environ) == stage


def test_the_zero_stage_comes_from_the_deepspeed_config_file(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert deepspeed_zero_stage({"ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config)}) == 1
    config.write_text("[1, 2]")
    with pytest.raises(UserError, match="is not a JSON object"):
        deepspeed_zero_stage({"ACCELERATE_DEEPSPEED_CONFIG_FILE": str(config)})


@pytest.mark.parametrize(
    "environ, refused",
    [
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, "DeepSpeed ZeRO stage 2"),
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "DeepSpeed ZeRO stage 3"),
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}, None),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_USE_ORIG_PARAMS": "false"}, "FSDP without use_orig_params"),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_USE_ORIG_PARAMS": "true"}, None),
        ({"ACCELERATE_USE_DEEPSPEED": "false", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, None),
    ],
)
def test_engines_the_loop_cannot_train_are_refused(environ, refused):
    if refused is None:
        check_distributed_engine(False, environ)
    else:
        with pytest.raises(UserError, match=refused):
            check_distributed_engine(False, environ)


def test_fsdp_on_cpu_processes_is_refused_as_accelerate_would_run_ddp():
    """Measured with accelerate 1.x under torchrun: ACCELERATE_USE_FSDP on CPU processes gives MULTI_CPU (DDP)."""
    environ = {"ACCELERATE_USE_FSDP": "true", "FSDP_USE_ORIG_PARAMS": "true"}
    with pytest.raises(UserError, match="FSDP on CPU processes is not what it says"):
        check_distributed_engine(True, environ)
    check_distributed_engine(False, environ)  # on GPUs it is accelerate's FSDP
    with pytest.raises(UserError, match="DeepSpeed on CPU processes"):
        check_distributed_engine(True, {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"})


def test_a_deepspeed_launch_on_cpus_stops_the_cli_in_one_line_before_the_run_folder(
    pretrained, task_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    path = write_yaml(tmp_path / "recipe.yaml", finetune_recipe(pretrained, task_dir, tmp_path / "run"))
    result = runner.invoke(app, ["finetune", str(path)])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "DeepSpeed on CPU processes is not what it says" in line
    assert "launch on GPUs, or without DeepSpeed" in line and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_a_lost_process_is_told_apart_and_said_in_one_line(tmp_path):
    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:6019. This is typically caused by a remote worker crashing. Check the logs."
    )
    assert is_lost_process(gloo) and not is_lost_process(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    message = lost_process_message(gloo, 7, tmp_path / "checkpoints" / "step-00000006")
    assert message == (
        "another process stopped after 7 optimizer step(s) (Connection closed by peer [127.0.0.1]:6019); the newest "
        f"checkpoint is {tmp_path / 'checkpoints' / 'step-00000006'}: start every process again with --resume"
    )
    assert "no periodic checkpoint was saved yet" in lost_process_message(gloo, 0, None)
