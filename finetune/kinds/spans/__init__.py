"""Task kind spans: extractive question answering, an answer cut from a context (SQuAD JSON files).

No imports: see finetune/kinds/__init__.py."""
