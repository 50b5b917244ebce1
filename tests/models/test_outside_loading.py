"""Every fine-tuned checkpoint loads outside the toolkit the way docs/finetuning.md says, with `finetune predict`'s
predictions: each head (the family's own, mean pooling, the scalar mix) x adapter (none, LoRA) x export (the folder,
peft on its base, `finetune merge`'s folder, `finetune export --onnx`'s graph: EXPORTED), in a process that never
imports finetune. The wrong way (peft on the family's own head for an adapter trained on mean pooling) fails loudly
instead of predicting at chance with a warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from finetune.cli import app
from tests.conftest import finetune_recipe, write_task, write_yaml
from tests.tiny_families import save_tiny_checkpoint

pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
pytestmark = pytest.mark.slow  # fresh interpreters that never import finetune (make test-slow; CI runs it too)

runner = CliRunner()
TEXTS = ["the film was really great .", "the plot was so dull .", "a cast that was quite awful"]
# The base each head trains on: a masked LM (the toolkit's own pretraining writes one; its weights are named "bert.")
# and a bare encoder (a sentence-embedding checkpoint such as all-MiniLM-L6-v2, its weights unprefixed).
BASES = {"model": "masked_lm", "mean": "base", "scalar_mix": "masked_lm"}
ADAPTERS = ("none", "lora")

# Run in a fresh interpreter: each case {name: [way, folder, base]} loaded outside the toolkit and run on TEXTS as one
# padded batch; prints {name: {"logits": ...} or {"error": its class and first line}} and the finetune modules
# imported on the way (none: transformers, peft and ONNX Runtime alone).
LOAD_OUTSIDE = """
import json, sys
import onnxruntime, torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

cases, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])

def run(model, folder):
    batch = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval()(**batch).logits.tolist()

def folder(path, base):  # a whole checkpoint, or finetune merge's folder
    return run(AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True), path)

def peft(path, base):  # docs/finetuning.md: the adapter's config.json names the head it was trained on
    from peft import PeftModel
    config = AutoConfig.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForSequenceClassification.from_pretrained(base, config=config, trust_remote_code=True)
    return run(PeftModel.from_pretrained(model, path), path)

def peft_on_the_familys_head(path, base):  # right for the family's own head alone
    from peft import PeftModel
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    return run(PeftModel.from_pretrained(model, path), path)

def onnx(path, base):
    session = onnxruntime.InferenceSession(path + "/model.onnx", providers=["CPUExecutionProvider"])
    batch = AutoTokenizer.from_pretrained(path)(texts, padding=True, return_tensors="np")
    inputs = {graph_input.name: batch[graph_input.name] for graph_input in session.get_inputs()}
    return session.run(["logits"], inputs)[0].tolist()

ways = {"folder": folder, "peft": peft, "peft_on_the_familys_head": peft_on_the_familys_head, "onnx": onnx}
results = {}
for case, (way, path, base) in cases.items():
    try:
        results[case] = {"logits": ways[way](path, base)}
    except Exception as error:
        results[case] = {"error": type(error).__name__ + ": " + str(error).splitlines()[0]}
imported = sorted(name for name in sys.modules if name.split(".")[0] == "finetune")
print(json.dumps({"results": results, "imported": imported}))
"""


def invoke(*arguments: str) -> str:
    result = runner.invoke(app, list(arguments))
    assert result.exit_code == 0, result.output
    return result.output


def train(root: Path, base: Path, task: Path, head: str, adapter: str) -> Path:
    """A few steps at a high rate, so that the head and the LoRA matrices are far from where they started."""
    data = finetune_recipe(base, task, root / f"{head}-{adapter}")
    data.update(pooling=head, keep_best=False, unfreezing={"mode": "none"})
    data["training"].update(max_steps=4, lr=5e-3)
    if adapter == "lora":
        data["model"]["adapter"] = {"rank": 4, "alpha": 8.0, "dropout": 0.0}
    invoke("finetune", str(write_yaml(root / f"{head}-{adapter}.yaml", data)))
    return root / f"{head}-{adapter}" / "checkpoint"


def predicted_probabilities(checkpoint: Path, texts_file: Path) -> list[list[float]]:
    output = invoke("predict", str(checkpoint), "--input", str(texts_file))
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [[row["probabilities"][label] for label in ("0", "1")] for row in rows]


# The ONNX graph of every head, and of an adapter (exported merged: the same graph as its merged folder's) once.
EXPORTED = {(head, "none") for head in BASES} | {("mean", "lora")}


def ways_to_load(head: str, adapter: str) -> list[str]:
    onnx = ["onnx"] if (head, adapter) in EXPORTED else []
    if adapter == "none":
        return ["folder", *onnx]
    return ["merged", "peft", "peft_on_the_familys_head", *onnx]


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> dict:
    """Every head x adapter trained on a tiny BERT, exported every way, loaded in one process without finetune."""
    root = tmp_path_factory.mktemp("outside")
    task, texts_file = write_task(root / "task"), root / "texts.txt"
    texts_file.write_text("\n".join(TEXTS) + "\n")
    bases = {kind: save_tiny_checkpoint(root / f"bert-{kind}", "bert", head=kind) for kind in set(BASES.values())}
    cases, expected, checkpoints = {}, {}, {}
    for head, base_kind in BASES.items():
        base = bases[base_kind]
        for adapter in ADAPTERS:
            checkpoint = checkpoints[head, adapter] = train(root, base, task, head, adapter)
            expected[head, adapter] = predicted_probabilities(checkpoint, texts_file)
            folders = {"folder": checkpoint, "peft": checkpoint, "peft_on_the_familys_head": checkpoint}
            folders["onnx"] = root / f"{head}-{adapter}-onnx"
            if (head, adapter) in EXPORTED:
                invoke("export", str(checkpoint), "--onnx", "--out", str(folders["onnx"]))
            if adapter == "lora":
                folders["merged"] = root / f"{head}-{adapter}-merged"
                invoke("merge", str(checkpoint), str(folders["merged"]))
            for way in ways_to_load(head, adapter):
                loader = "folder" if way == "merged" else way
                cases[f"{head}-{adapter}-{way}"] = [loader, str(folders[way]), str(base)]
    command = [sys.executable, "-c", LOAD_OUTSIDE, json.dumps(cases), json.dumps(TEXTS)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=root, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    loaded = json.loads(completed.stdout.splitlines()[-1])
    assert loaded["imported"] == []
    return {"results": loaded["results"], "expected": expected, "checkpoints": checkpoints}


def softmax(logits: list[list[float]]) -> list[list[float]]:
    return torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=-1).tolist()


WORKING = [
    (head, adapter, way)
    for head in BASES
    for adapter in ADAPTERS
    for way in ways_to_load(head, adapter)
    if way != "peft_on_the_familys_head" or head == "model"
]


@pytest.mark.parametrize(("head", "adapter", "way"), WORKING)
def test_loaded_outside_it_predicts_as_finetune_predict(outside, head, adapter, way):
    result = outside["results"][f"{head}-{adapter}-{way}"]
    assert "logits" in result, result
    expected = outside["expected"][head, adapter]
    for loaded, ours in zip(softmax(result["logits"]), expected, strict=True):
        assert loaded == pytest.approx(ours, abs=1e-5)


@pytest.mark.parametrize("head", ["mean", "scalar_mix"])
def test_peft_on_the_familys_own_head_refuses_an_adapter_trained_on_mean_pooling(outside, head):
    """AutoModelForSequenceClassification.from_pretrained(BASE, num_labels=2) builds the family's own classifier,
    whose modules are named otherwise ("bert.encoder...", not "encoder.encoder..."): adapter_config.json names the
    adapted modules in full, so peft stops, where it used to warn and leave the model at chance."""
    result = outside["results"][f"{head}-lora-peft_on_the_familys_head"]
    assert "logits" not in result
    assert "No modules were targeted for adaptation" in result["error"], result


@pytest.mark.parametrize("head", list(BASES))
def test_the_model_cards_peft_code_loads_the_adapter_as_trained(outside, head):
    """The card of an adapter checkpoint (README.md in it) shows how to load it with peft; run as written."""
    checkpoint = outside["checkpoints"][head, "lora"]
    card = (checkpoint / "README.md").read_text()
    code = card.split("with peft:")[1].split("```python\n")[1].split("```")[0]
    namespace: dict = {}
    exec(code.replace("PATH_TO_THIS_FOLDER", str(checkpoint)), namespace)
    batch = namespace["tokenizer"](TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = namespace["model"].eval()(**batch).logits.tolist()
    for loaded, ours in zip(softmax(logits), outside["expected"][head, "lora"], strict=True):
        assert loaded == pytest.approx(ours, abs=1e-5)
