"""The version of finetune, in one place: the package, its run folders and pyproject.toml read it here."""

__version__ = "0.2.0"
