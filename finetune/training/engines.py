"""accelerate's distributed engines a recipe may run under, checked before the accelerator is made.

`accelerate launch` tells the processes which engine to use through the environment (ACCELERATE_USE_DEEPSPEED,
ACCELERATE_USE_FSDP and their settings, from `accelerate config` or its flags); the Accelerator reads them. Two
settings cannot train a recipe correctly, and one is not what it says, so they are refused in one line before
anything is built:
- DeepSpeed ZeRO stages 2 and 3 partition the gradients and keep them in the engine's own buffers, where the loop's
  exact averaging over a step's examples (it rescales `param.grad`, training/loop.py) never reaches them: every
  step would be weighted wrongly, silently. DDP (the default launch) is the tested path.
- FSDP without `use_orig_params` flattens each wrapped module's parameters into one: the optimizer's parameter
  group per layer group (discriminative LRs) and gradual unfreezing's frozen groups cannot be told apart in it.
- FSDP or DeepSpeed on CPU processes: accelerate takes either plugin only for GPU-like devices; on CPUs (MULTI_CPU)
  it runs DDP without a word, each process holding the whole model, which is what the user asked them to avoid.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed

from finetune.errors import UserError

DEEPSPEED_DEFAULT_STAGE = 2  # accelerate's stage when neither the launch nor a config file names one
_ENGINE_FLAGS = {"DeepSpeed": "ACCELERATE_USE_DEEPSPEED", "FSDP": "ACCELERATE_USE_FSDP"}


def check_distributed_engine(on_cpu: bool, environ: Mapping[str, str] | None = None) -> None:
    """Refuse an engine the training loop cannot run correctly (see the module docstring), in one line; `on_cpu`:
    the run trains on CPU processes."""
    environ = os.environ if environ is None else environ
    asked = [name for name, flag in _ENGINE_FLAGS.items() if _flag(environ, flag)]
    if on_cpu and asked:
        raise UserError(
            f"accelerate launch: {asked[0]} on CPU processes is not what it says: accelerate takes its {asked[0]} "
            "plugin on GPUs only and runs DDP (a whole copy of the model per process) on CPUs; launch on GPUs, or "
            f"without {asked[0]}"
        )
    if _flag(environ, "ACCELERATE_USE_DEEPSPEED"):
        stage = deepspeed_zero_stage(environ)
        if stage >= 2:
            raise UserError(
                f"accelerate launch: DeepSpeed ZeRO stage {stage} keeps the gradients in its own partitioned buffers, "
                "where finetune's exact averaging of a step's examples cannot reach them: launch without DeepSpeed "
                "(DDP, `accelerate launch --multi_gpu`), or with ZeRO stage 0 or 1"
            )
    if _flag(environ, "ACCELERATE_USE_FSDP") and not _flag(environ, "FSDP_USE_ORIG_PARAMS"):
        raise UserError(
            "accelerate launch: FSDP without use_orig_params flattens the parameters, so the layer groups' learning "
            "rates and gradual unfreezing cannot reach them: set fsdp_use_orig_params: true in the accelerate "
            "config (or --fsdp_use_orig_params true)"
        )


def deepspeed_zero_stage(environ: Mapping[str, str]) -> int:
    """The ZeRO stage accelerate will use: the launch's, else the DeepSpeed config file's, else its default."""
    if environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        return int(environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
    config = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if config != "none" and Path(config).is_file():
        try:
            stage = json.loads(Path(config).read_text(encoding="utf-8")).get("zero_optimization", {}).get("stage")
        except (json.JSONDecodeError, AttributeError):
            raise UserError(f"accelerate launch: the DeepSpeed config file {config} is not a JSON object") from None
        if isinstance(stage, int):
            return stage
    return DEEPSPEED_DEFAULT_STAGE


# What torch's process-group backends say when another process (or its machine) went away mid-collective.
_LOST_PROCESS_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
)


def is_lost_process(error: BaseException) -> bool:
    """Whether a collective failed because another process of the run stopped (killed, crashed, its machine gone)."""
    distributed_error = getattr(torch.distributed, "DistNetworkError", ())
    return isinstance(error, distributed_error) or any(sign in str(error) for sign in _LOST_PROCESS_SIGNS)


def lost_process_message(error: BaseException, step: int, checkpoint: Path | None) -> str:
    """One line for the surviving main process: what happened, where the run stands, how to go on."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    # gloo's: "[.../pair.cc:553] Connection closed by peer [127.0.0.1]:6019. This is typically caused by ...": the cause
    first = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]
    where = (
        f"the newest checkpoint is {checkpoint}: start every process again with --resume"
        if checkpoint is not None
        else "no periodic checkpoint was saved yet (checkpoint_every): start the run again"
    )
    return f"another process stopped after {step} optimizer step(s) ({first}); {where}"


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "false").strip().lower() in ("1", "true", "yes")
