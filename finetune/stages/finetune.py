"""`finetune finetune`: a task head on a pretrained backbone, trained with ULMFiT's three techniques.

setup (data, model, layer groups, discriminative LRs, STLR) -> train (thaw groups epoch by epoch)
-> save (HF checkpoint with the label mapping).
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from finetune.console import console
from finetune.data.tasks import EncodedTask, read_task_split
from finetune.errors import UserError
from finetune.glue.metrics import compute_metrics
from finetune.glue.specs import task_spec
from finetune.models.backbones import layer_groups
from finetune.models.heads import fitted_max_length, load_classifier
from finetune.models.hub import load_tokenizer
from finetune.recipes import FinetuneRecipe
from finetune.run_dir import METRICS_FILE, MetricsLog, check_run_dir_free, prepare_run_dir
from finetune.training.checkpoints import save_checkpoint
from finetune.training.loop import TrainingLoop, make_accelerator, total_optimizer_steps
from finetune.training.optim import build_optimizer, discriminative_lrs
from finetune.training.predict import logits_to_predictions, predict_logits
from finetune.training.schedules import make_schedule
from finetune.training.unfreezing import freeze_below, trainable_group_count

CHECKPOINT_DIR = "checkpoint"  # inside the run directory


def run_finetune(recipe: FinetuneRecipe) -> Path:
    """Run the whole stage; returns the checkpoint folder."""
    # 1. setup: read everything that can fail on user input before the run directory exists
    check_run_dir_free(recipe)
    accelerator = make_accelerator(recipe.training, parameters_change_trainability=recipe.unfreezing.mode != "none")
    set_seed(recipe.seed)
    spec = task_spec(recipe.task)
    tokenizer = load_tokenizer(recipe.model.checkpoint)
    train_examples = read_task_split(spec, recipe.task.data_dir, "train")
    dev_examples = read_task_split(spec, recipe.task.data_dir, "dev")
    if dev_examples.labels is None:
        raise UserError(f"task '{spec.name}': the dev file has no '{spec.label_column}' column to score against")
    model = load_classifier(recipe.model, spec, recipe.classifier_dropout)
    max_length = fitted_max_length(recipe.task.max_length, model)
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    console.print(f"task {spec.name}: {len(train_examples.texts):,} training and {len(dev_examples.texts):,} dev "
                  f"examples; backbone {recipe.model.checkpoint} ({recipe.model.init} weights)")

    # 2. layer groups -> discriminative learning rates -> optimizer
    groups = layer_groups(model)
    lrs = discriminative_lrs(len(groups), recipe.training.lr, recipe.discriminative.factor)
    optimizer = build_optimizer(model, groups, lrs, recipe.training.weight_decay, recipe.training.adam_betas)
    collate = DataCollatorWithPadding(tokenizer)
    train_loader = DataLoader(EncodedTask(train_examples, tokenizer, max_length),
                              batch_size=recipe.training.batch_size, shuffle=True, collate_fn=collate,
                              num_workers=recipe.training.num_workers)
    dev_loader = DataLoader(EncodedTask(dev_examples, tokenizer, max_length),
                            batch_size=recipe.training.batch_size * 2, collate_fn=collate)
    model, optimizer, train_loader, dev_loader = accelerator.prepare(model, optimizer, train_loader, dev_loader)
    total_steps = total_optimizer_steps(len(train_loader), recipe.training)
    log = MetricsLog(run_dir / METRICS_FILE, accelerator.is_main_process)
    loop = TrainingLoop(accelerator, model, optimizer, make_schedule(recipe.schedule, total_steps), total_steps,
                        recipe.training, log, "examples")

    def compute_loss(model, batch):
        return model(**batch).loss, torch.tensor(batch["input_ids"].shape[0])

    def evaluate() -> dict[str, float]:
        predictions = logits_to_predictions(spec, predict_logits(accelerator, model, dev_loader))
        return {f"dev_{name}": value for name, value in
                compute_metrics(spec, predictions, dev_examples.labels).items()}

    # 3. train: gradual unfreezing decides, per epoch, how many groups from the top learn
    for epoch in range(recipe.training.epochs):
        if loop.finished:
            break
        trainable = trainable_group_count(epoch, len(groups), recipe.unfreezing.mode,
                                          recipe.unfreezing.initial_groups, recipe.unfreezing.groups_per_epoch)
        freeze_below(groups, trainable)
        log.write({"phase": "unfreeze", "step": loop.step, "epoch": epoch, "trainable_groups": trainable,
                   "total_groups": len(groups)})
        train_loader.set_epoch(epoch)
        loop.train_epoch(train_loader, epoch, compute_loss)
        metrics = evaluate()
        loop.log_evaluation(metrics, epoch)
        scores = ", ".join(f"{name.removeprefix('dev_')} {value:.4f}" for name, value in metrics.items())
        console.print(f"epoch {epoch + 1}: {trainable}/{len(groups)} groups trainable; dev {scores}")

    # 4. save, with every parameter trainable again so the checkpoint loads like any other
    freeze_below(groups, len(groups))
    checkpoint = run_dir / CHECKPOINT_DIR
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_checkpoint(accelerator.unwrap_model(model), tokenizer, checkpoint, recipe)
        console.print(f"checkpoint saved to {checkpoint}")
    return checkpoint
