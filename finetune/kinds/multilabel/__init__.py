"""Task kind multilabel: any number of labels per example, a sigmoid each.

No imports: see finetune/kinds/__init__.py."""
