"""Task kind choices: the right answer among each question's choices (ARC's JSON Lines layout).

No imports: see finetune/kinds/__init__.py."""
