"""`finetune export CHECKPOINT --onnx`: a fine-tuned sequence classifier as an ONNX graph ONNX Runtime runs alone.

The graph comes from torch's own exporter, `torch.onnx.export(..., dynamo=True)` (torch.export traces the model,
onnxscript writes the operators; docs/export.md says why this one): inputs the tokenizer's `input_ids`,
`attention_mask` (and `token_type_ids` where its family has them), output `logits`, batch and sequence length
dynamic. The folder it writes holds model.onnx, the tokenizer's files, config.json (the label mapping) and
finetune_recipe.yaml, so it is self-contained. Before it returns, ONNX Runtime runs the graph on a padded batch and
its logits are compared with PyTorch's: a graph that disagrees by more than 1e-4 is reported, not written silently.

A calibrated classifier (recipe key calibration) is exported as its checkpoint is saved: the graph gives the model's
logits, and config.json keeps the temperature (calibration_temperature) that its probabilities divide them by, so
that the graph and transformers' model agree and one rule (softmax(logits / T)) serves both.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from finetune.errors import RunFailed, UserError
from finetune.inference.calibration import temperature_of
from finetune.models.hub import is_classifier, load_pretrained, load_tokenizer
from finetune.models.loading import load_model
from finetune.models.mean_pooling import backbone_config
from finetune.run_dir import CHECKPOINT_DIR
from finetune.training.checkpoints import HYPERPARAMETERS_FILE

INSTALL_HINT = "pip install 'finetune[export]' (onnx, onnxruntime, onnxscript)"
MODEL_FILE = "model.onnx"
OLDEST_OPSET = 18  # the oldest opset the dynamo exporter writes
DEFAULT_OPSET = 18
TOLERANCE = 1e-4  # the largest logit difference between ONNX Runtime and PyTorch accepted
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")  # those the tokenizer makes are the graph's inputs
SAMPLE_TEXTS = ["a", "a longer text, to pad the shorter one in the batch"]  # cut to SAMPLE_LENGTH tokens
SAMPLE_LENGTH = 8  # below any position table's size, above 1 (a length torch.export would take as fixed)


@dataclass(frozen=True)
class Exported:
    """What `run_export` wrote: the graph's file, its inputs, its opset and ONNX Runtime's largest logit difference."""

    model_file: Path
    inputs: tuple[str, ...]
    opset: int
    difference: float
    checkpoint: Path  # the checkpoint folder it was exported from
    temperature: float = 1.0  # the checkpoint's calibration temperature (config.json): probabilities divide by it


class LogitsOnly(nn.Module):
    """The classifier as a function of named tensors to its logits: what the exporter traces."""

    def __init__(self, model: nn.Module, inputs: tuple[str, ...]):
        super().__init__()
        self.model, self.inputs = model, inputs

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return self.model(**{name: given[name] for name in self.inputs}).logits


def missing_packages() -> list[str]:
    """The packages of the `export` extra that are not installed (each imported by name: the export needs them all
    next, and the project's safe-loading rule keeps importlib out of the package)."""
    missing = []
    for name, load in EXPORT_IMPORTS.items():
        try:
            load()
        except ImportError:
            missing.append(name)
    return missing


def _import_onnx() -> None:
    import onnx  # noqa: F401


def _import_onnxruntime() -> None:
    import onnxruntime  # noqa: F401


def _import_onnxscript() -> None:
    import onnxscript  # noqa: F401


EXPORT_IMPORTS = {"onnx": _import_onnx, "onnxruntime": _import_onnxruntime, "onnxscript": _import_onnxscript}


def classifier_folder(checkpoint: Path) -> Path:
    """The checkpoint folder of a fine-tuned sequence classifier: `checkpoint` itself, or a run's checkpoint/."""
    if not checkpoint.is_dir():
        raise UserError(f"CHECKPOINT: no such folder: {checkpoint}")
    folder = checkpoint / CHECKPOINT_DIR if (checkpoint / CHECKPOINT_DIR / "config.json").is_file() else checkpoint
    missing = [name for name in ("config.json", HYPERPARAMETERS_FILE) if not (folder / name).is_file()]
    if missing:
        raise UserError(
            f"CHECKPOINT: {folder} is not a fine-tuned checkpoint (no {' or '.join(missing)}): export takes the "
            "checkpoint/ folder `finetune finetune` writes, or its run folder"
        )
    config = load_pretrained(AutoConfig.from_pretrained, str(folder))
    if not is_classifier(config):
        raise UserError(
            f"CHECKPOINT: {folder} is no sequence classifier (config.json's architectures: {config.architectures}); "
            "export writes classification, regression and multi-label classifiers"
        )
    return folder


def output_folder(folder: Path, out: Path | None) -> Path:
    """--out, else onnx/ beside the checkpoint folder; refused when it exists and is not empty."""
    target = out if out is not None else folder.parent / "onnx"
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out: {target} exists and is not an empty folder; choose a new one")
    return target


def run_export(checkpoint: Path, out: Path | None = None, opset: int = DEFAULT_OPSET) -> Exported:
    """Write `checkpoint`'s classifier as model.onnx (with its tokenizer) into `out`; checked against PyTorch."""
    if missing := missing_packages():
        raise UserError(f"finetune export --onnx needs {', '.join(missing)}: {INSTALL_HINT}")
    if opset < OLDEST_OPSET:
        raise UserError(f"--opset: {opset} is older than {OLDEST_OPSET}, the oldest torch's ONNX exporter writes")
    folder = classifier_folder(checkpoint)
    target = output_folder(folder, out)
    model = load_model(AutoModelForSequenceClassification, str(folder)).eval()  # a LoRA adapter merged in
    tokenizer = load_tokenizer(str(folder))
    inputs = tuple(name for name in INPUT_NAMES if name in tokenizer.model_input_names)
    sample = tokenizer(SAMPLE_TEXTS, padding=True, truncation=True, max_length=SAMPLE_LENGTH, return_tensors="pt")
    longest = getattr(backbone_config(model.config), "max_position_embeddings", None)  # the position table's rows
    partial = target.with_name(target.name + ".partial")  # renamed to `target` once complete
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        module = LogitsOnly(model, inputs).eval()
        graph = export_graph(module, [sample[name] for name in inputs], inputs, partial, opset, longest)
        difference = runtime_difference(graph, model, {name: sample[name] for name in inputs})
    except Exception as error:  # the exporter's own errors run to pages: their cause, in one line
        shutil.rmtree(partial, ignore_errors=True)
        cause = str(error.__cause__ or error).strip().splitlines() or [type(error).__name__]
        raise RunFailed(f"torch.onnx.export could not export {folder}'s {type(model).__name__}: {cause[0]}") from None
    if difference > TOLERANCE:
        shutil.rmtree(partial, ignore_errors=True)
        raise RunFailed(f"ONNX Runtime's logits differ from PyTorch's by {difference:.2e} (> {TOLERANCE}): not written")
    tokenizer.save_pretrained(str(partial))
    write_graph_config(folder / "config.json", partial / "config.json")
    shutil.copyfile(folder / HYPERPARAMETERS_FILE, partial / HYPERPARAMETERS_FILE)
    if target.exists():
        target.rmdir()  # empty (output_folder): the complete folder takes its name
    partial.rename(target)
    return Exported(target / MODEL_FILE, inputs, opset, difference, folder, temperature_of(model.config))


def write_graph_config(source: Path, target: Path) -> None:
    """The checkpoint's config.json (labels, temperature) for the graph's folder, without "auto_map": that names code
    files (a mean-pooling head's) the folder does not hold, and AutoTokenizer, which reads config.json, would ask
    whether to run them."""
    config = json.loads(source.read_text(encoding="utf-8"))
    config.pop("auto_map", None)
    target.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export_graph(
    module: nn.Module, sample: list[Tensor], inputs: tuple[str, ...], folder: Path, opset: int, longest: int | None
) -> Path:
    """Trace `module` on `sample` and write the graph to folder/model.onnx, the batch and sequence axes dynamic (the
    sequence up to `longest` tokens, a model's position table: torch.export proves the graph valid up to there)."""
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence") if longest is None else torch.export.Dim("sequence", max=longest)
    path = folder / MODEL_FILE
    # The exporter's notes (torchvision absent, axis names merged, deprecations) are not the user's to act on.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            tuple(sample),
            dynamo=True,
            input_names=list(inputs),
            output_names=["logits"],
            dynamic_shapes={name: {0: batch, 1: sequence} for name in inputs},
            opset_version=opset,
            verbose=False,
        )
    if program is None:  # dynamo=True always returns the program; None only from the old exporter
        raise RunFailed("torch.onnx.export returned no program")
    program.save(str(path))
    return path


def runtime_difference(graph: Path, model: nn.Module, batch: dict[str, Tensor]) -> float:
    """The largest absolute difference between ONNX Runtime's logits for `batch` and the model's own."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {name: tensor.numpy() for name, tensor in batch.items()})
    with torch.no_grad():
        expected = model(**batch).logits
    return float((torch.from_numpy(logits) - expected).abs().max())
