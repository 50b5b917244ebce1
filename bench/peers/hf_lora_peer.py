"""Peer baseline: LoRA fine-tuning of a GLUE single-sentence task the Hugging Face way, peft and the Trainer.

peft's LoraConfig for sequence classification (task_type SEQ_CLS: the classifier trained fully, LoRA on peft's
choice of layers for the family: query and value for BERT-style models) around AutoModelForSequenceClassification,
trained by the Trainer with its defaults (AdamW, linear decay) and 10% warmup, dynamic padding
(DataCollatorWithPadding). --modules-to-save adds modules trained fully beside the classifier (bench/lora_sst2.py
names BERT's pooler, which the toolkit's head trains too). Prints one JSON line: training examples per second of
`trainer.train()`, the trainable parameters and the dev accuracy.

    python bench/peers/hf_lora_peer.py --model DIR --task-dir FOLDER --max-train 2000 --epochs 3 --lr 5e-4
"""

import csv

import numpy as np
from datasets import Dataset
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer

from _hf_peer import peer_parser, peer_training_arguments, report, timed_train


def read_sentences(path):
    """(sentences, 0/1 labels) of a GLUE single-sentence TSV (SST-2's sentence and label columns)."""
    with open(path, encoding="utf-8-sig") as table:
        rows = list(csv.reader(table, delimiter="\t", quoting=csv.QUOTE_NONE))
    columns = {name: index for index, name in enumerate(rows[0])}
    return [row[columns["sentence"]] for row in rows[1:]], [int(row[columns["label"]]) for row in rows[1:]]


def main():
    parser = peer_parser(batch=32, lr=5e-4, files=False)
    parser.add_argument("--task-dir", required=True)
    parser.add_argument("--max-train", type=int, default=0, help="first N training rows (0: all)")
    parser.add_argument("--max-steps", type=int, default=-1, help="optimizer steps, whatever --epochs (-1: epochs)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--modules-to-save", nargs="*", default=[], help="trained fully beside the classifier")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)
    lora = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=args.rank,
        lora_alpha=args.alpha,
        lora_dropout=args.dropout,
        modules_to_save=args.modules_to_save or None,
    )
    model = get_peft_model(model, lora)
    trainable, total = model.get_nb_trainable_parameters()

    def encode(split, limit=0):
        sentences, labels = read_sentences(f"{args.task_dir}/{split}.tsv")
        if limit:
            sentences, labels = sentences[:limit], labels[:limit]
        encoding = tokenizer(sentences, truncation=True, max_length=args.seq_len)
        return Dataset.from_dict({**dict(encoding), "labels": labels})

    train, dev = encode("train", args.max_train), encode("dev")
    training = peer_training_arguments(args, 64, warmup_steps=0.1, max_steps=args.max_steps)
    trainer = Trainer(model=model, args=training, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer))
    train_s = timed_train(trainer)
    steps = trainer.state.global_step
    epochs = steps * args.batch / len(train) if args.max_steps > 0 else args.epochs  # the examples trained on
    predictions = np.argmax(trainer.predict(dev).predictions, axis=-1)
    report(
        "peft-lora-trainer", len(train), epochs, train_s, steps=steps, trainable_parameters=trainable,
        parameters=total, target_modules=sorted(model.peft_config["default"].target_modules),
        dev={"accuracy": round(float((predictions == np.array(dev["labels"])).mean()), 4)},
    )  # fmt: skip


if __name__ == "__main__":
    main()
