"""The release a user installs: `python -m build` makes an sdist and a wheel that both carry the recipes, and the
wheel, installed into a fresh venv, runs `finetune` from a folder outside the checkout with its own recipes.

Cheap by construction (about 20 s on 2 cores): the build runs without isolation (this venv's setuptools, no
download) on a copy of the sources, so the checkout gets no build/ or egg-info; the fresh venv has no pip and no
dependencies of its own: the wheel goes in with this interpreter's pip (`--python`, `--no-deps`), then a .pth file puts
this interpreter's site-packages (torch, transformers, ...) after the venv's own. Python reads the .pth files of site
folders only, not of folders a .pth adds, so this venv's editable finetune (its finder's .pth) is not seen: the
finetune imported is the wheel's, which the tests assert.

What "validating every shipped recipe" means there, without training: every recipe loads and validates from the
wheel's copy (keys, types, values; `load_recipe(..., check_paths=False)`), and every input it reads from the
repository's data/ exists, with the working folder a temporary one where data/ is a link to the checkout's: a
recipe's relative paths are read from the folder the command runs in, installed or not, and data/ is what a user
of the repository has beside it. The inputs elsewhere (../shared/data, a hub checkpoint, a run made by another
recipe) are the reader's to bring; test_recipes.py checks no more in the checkout. One recipe also goes through the
CLI by name with every path checked: `finetune profile quickstart/pretrain` validates it fully (its corpus files
included) and builds its model on the meta device, reading and writing nothing else.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from finetune import __version__
from finetune.recipes import RECIPE_TYPES
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # a wheel and an sdist built and installed (make test-slow; CI runs it too)


def _major_version(distribution: str) -> int:
    try:
        return int(importlib.metadata.version(distribution).split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


if importlib.util.find_spec("build") is None:
    pytest.skip(
        "the wheel is built with `python -m build`, not installed here: pip install -e '.[dev]'",
        allow_module_level=True,
    )
if _major_version("setuptools") < 77:  # pyproject.toml's build-system.requires, which the build takes from here
    pytest.skip(
        "the build runs without isolation: it needs setuptools>=77 here: pip install -e '.[dev]'",
        allow_module_level=True,
    )
# Asked of the installed distributions, not with find_spec("pip"): setuptools' distutils shim takes a lookup of pip
# for pip's import and switches itself off, and torch.compile's later `import setuptools` in this process then fails.
if _major_version("pip") == 0:
    pytest.skip("the wheel is installed with this interpreter's pip (--python): it has none", allow_module_level=True)

SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "finetune", "recipes")
RECIPES = sorted(path.relative_to(REPO_ROOT / "recipes").as_posix() for path in (REPO_ROOT / "recipes").rglob("*.yaml"))
TIMEOUT = 120  # seconds for one step; each takes a few


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False, **kwargs)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return result


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of the sources (the files the sdist is made of)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)])
    return {"sdist": out / f"finetune-{__version__}.tar.gz", "wheel": out / f"finetune-{__version__}-py3-none-any.whl"}


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed and this venv's site-packages behind its own."""
    folder = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", str(folder)])
    python = folder / "bin" / "python"
    # Installed before the .pth below exists, so that pip sees an empty environment (and no finetune to replace).
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(dists["wheel"]),
        ]
    )
    site_packages = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    )
    ours = [folder for folder in [*site.getsitepackages(), site.getusersitepackages()] if Path(folder).is_dir()]
    (site_packages / "dependencies.pth").write_text("".join(f"{folder}\n" for folder in ours), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory) -> Path:
    """A working folder outside the checkout with the repository's data/ beside it, as a user of both has it."""
    folder = tmp_path_factory.mktemp("elsewhere")
    (folder / "data").symlink_to(REPO_ROOT / "data", target_is_directory=True)
    return folder


def in_venv(venv: Path, elsewhere: Path, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    """A command of the venv (finetune, python) run in `elsewhere`, the checkout kept off its path."""
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    environment.update(PYTHONNOUSERSITE="1", COLUMNS="400", OMP_NUM_THREADS="1")
    arguments = [str(venv / "bin" / command[0]), *command[1:]]
    if check:
        return run(arguments, cwd=elsewhere, env=environment)
    return subprocess.run(
        arguments, cwd=elsewhere, env=environment, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def test_the_sdist_carries_the_recipes_and_the_build_hook(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        names = sdist.getnames()
    top = f"finetune-{__version__}"
    shipped = [name.removeprefix(f"{top}/recipes/") for name in names if name.startswith(f"{top}/recipes/")]
    assert sorted(name for name in shipped if name.endswith(".yaml")) == RECIPES
    assert {f"{top}/setup.py", f"{top}/MANIFEST.in", f"{top}/finetune/recipes/shipped.py"} <= set(names)


def test_the_wheel_carries_the_recipes_as_package_data(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        prefix = "finetune/shipped_recipes/"
        assert sorted(name.removeprefix(prefix) for name in names if name.startswith(prefix)) == RECIPES
        assert (
            wheel.read(prefix + "quickstart/finetune.yaml")
            == (REPO_ROOT / "recipes/quickstart/finetune.yaml").read_bytes()
        )
    assert not any(name.startswith(("recipes/", "tests/")) for name in names)


def test_the_installed_wheel_runs_from_anywhere_with_its_own_recipes(venv, elsewhere):
    help_text = in_venv(venv, elsewhere, "finetune", "--help").stdout
    assert "pretrain" in help_text and "recipes" in help_text
    assert in_venv(venv, elsewhere, "finetune", "--version").stdout.strip() == f"finetune {__version__}"
    listed = in_venv(venv, elsewhere, "finetune", "recipes").stdout.splitlines()  # piped: tab-separated
    assert listed[0] == "recipe\tstage\tdescription"
    assert sorted(line.split("\t")[0] for line in listed[1:]) == sorted(name.removesuffix(".yaml") for name in RECIPES)
    assert all(line.split("\t")[1] in RECIPE_TYPES for line in listed[1:])


def test_every_shipped_recipe_validates_from_the_wheel(venv, elsewhere):
    script = """
import json
from pathlib import Path

import finetune
from finetune.recipes import input_path_problems, load_recipe
from finetune.recipes.shipped import recipes_root, shipped_recipes

checked = {}
for name, path in shipped_recipes().items():
    recipe = load_recipe(path, check_paths=False)
    problems = [problem for _, missing, problem in input_path_problems(recipe) if Path(missing).parts[:1] == ("data",)]
    checked[name] = {"stage": recipe.stage, "first_line": path.read_text().splitlines()[0], "problems": problems}
print(json.dumps({"finetune": finetune.__file__, "root": str(recipes_root()), "recipes": checked}))
"""
    report = json.loads(in_venv(venv, elsewhere, "python", "-c", script).stdout)
    assert Path(report["finetune"]).is_relative_to(venv), report["finetune"]  # the wheel's, not the checkout's
    assert Path(report["root"]) == Path(report["finetune"]).parent / "shipped_recipes"
    assert sorted(report["recipes"]) == sorted(name.removesuffix(".yaml") for name in RECIPES)
    for name, checked in report["recipes"].items():
        assert checked["problems"] == [], name
        assert checked["first_line"] == f"# finetune {checked['stage']} recipes/{name}.yaml"


def test_a_recipe_by_name_runs_through_the_cli_of_the_wheel(venv, elsewhere):
    profile = json.loads(
        in_venv(venv, elsewhere, "finetune", "profile", "quickstart/pretrain", "--json", "--matmul-gflops", "10").stdout
    )
    assert profile["recipe"] == "quickstart/pretrain" and profile["parameters"]["total"] > 0
    refused = in_venv(venv, elsewhere, "finetune", "finetune", "finetune/minilm-sst2-lorra", check=False)
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(
        "error: recipe finetune/minilm-sst2-lorra: no such file, nor a shipped recipe of that name; did you mean "
        "finetune/minilm-sst2-lora"
    )
    in_venv(venv, elsewhere, "finetune", "recipes", "copy", "quickstart/finetune", "mine.yaml")
    copied = (elsewhere / "mine.yaml").read_text(encoding="utf-8").splitlines()
    assert copied[0] == "# finetune finetune mine.yaml"
    assert copied[1:] == (REPO_ROOT / "recipes/quickstart/finetune.yaml").read_text(encoding="utf-8").splitlines()[1:]
