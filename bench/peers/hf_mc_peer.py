"""Peer baseline: multiple choice with the Hugging Face Trainer, the way transformers' run_swag.py does it.

Only transformers, datasets and the Trainer with its defaults (AdamW, linear decay, no warmup): each question and
one of its choices tokenised as a sentence pair, padded per batch (DataCollatorForMultipleChoice, run_swag.py's
default), AutoModelForMultipleChoice, accuracy. run_swag.py reads a fixed number of choices, so the files given
must hold questions with the same number of choices (bench/arc_choices.py keeps ARC-Easy's 4-choice questions).
Prints one JSON line: training questions per second of `trainer.train()` and dev accuracy.

    python bench/peers/hf_mc_peer.py --model DIR --train FOLDER/train.jsonl --dev FOLDER/dev.jsonl --epochs 1
"""

import json

import numpy as np
from datasets import Dataset
from transformers import AutoModelForMultipleChoice, AutoTokenizer, DataCollatorForMultipleChoice, Trainer

from _hf_peer import peer_parser, peer_training_arguments, report, timed_train


def read_arc(path):
    """(stem, choice texts, answer index) per line of ARC's JSON Lines layout."""
    rows = []
    with open(path, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines]
    for record in records:
        choices = record["question"]["choices"]
        labels = [choice["label"] for choice in choices]
        rows.append(
            (record["question"]["stem"], [choice["text"] for choice in choices], labels.index(record["answerKey"]))
        )
    return rows


def main():
    args = peer_parser(batch=16, lr=3e-5).parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForMultipleChoice.from_pretrained(args.model)

    def encode(rows):
        choices = len(rows[0][1])
        first = [stem for stem, texts, _ in rows for _ in texts]
        second = [text for _, texts, _ in rows for text in texts]
        encoding = tokenizer(first, second, truncation=True, max_length=args.seq_len)
        grouped = {
            key: [values[index : index + choices] for index in range(0, len(values), choices)]
            for key, values in encoding.items()
        }
        return Dataset.from_dict({**grouped, "labels": [answer for _, _, answer in rows]})

    train, dev = encode(read_arc(args.train)), encode(read_arc(args.dev))
    training = peer_training_arguments(args, 32)
    trainer = Trainer(
        model=model, args=training, train_dataset=train, data_collator=DataCollatorForMultipleChoice(tokenizer)
    )
    train_s = timed_train(trainer)
    output = trainer.predict(dev)
    accuracy = float((np.argmax(output.predictions, axis=-1) == np.asarray(dev["labels"])).mean())
    report("hf-trainer-multiple-choice", len(train), args.epochs, train_s, dev={"accuracy": round(accuracy, 4)})


if __name__ == "__main__":
    main()
