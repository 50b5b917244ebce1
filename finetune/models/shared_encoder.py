"""One encoder under several task heads (multi-task fine-tuning, MT-DNN's shape).

Each task's model is its kind's usual Hugging Face model (a sequence classifier, a token classifier, ...), built from
the same checkpoint; `share_encoder` then makes their backbones' blocks one set of modules: the first model's
embeddings and transformer blocks become every model's. What lies outside them stays each task's own (its head, and
a BERT pooler where its head reads one). So each task's model is still a whole Hugging Face model that saves and
loads as one (the encoder with that task's head), and the optimizer sees every shared parameter once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from finetune.errors import CheckpointError
from finetune.models.backbones import layer_groups


def share_encoder(models: Sequence[nn.Module]) -> int:
    """Give every model the first one's backbone blocks (`model.base_model`'s children of the same name and type;
    a pooler only one of them has stays its own); returns the parameters shared."""
    shared: Any = models[0].base_model
    for model in models[1:]:
        backbone = model.base_model
        for name, module in shared.named_children():
            own = getattr(backbone, name, None)
            if own is None or module is None:
                continue
            if type(own) is not type(module):
                raise CheckpointError(f"the tasks' models differ in their backbone's {name} ({type(own).__name__} vs "
                                 f"{type(module).__name__}); they cannot share it")  # fmt: skip
            if any(parameter.shape != mine.shape for parameter, mine in zip(own.parameters(), module.parameters())):
                raise CheckpointError(f"the tasks' models differ in the shape of their backbone's {name}")
            setattr(backbone, name, module)
    return sum(parameter.numel() for parameter in shared_parameters(models))


def shared_parameters(models: Sequence[nn.Module]) -> list[nn.Parameter]:
    """The parameters every model holds (the shared encoder's)."""
    common = {id(parameter) for parameter in models[0].parameters()}
    for model in models[1:]:
        common &= {id(parameter) for parameter in model.parameters()}
    return [parameter for parameter in models[0].parameters() if id(parameter) in common]


def shared_layer_groups(models: Sequence[nn.Module]) -> list[list[nn.Parameter]]:
    """Layer groups bottom to top over every model's parameters, each once: the shared encoder's groups (the first
    model's, models/backbones.py), then one top group of every task's own parameters (the heads, ULMFiT's last
    group: discriminative LRs and gradual unfreezing treat them as one model's head)."""
    common = {id(parameter) for parameter in shared_parameters(models)}
    lower = [group for group in layer_groups(models[0])[:-1] if group]  # type: ignore[arg-type]
    if any(id(parameter) not in common for group in lower for parameter in group):
        raise CheckpointError("the encoder's layer groups hold a task's own parameters; its family cannot be shared")
    grouped = {id(parameter) for group in lower for parameter in group}
    top: dict[int, nn.Parameter] = {}
    for model in models:
        top |= {id(parameter): parameter for parameter in model.parameters() if id(parameter) not in grouped}
    return [*lower, list(top.values())]


class MultiTaskModel(nn.Module):
    """The tasks' models as one module (what accelerate prepares and DDP wraps): `forward(task, **inputs)` runs task
    number `task`'s model, so every step's forward goes through the wrapper and DDP sees it."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        self.tasks = nn.ModuleList(models)

    def forward(self, task: int, **inputs):
        return self.tasks[task](**inputs)

    def state_dict(self, *arguments, **keywords):
        """Each tensor once, under its first name (the shared encoder's under task 0's model): a resumable
        checkpoint stores the encoder once, and safetensors refuses a file with one tensor under two names."""
        whole = super().state_dict(*arguments, **keywords)
        seen: set[tuple] = set()
        kept = type(whole)()
        for name, tensor in whole.items():
            # state_dict hands detached views: a shared tensor is known by its memory, not its object
            where = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype) if tensor.numel() else (name,)
            if where not in seen:
                seen.add(where)
                kept[name] = tensor
        return kept

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """What `state_dict` saved: the names it left out are the shared tensors, loaded under their first name."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        aliases = set(super().state_dict().keys()) - set(self.state_dict().keys())
        missing = [name for name in result.missing_keys if name not in aliases]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"multi-task state: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}")
        return type(result)(missing, result.unexpected_keys)  # the aliases are not missing: they were loaded


class TaskView:
    """One task's model as its kind's code calls it: a call runs the (prepared) multi-task module for that task;
    every attribute is the task model's own (config, train(), eval(), parameters() ...)."""

    def __init__(self, prepared: nn.Module, task: int, model: nn.Module):
        self._prepared, self._task, self._model = prepared, task, model

    def __call__(self, *arguments, **inputs):
        if arguments:  # a kind's code calls its model with keywords; a positional input_ids is named
            inputs = {"input_ids": arguments[0], **inputs}
        return self._prepared(self._task, **inputs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def forward(self, *arguments, **inputs):
        return self(*arguments, **inputs)
