"""The one build step pyproject.toml cannot declare: the top-level recipes/ shipped inside the package.

The repository keeps a single copy of the recipes at recipes/, where commands, docs and each recipe's first line name
them (`finetune finetune recipes/...`); setuptools' package data must lie inside a package folder, and mapping
recipes/ to a package of its own makes every subfolder a would-be package it warns about. So build_py copies them into
the wheel as finetune/shipped_recipes/ (finetune/recipes/shipped.py finds them there, or at recipes/ in a checkout),
and MANIFEST.in puts recipes/ into the sdist the wheel is built from. Everything else is in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RECIPES = Path("recipes")  # relative: setuptools runs this file in the project's root (a checkout's or an sdist's)
SHIPPED = ("finetune", "shipped_recipes")  # finetune/recipes/shipped.py's PACKAGED_FOLDER


class BuildPyWithRecipes(build_py):
    """build_py that also copies recipes/**/*.yaml to finetune/shipped_recipes/ in the build."""

    def _recipe_files(self) -> dict[str, str]:
        """Built file -> source file."""
        target = Path(self.build_lib, *SHIPPED)
        return {str(target / path.relative_to(RECIPES)): str(path) for path in sorted(RECIPES.rglob("*.yaml"))}

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads recipes/ where it is (or links it: get_output_mapping)
            return
        for built, source in self._recipe_files().items():
            self.mkpath(str(Path(built).parent))
            self.copy_file(source, built)

    # Both name the copies, so that the wheel lists them and a strict editable install links them.
    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *self._recipe_files()]

    def get_output_mapping(self) -> dict[str, str]:
        return {**super().get_output_mapping(), **self._recipe_files()}


setup(cmdclass={"build_py": BuildPyWithRecipes})
