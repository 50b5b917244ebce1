"""The names other tools give to recipe keys, for the loader's "did you mean" (recipes/loader.py)."""

# The names other tools (the Hugging Face Trainer, run_glue.py, fastai) give to keys this toolkit names otherwise:
# what a newcomer types first.
OTHER_TOOLS_NAMES = {
    "learning_rate": "lr",
    "num_train_epochs": "epochs",
    "num_epochs": "epochs",
    "n_epochs": "epochs",
    "per_device_train_batch_size": "batch_size",
    "train_batch_size": "batch_size",
    "bs": "batch_size",
    "warmup_ratio": "warmup_fraction",
    "lr_scheduler_type": "kind",
    "scheduler": "kind",
    "max_seq_length": "max_length",
    "max_seq_len": "max_length",
    "seq_len": "max_length",
    "model_name_or_path": "checkpoint",
    "model_name": "checkpoint",
    "output_dir": "run_dir",
    "save_steps": "checkpoint_every",
    "logging_steps": "log_every",
    "eval_steps": "eval_every",
    "fp16": "mixed_precision",
    "bf16": "mixed_precision",
    "max_grad": "max_grad_norm",
    "grad_clip": "max_grad_norm",
    "label_names": "labels",
    "text_column": "text_columns",
    "wd": "weight_decay",
    "r": "rank",  # peft's LoraConfig names
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "moms": "momentum",
    "stride": "overlap",
    "doc_stride": "overlap",
}
