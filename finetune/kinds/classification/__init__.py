"""Task kind classification: a class per example, from its text or sentence pair.

No imports: see finetune/kinds/__init__.py."""
