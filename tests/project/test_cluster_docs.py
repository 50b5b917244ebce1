"""docs/gpus-and-clusters.md's accelerate configuration files read by accelerate's own reader, with every FSDP key one
`accelerate launch` knows, and passed by the toolkit's engine check; its SLURM script's launch is a doc command
(tests/project/test_doc_commands.py checks it)."""

from __future__ import annotations

import re

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig
from accelerate.commands.launch import launch_command_parser

from finetune.training.engines import check_distributed_engine
from tests.doc_commands import REPO_ROOT, shell_blocks

PAGE = REPO_ROOT / "docs" / "gpus-and-clusters.md"
CONFIG_BLOCK = re.compile(r"```yaml\n# accelerate config: (?P<name>[\w.-]+)\n(?P<text>.*?)```", re.DOTALL)


def config_blocks() -> dict[str, str]:
    return {match["name"]: match["text"] for match in CONFIG_BLOCK.finditer(PAGE.read_text(encoding="utf-8"))}


def test_the_page_gives_a_ddp_and_an_fsdp_configuration():
    assert set(config_blocks()) == {"ddp-8gpus.yaml", "fsdp-8gpus.yaml"}


@pytest.mark.parametrize("name", sorted(config_blocks()))
def test_each_configuration_reads_in_accelerate_and_passes_the_engine_check(name, tmp_path):
    path = tmp_path / name
    path.write_text(config_blocks()[name], encoding="utf-8")
    config = ClusterConfig.from_yaml_file(path)  # refuses an unknown top-level key
    launch_options = {action.dest for action in launch_command_parser()._actions}
    unknown = set(config.fsdp_config or {}) - launch_options
    assert not unknown, f"{name}: keys `accelerate launch` does not know: {sorted(unknown)}"
    assert config.rdzv_backend == "c10d" and config.main_process_port == 29500
    # The environment accelerate launch makes of the file, as far as the engine check reads it.
    fsdp = config.distributed_type == "FSDP"
    environ = {"ACCELERATE_USE_FSDP": str(fsdp).lower()}
    if fsdp:
        environ["FSDP_USE_ORIG_PARAMS"] = str(config.fsdp_config["fsdp_use_orig_params"]).lower()
        assert config.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"
    check_distributed_engine(False, environ)  # the GPUs' launch


def test_the_slurm_script_launches_once_per_machine_with_the_files_config():
    scripts = [block for block in shell_blocks(PAGE) if "#SBATCH" in block.text]
    assert len(scripts) == 1
    text = scripts[0].text
    assert "--ntasks-per-node=1" in text and "srun accelerate launch --config_file ddp-8gpus.yaml" in text
    directives = dict(re.findall(r"#SBATCH --([\w-]+)=(\S+)", text))
    assert directives["gpus-per-node"] == str(yaml.safe_load(config_blocks()["ddp-8gpus.yaml"])["num_processes"])
