"""Task kind regression: a real-valued score per example (STS-B; a custom task without labels).

No imports: see finetune/kinds/__init__.py."""
