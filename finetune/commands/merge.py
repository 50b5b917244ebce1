"""`finetune merge`: a LoRA adapter checkpoint merged into its base, written as a plain Hugging Face model folder.

Each adapted weight becomes W + (alpha / rank) B A (peft's `merge_and_unload`) and the head the adapter file holds
replaces the base's; the folder then loads with `AutoModelFor*.from_pretrained` and no peft, and serves as the
base of a new adapter or a full fine-tuning. The tokenizer and finetune_recipe.yaml come along, so predict and eval
read examples as the adapter's run did.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import AutoConfig

from finetune.console import console
from finetune.errors import InputError, UserError, recipe_key
from finetune.models.hub import load_pretrained, load_tokenizer, resolve_checkpoint
from finetune.models.loading import ADAPTER_CONFIG_FILE, is_adapter_checkpoint, load_adapter_checkpoint, trained_class
from finetune.training.checkpoints import HYPERPARAMETERS_FILE, save_checkpoint


def run_merge(checkpoint: str, output: Path) -> Path:
    """Write `checkpoint`'s base with its adapter merged in to the new folder `output`; returns it."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UserError(f"OUTPUT: {output} exists and is not an empty folder; choose a new one")
    with recipe_key("CHECKPOINT"):
        folder = resolve_checkpoint(checkpoint)
        if not is_adapter_checkpoint(folder):
            raise InputError(
                f"{checkpoint} holds no LoRA adapter (no {ADAPTER_CONFIG_FILE}): it is a whole model already, "
                "loadable as it is",
                value=checkpoint,
            )
        stored = load_pretrained(AutoConfig.from_pretrained, folder)
        model = load_adapter_checkpoint(trained_class(stored, folder), folder)
        tokenizer = load_tokenizer(folder)
    model.config._name_or_path = ""  # not the adapter's folder: the merged model stands alone
    save_checkpoint(model, tokenizer, output)
    recipe = Path(folder) / HYPERPARAMETERS_FILE
    if recipe.is_file():
        shutil.copy2(recipe, output / HYPERPARAMETERS_FILE)
    console.print(
        f"{type(model).__name__} with the adapter of {checkpoint} merged in, saved to {output}", soft_wrap=True
    )
    return output
