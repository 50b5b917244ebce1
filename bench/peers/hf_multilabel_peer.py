"""Peer baseline: multi-label classification with the Hugging Face Trainer, the way its documentation does it.

Only transformers, datasets and the Trainer with its defaults (AdamW, linear decay, no warmup, no weight decay):
texts cut at --seq-len and padded per batch (DataCollatorWithPadding; run_glue.py's pad-to-max-length would be much
slower on these short sentences), AutoModelForSequenceClassification with problem_type="multi_label_classification"
([CLS] through the pooler, a sigmoid per label, BCEWithLogitsLoss), float multi-hot labels. Reads JSON Lines of
{"text": ..., "labels": [...]} (bench/conll_entity_types.py's files); writes the dev probabilities (--probabilities,
a .npy array, examples x labels in the order given) for the caller's own scorer. Prints one JSON line: examples per
second of `trainer.train()` and dev micro and macro F1 at 0.5 (scikit-learn).

    python bench/peers/hf_multilabel_peer.py --model DIR --train FOLDER/train.jsonl --dev FOLDER/dev.jsonl \
        --labels PER ORG LOC MISC --epochs 3 --probabilities OUT/peer-dev-probabilities.npy
"""

import json

import numpy as np
import torch
from datasets import Dataset, List, Value
from sklearn.metrics import f1_score
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer

from _hf_peer import peer_parser, peer_training_arguments, report, timed_train


def read_jsonl(path, labels):
    """Texts and their multi-hot rows (float, in `labels` order) of a JSON Lines file."""
    texts, rows = [], []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            texts.append(record["text"])
            rows.append([float(label in record["labels"]) for label in labels])
    return texts, rows


def main():
    parser = peer_parser(batch=32, lr=5e-5, epochs=3.0)
    parser.add_argument("--labels", nargs="+", required=True)
    parser.add_argument("--probabilities", required=True, help="the .npy file to write the dev probabilities to")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model,
        num_labels=len(args.labels),
        problem_type="multi_label_classification",
        id2label=dict(enumerate(args.labels)),
        label2id={label: index for index, label in enumerate(args.labels)},
    )

    def encode(path):
        texts, rows = read_jsonl(path, args.labels)
        encoding = tokenizer(texts, truncation=True, max_length=args.seq_len)
        dataset = Dataset.from_dict({**dict(encoding), "labels": rows})
        return dataset.cast_column("labels", List(Value("float32"))), np.asarray(rows)  # BCE wants float targets

    (train, _), (dev, references) = encode(args.train), encode(args.dev)
    training = peer_training_arguments(args, 64)
    trainer = Trainer(model=model, args=training, train_dataset=train, processing_class=tokenizer)
    train_s = timed_train(trainer)
    logits = trainer.predict(dev).predictions
    probabilities = torch.sigmoid(torch.from_numpy(np.asarray(logits)).double()).numpy()
    np.save(args.probabilities, probabilities)
    predicted = (probabilities > 0.5).astype(int)
    at_half = {
        average: round(float(f1_score(references, predicted, average=average, zero_division=0)), 4)
        for average in ("micro", "macro")
    }
    figures = {"dev_at_0.5": at_half, "dev_probabilities": str(args.probabilities)}
    report("hf-trainer-multilabel", len(train), args.epochs, train_s, **figures)


if __name__ == "__main__":
    main()
