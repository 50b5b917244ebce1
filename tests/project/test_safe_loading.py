"""Safe loading: weights only from safetensors or weights-only torch.load, YAML with the safe loader, no code from
checkpoints unless a recipe says trust_remote_code, no import paths from recipes.

The source scan fails on a regression anywhere in the package, not only in the places tested today.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.recipes import BackboneConfig, EvalRecipe, FinetuneRecipe, task_config
from finetune.tasks.specs import task_spec
from tests.conftest import REPO_ROOT, custom_task_section, finetune_recipe, save_tiny_masked_lm, write_yaml

PACKAGE = REPO_ROOT / "finetune"

# ---------------------------------------------------------------------------------------------
# The source scan
# ---------------------------------------------------------------------------------------------

# module.function calls that can run code from a file or a string.
FORBIDDEN_CALLS = {
    ("yaml", "load"),
    ("yaml", "load_all"),
    ("yaml", "unsafe_load"),
    ("yaml", "unsafe_load_all"),
    ("yaml", "full_load"),
    ("yaml", "full_load_all"),
    ("pickle", "load"),
    ("pickle", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("joblib", "load"),
    ("importlib", "import_module"),
}
FORBIDDEN_NAMES = {"eval", "exec", "__import__"}  # builtins that run strings or import by name
# Attributes whose mere use means an unsafe loader or loading path.
FORBIDDEN_ATTRIBUTES = {"UnsafeLoader", "FullLoader", "register_for_checkpointing"}


def package_sources() -> list[Path]:
    """Every Python file of the package."""
    return sorted(PACKAGE.rglob("*.py"))


def calls(tree: ast.AST) -> list[ast.Call]:
    """Every call in a syntax tree."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def dotted_name(node: ast.AST) -> str:
    """`torch.load` for the call torch.load(...); '' for calls that are not plain names or attributes."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted_name(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def keyword(call: ast.Call, name: str):
    """The constant value of a keyword argument; `...` when it is absent, a string when it is not a constant."""
    for item in call.keywords:
        if item.arg == name:
            return item.value.value if isinstance(item.value, ast.Constant) else "<not a constant>"
    return ...


def unsafe_uses(path: Path) -> list[str]:
    """Every unsafe loading construct in one source file, as 'file:line: what'."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    label = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name
    where = lambda node: f"{label}:{node.lineno}"
    problems = []
    for call in calls(tree):
        name = dotted_name(call.func)
        parts = tuple(name.rsplit(".", 1)) if "." in name else (name,)
        if name == "torch.load" and keyword(call, "weights_only") is not True:
            problems.append(f"{where(call)}: torch.load without weights_only=True")
        if len(parts) == 2 and parts in FORBIDDEN_CALLS:
            problems.append(f"{where(call)}: {name}")
        if name in FORBIDDEN_NAMES:
            problems.append(f"{where(call)}: {name}()")
        if keyword(call, "weights_only") is False:
            problems.append(f"{where(call)}: weights_only=False")
        if keyword(call, "allow_pickle") is True:
            problems.append(f"{where(call)}: allow_pickle=True")
        if keyword(call, "trust_remote_code") is True:
            problems.append(f"{where(call)}: trust_remote_code=True (it must come from a recipe)")
        if keyword(call, "safe_serialization") is False:
            problems.append(f"{where(call)}: safe_serialization=False (weights are written as safetensors)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            problems.append(f"{where(node)}: {dotted_name(node) or node.attr}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            if any(module.split(".")[0] in ("pickle", "dill", "joblib", "importlib") for module in modules):
                problems.append(f"{where(node)}: imports {', '.join(filter(None, modules))}")
    return problems


def test_the_scan_catches_each_unsafe_construct(tmp_path):
    """The scanner itself: a file holding every forbidden construct is caught on each of its lines."""
    sample = tmp_path / "sample.py"
    lines = [
        "import pickle, importlib, torch, yaml, numpy",
        "torch.load('a.pt')",
        "torch.load('a.pt', weights_only=False)",
        "yaml.load(open('a'))",
        "yaml.unsafe_load('a')",
        "yaml.safe_load('a', Loader=yaml.FullLoader)",
        "pickle.loads(b'')",
        "importlib.import_module('os')",
        "eval('1')",
        "numpy.load('a.npy', allow_pickle=True)",
        "AutoModel.from_pretrained('x', trust_remote_code=True)",
        "model.save_pretrained('x', safe_serialization=False)",
        "accelerator.register_for_checkpointing(thing)",
    ]
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    found = unsafe_uses(sample)
    assert {int(problem.split(":")[1]) for problem in found} == set(range(1, len(lines) + 1)), found


def test_package_sources_use_only_safe_loading():
    sources = package_sources()
    assert len(sources) > 30, "the scan found too few files to mean anything"
    problems = [problem for path in sources for problem in unsafe_uses(path)]
    assert not problems, "unsafe loading:\n" + "\n".join(problems)
    # The scan reads real code: it sees the safe loading the package does. Recipes are read by finetune/safe_yaml.py,
    # whose loader is a subclass of yaml.SafeLoader.
    loader_bases = {
        dotted_name(base)
        for node in ast.walk(ast.parse((PACKAGE / "safe_yaml.py").read_text()))
        if isinstance(node, ast.ClassDef)
        for base in node.bases
    }
    assert "yaml.SafeLoader" in loader_bases
    assert any(
        dotted_name(call.func) == "load_yaml"
        for call in calls(ast.parse((PACKAGE / "recipes" / "loader.py").read_text()))
    )


# ---------------------------------------------------------------------------------------------
# YAML tags that would run code
# ---------------------------------------------------------------------------------------------

runner = CliRunner()


def assert_one_line_error(result, *fragments: str) -> str:
    output = result.output.strip()
    assert result.exit_code == 2, result.output[-2000:]
    assert "Traceback" not in result.output, result.output
    assert output.startswith("error: ") and "\n" not in output, output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in {output!r}"
    return output


@pytest.mark.parametrize(
    "tag", ["!!python/object/apply:os.system", "!!python/object/new:os.system", "!!python/name:os.system"]
)
def test_a_recipe_with_a_python_tag_is_refused_without_running_it(tmp_path, monkeypatch, tag):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "the-tag-ran"
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(
        f'stage: finetune\nrun_dir: {tmp_path / "run"}\ndescription: {tag} ["touch {marker}"]\n', encoding="utf-8"
    )
    assert_one_line_error(runner.invoke(app, ["finetune", str(recipe)]), "evil.yaml", "invalid YAML")
    assert not marker.exists()
    assert not (tmp_path / "run").exists()


def test_a_python_tag_in_an_override_stays_text(tmp_path, task_dir):
    """Overrides are parsed with the safe loader too: a tag is not run, and the value is refused by its key."""
    marker = tmp_path / "the-tag-ran"
    data = finetune_recipe(tmp_path / "no-checkpoint", task_dir, tmp_path / "run")
    recipe = write_yaml(tmp_path / "recipe.yaml", data)
    override = f"training.lr=!!python/object/apply:os.system ['touch {marker}']"
    result = runner.invoke(app, ["finetune", str(recipe), override])
    assert_one_line_error(result, "training.lr")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# trust_remote_code: off unless a recipe turns it on, and then passed to every from_pretrained
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pretrained")
    return save_tiny_masked_lm(folder, layers=1, hidden=16)


def test_recipes_do_not_trust_remote_code_by_default(tmp_path, task_dir):
    finetune = FinetuneRecipe.model_validate(finetune_recipe(tmp_path / "ckpt", task_dir, tmp_path / "run"))
    assert finetune.model.trust_remote_code is False
    evaluation = EvalRecipe.model_validate(
        {"stage": "eval", "run_dir": str(tmp_path / "run"), "task": custom_task_section(task_dir), "models": {"a": "b"}}
    )
    assert evaluation.trust_remote_code is False


@pytest.mark.parametrize("trusted", [False, True])
def test_trust_remote_code_reaches_every_from_pretrained_as_set(checkpoint, task_dir, monkeypatch, trusted):
    """Every transformers load of a stage gets trust_remote_code explicitly, and True only when the recipe says so."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from finetune.models.heads import load_classifier, load_finetuned
    from finetune.models.hub import load_tokenizer

    seen: list[tuple[str, object]] = []

    def recording(cls):
        original = cls.from_pretrained.__func__

        def from_pretrained(klass, name, *args, **kwargs):
            seen.append((cls.__name__, kwargs.get("trust_remote_code", "<not passed>")))
            return original(klass, name, *args, **kwargs)  # the tiny checkpoint ships no code: True runs nothing

        monkeypatch.setattr(cls, "from_pretrained", classmethod(from_pretrained))

    for cls in (AutoConfig, AutoModelForSequenceClassification, AutoTokenizer):
        recording(cls)
    spec = task_spec(task_config(**custom_task_section(task_dir)))
    load_classifier(BackboneConfig(checkpoint=str(checkpoint), trust_remote_code=trusted), spec, None)
    load_tokenizer(str(checkpoint), trust_remote_code=trusted)
    with pytest.raises(UserError):  # a language model is no fine-tuned classifier: the label check refuses it
        load_finetuned(str(checkpoint), spec, trust_remote_code=trusted)
    classes = {name for name, _ in seen}
    assert classes == {"AutoConfig", "AutoModelForSequenceClassification", "AutoTokenizer"}, seen
    assert all(value is trusted for _, value in seen), seen


def checkpoint_with_code(folder: Path, marker: Path) -> Path:
    """A model folder whose config points transformers at Python code in the folder; importing it leaves a marker."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "sneaky",
                "auto_map": {
                    "AutoConfig": "sneaky.SneakyConfig",
                    "AutoModelForSequenceClassification": "sneaky.SneakyModel",
                    "AutoTokenizer": ["sneaky.SneakyTokenizer", None],
                },
            }
        ),
        encoding="utf-8",
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["sneaky.SneakyTokenizer", None]}}), encoding="utf-8"
    )
    (folder / "sneaky.py").write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("stage", ["finetune", "eval"])
def test_a_checkpoint_with_code_is_refused_unless_trusted(tmp_path, task_dir, stage):
    marker = tmp_path / "the-code-ran"
    model = checkpoint_with_code(tmp_path / "sneaky-model", marker)
    if stage == "finetune":
        data = finetune_recipe(model, task_dir, tmp_path / "run")
        key = "model.checkpoint"
    else:
        data = {
            "stage": "eval",
            "run_dir": str(tmp_path / "run"),
            "task": custom_task_section(task_dir),
            "models": {"sneaky": str(model)},
            "device": "cpu",
        }
        key = "models.sneaky"
    result = runner.invoke(app, [stage, str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert_one_line_error(result, key, "sneaky-model", "trust_remote_code")
    assert not marker.exists(), "the checkpoint's code ran without trust_remote_code"
    assert not (tmp_path / "run").exists()
