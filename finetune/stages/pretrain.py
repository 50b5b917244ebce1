"""`finetune pretrain`: a masked language model trained from scratch on raw text.

setup (tokenizer, blocks, model, optimizer) -> train (epochs of the shared loop) -> save (HF checkpoint).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from finetune.console import console
from finetune.data.corpus import MaskedBlocks, pack_blocks, read_documents, split_documents, tokenize_documents
from finetune.data.masking import MaskingRule
from finetune.data.tokenizers import shared_tokenizer, train_wordpiece
from finetune.models.backbones import layer_groups
from finetune.models.hub import load_tokenizer
from finetune.errors import UserError
from finetune.models.masked_lm import SparseMaskedLM, build_masked_lm, load_masked_lm
from finetune.recipes import PretrainRecipe
from finetune.run_dir import METRICS_FILE, MetricsLog, check_run_dir_free, prepare_run_dir
from finetune.training.checkpoints import save_checkpoint
from finetune.training.loop import TrainingLoop, make_accelerator, total_optimizer_steps
from finetune.training.optim import build_optimizer
from finetune.training.schedules import make_schedule

CHECKPOINT_DIR = "checkpoint"  # inside the run directory


def run_pretrain(recipe: PretrainRecipe) -> Path:
    """Run the whole stage; returns the checkpoint folder."""
    # 1. setup: read everything that can fail on user input before the run directory exists
    check_run_dir_free(recipe)
    accelerator = make_accelerator(recipe.training)
    set_seed(recipe.seed)
    documents = read_documents(recipe.corpus.train_files)
    if recipe.corpus.validation_files:
        validation_documents = read_documents(recipe.corpus.validation_files)
    else:
        documents, validation_documents = split_documents(documents, recipe.corpus.validation_fraction, recipe.seed)
    block_size = recipe.corpus.block_size
    max_positions = recipe.model.max_positions or block_size
    continued = None
    if recipe.model.checkpoint is not None:  # ULMFiT's second stage: keep training an existing LM
        dropout = recipe.model.dropout if "dropout" in recipe.model.model_fields_set else None
        continued = load_masked_lm(recipe.model.checkpoint, dropout)
        max_positions = continued.config.max_position_embeddings
        if block_size > max_positions:
            raise UserError(f"corpus.block_size {block_size} exceeds the {max_positions} positions of "
                            f"{recipe.model.checkpoint}")

    # 2. text -> tokenizer -> packed blocks
    if continued is not None:
        tokenizer = reused_tokenizer(recipe.model.checkpoint, "model.checkpoint", continued.config.vocab_size)
    elif recipe.tokenizer.path is not None:
        tokenizer = reused_tokenizer(str(recipe.tokenizer.path), "tokenizer.path")
    else:
        console.print(f"training a WordPiece tokenizer ({recipe.tokenizer.vocab_size} pieces) "
                      f"on {len(documents):,} documents")
        tokenizer = shared_tokenizer(accelerator, lambda: train_wordpiece(
            documents, recipe.tokenizer.vocab_size, recipe.tokenizer.lowercase, recipe.tokenizer.min_frequency))
    tokenizer.model_max_length = max_positions

    def blocks_of(texts: list[str], name: str):
        return pack_blocks(tokenize_documents(tokenizer, texts), block_size, tokenizer.cls_token_id,
                           tokenizer.sep_token_id, name)

    rule = MaskingRule.for_tokenizer(tokenizer, recipe.masking)
    train_data = MaskedBlocks(blocks_of(documents, "the training text"), rule, recipe.seed)
    validation_data = MaskedBlocks(blocks_of(validation_documents, "the validation text"), rule, recipe.seed + 1,
                                   fixed_masks=True)
    if len(train_data) < recipe.training.batch_size:
        raise UserError(f"the corpus gives {len(train_data)} training blocks, "
                        f"fewer than training.batch_size={recipe.training.batch_size}")
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    console.print(f"{len(train_data):,} training blocks and {len(validation_data):,} validation blocks "
                  f"of {block_size} tokens")

    # 3. model and optimizer (one parameter group per layer group; pretraining uses one LR for all)
    if continued is not None:
        masked_lm = continued
    else:
        masked_lm = build_masked_lm(recipe.model, len(tokenizer), max_positions, tokenizer.pad_token_id)
    model = SparseMaskedLM(masked_lm)
    groups = layer_groups(masked_lm)
    optimizer = build_optimizer(model, groups, [recipe.training.lr] * len(groups), recipe.training.weight_decay,
                                recipe.training.adam_betas)
    train_loader = DataLoader(train_data, batch_size=recipe.training.batch_size, shuffle=True, drop_last=True,
                              num_workers=recipe.training.num_workers)
    validation_loader = DataLoader(validation_data, batch_size=recipe.training.batch_size,
                                   num_workers=recipe.training.num_workers)
    model, optimizer, train_loader, validation_loader = accelerator.prepare(
        model, optimizer, train_loader, validation_loader
    )
    total_steps = total_optimizer_steps(len(train_loader), recipe.training)
    loop = TrainingLoop(accelerator, model, optimizer, make_schedule(recipe.schedule, total_steps), total_steps,
                        recipe.training, MetricsLog(run_dir / METRICS_FILE, accelerator.is_main_process), "tokens")

    def compute_loss(model, batch):
        loss, _, _ = model(batch["input_ids"], batch["labels"])
        return loss, torch.tensor(batch["input_ids"].numel())

    def evaluate():
        return validation_metrics(accelerator, model, validation_loader)

    # 4. train
    epoch = 0
    while not loop.finished:
        train_data.set_epoch(epoch)
        train_loader.set_epoch(epoch)
        loop.train_epoch(train_loader, epoch, compute_loss, evaluate, recipe.eval_every)
        metrics = evaluate()
        loop.log_evaluation(metrics, epoch)
        console.print(f"epoch {epoch + 1}: validation loss {metrics['validation_loss']:.4f}, "
                      f"perplexity {metrics['validation_perplexity']:.1f}, "
                      f"masked-token accuracy {metrics['masked_accuracy']:.3f}")
        epoch += 1

    # 5. save
    checkpoint = run_dir / CHECKPOINT_DIR
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_checkpoint(accelerator.unwrap_model(model).masked_lm, tokenizer, checkpoint, recipe)
        console.print(f"checkpoint saved to {checkpoint}")
    return checkpoint


@torch.no_grad()
def validation_metrics(accelerator, model, loader) -> dict[str, float]:
    """Validation loss (per masked token), perplexity and masked-token accuracy over all processes."""
    model.eval()
    totals = torch.zeros(3, device=accelerator.device)  # summed loss, masked tokens, correct
    for batch in loader:
        loss, count, correct = model(batch["input_ids"], batch["labels"])
        totals += torch.stack([loss.float() * count, count.float(), correct.float()])
    totals = accelerator.reduce(totals, reduction="sum")
    loss = (totals[0] / totals[1].clamp(min=1)).item()
    return {"validation_loss": loss, "validation_perplexity": math.exp(min(loss, 50.0)),
            "masked_accuracy": (totals[2] / totals[1].clamp(min=1)).item()}


def reused_tokenizer(source: str, key: str, vocab_limit: int | None = None):
    """An existing tokenizer, checked for what masked-LM training needs."""
    tokenizer = load_tokenizer(source, key)
    if None in (tokenizer.mask_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id):
        raise UserError(f"{key}: the tokenizer of {source} lacks a mask, cls or sep token for masked LM")
    if vocab_limit is not None and len(tokenizer) > vocab_limit:
        raise UserError(f"{key}: the tokenizer of {source} has {len(tokenizer)} tokens, the model only {vocab_limit}")
    return tokenizer
