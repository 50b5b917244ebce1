"""Allow `python -m finetune ...`."""

from finetune.cli import app

app()
