"""A saved mean-pooling classifier loads without finetune: transformers' remote code and sentence-transformers."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.models import mean_pooling, scalar_mix
from finetune.models.heads import load_classifier
from finetune.models.mean_pooling import MeanPoolingForSequenceClassification, mean_over_real_tokens
from finetune.recipes import BackboneConfig, task_config
from finetune.tasks.specs import task_spec
from finetune.training.checkpoints import save_checkpoint
from tests.conftest import custom_task_section, save_tiny_masked_lm, write_task

TEXTS = ["a fine film", "the plot drags on and the actors seem tired"]

# Run in a fresh interpreter (one for all the folders: each start costs seconds): loads each folder with transformers
# alone (and sentence-transformers when installed), prints the logits and embeddings of TEXTS (a padded batch), and
# whether finetune was imported on the way.
LOAD_WITHOUT_FINETUNE = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
folders, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    from sentence_transformers import SentenceTransformer
except ImportError:
    SentenceTransformer = None
loaded = {}
for folder in folders:
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    batch = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits.tolist()
    embeddings = None
    if SentenceTransformer is not None:
        embeddings = SentenceTransformer(folder, trust_remote_code=True, device="cpu").encode(texts).tolist()
    loaded[folder] = {"logits": logits, "embeddings": embeddings, "class": type(model).__module__}
imported = sorted(name for name in sys.modules if name.split(".")[0] == "finetune")
print(json.dumps({"loaded": loaded, "imported": imported}))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A saved mean-pooling classifier on a tiny BERT, with and without the scalar mix, as the stage saves it."""
    root = tmp_path_factory.mktemp("mean-pooling-export")
    pretrained = save_tiny_masked_lm(root / "lm")
    spec = task_spec(task_config(**custom_task_section(write_task(root / "task"))))
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    saved = {}
    for pooling in ("mean", "scalar_mix"):
        torch.manual_seed(0)
        model = load_classifier(BackboneConfig(checkpoint=str(pretrained)), spec, None, pooling)
        if model.scalar_mix is not None:  # not the plain mean of every layer it starts as
            model.scalar_mix.layer_weights.data = torch.tensor([0.5, -1.0, 2.0])
        saved[pooling] = save_checkpoint(model, tokenizer, root / pooling)
    return saved


def _reference(folder: Path) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Our logits for TEXTS as one padded batch, and the pooled states of each text alone."""
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert isinstance(model, MeanPoolingForSequenceClassification)  # the package's class, not the folder's copy
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits
        pooled = []
        for text in TEXTS:
            single = tokenizer([text], return_tensors="pt")
            states = model.token_states(single["input_ids"], single["attention_mask"])
            pooled.append(mean_over_real_tokens(states, single["attention_mask"])[0])
    return logits, pooled


def test_the_written_files_are_the_package_modules_and_import_no_finetune(checkpoints):
    folder = checkpoints["mean"]
    for module in (mean_pooling, scalar_mix):
        assert module.__file__ is not None
        written = folder / Path(module.__file__).name
        assert written.read_bytes() == Path(module.__file__).read_bytes()  # copied at save: one source, no drift
        for node in ast.walk(ast.parse(written.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not any(name.split(".")[0] == "finetune" for name in names), (written.name, names)
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "mean_pooling.MeanPoolingConfig",
        "AutoModel": "mean_pooling.MeanPoolingEncoder",
        "AutoModelForSequenceClassification": "mean_pooling.MeanPoolingForSequenceClassification",
    }
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    assert [module["path"] for module in json.loads((folder / "modules.json").read_text())] == ["", "1_Pooling"]


@pytest.fixture(scope="module")
def loaded_without_finetune(checkpoints, tmp_path_factory) -> dict:
    """Both checkpoints loaded in one process that never imports finetune."""
    where = tmp_path_factory.mktemp("without-finetune")
    environment = {**os.environ, "HF_MODULES_CACHE": str(where / "modules"), "HF_HUB_OFFLINE": "1"}
    folders = [str(checkpoints[pooling]) for pooling in ("mean", "scalar_mix")]
    finished = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_FINETUNE, json.dumps(folders), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=where,  # not the checkout: nothing of finetune's on the path by accident
        env=environment,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pooling", ["mean", "scalar_mix"])
@pytest.mark.slow
def test_a_process_without_finetune_loads_the_same_classifier(checkpoints, loaded_without_finetune, pooling):
    folder = checkpoints[pooling]
    assert loaded_without_finetune["imported"] == []
    loaded = loaded_without_finetune["loaded"][str(folder)]
    assert loaded["class"].startswith("transformers_modules.")  # the folder's copy of mean_pooling.py
    logits, pooled = _reference(folder)
    torch.testing.assert_close(torch.tensor(loaded["logits"]), logits, rtol=1e-5, atol=1e-5)
    if loaded["embeddings"] is None:
        pytest.skip("sentence-transformers is not installed: the SentenceTransformer(folder) half did not run")
    torch.testing.assert_close(torch.tensor(loaded["embeddings"]), torch.stack(pooled), rtol=1e-5, atol=1e-5)


def test_a_checkpoint_saved_before_the_remote_code_loads_after_import_finetune(checkpoints, tmp_path):
    old = shutil.copytree(checkpoints["scalar_mix"], tmp_path / "old")
    for name in ("mean_pooling.py", "scalar_mix.py", "modules.json", "sentence_bert_config.json"):
        (old / name).unlink()
    shutil.rmtree(old / "1_Pooling")
    config = json.loads((old / "config.json").read_text())
    del config["auto_map"]
    (old / "config.json").write_text(json.dumps(config))
    torch.testing.assert_close(_reference(old)[0], _reference(checkpoints["scalar_mix"])[0])
