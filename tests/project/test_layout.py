"""tests/ mirrors the package: a folder of tests per package folder of finetune/, named after it, and the few
folders for what is not a package (the project's own rules, the wheel, the benchmarks)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_PACKAGES = {"project", "packaging", "bench"}  # the tree's own rules, the built wheel, bench/'s shared code


def folders(root: Path) -> set[str]:
    return {path.name for path in root.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}


def test_every_test_folder_is_named_after_a_package_folder():
    packages, tests = folders(ROOT / "finetune"), folders(ROOT / "tests")
    assert {"kinds", "commands", "inference"} <= packages
    assert tests - NOT_PACKAGES <= packages, "a folder of tests named after no package folder of finetune/"
    assert packages <= tests, "a package folder of finetune/ without its folder of tests"


def test_test_files_live_in_their_folders():
    """No test file at the top of tests/: only the shared fixtures and helpers (conftest, tiny_families, ...)."""
    assert sorted(path.name for path in (ROOT / "tests").glob("test_*.py")) == []
