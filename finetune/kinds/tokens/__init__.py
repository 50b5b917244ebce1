"""Task kind tokens: a tag per word (named entities, parts of speech), from CoNLL column files.

No imports: see finetune/kinds/__init__.py."""
