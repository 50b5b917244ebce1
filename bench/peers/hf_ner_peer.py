"""Peer baseline: named-entity tagging with the Hugging Face Trainer, the way transformers' run_ner.py does it.

Only transformers, datasets and the Trainer with its defaults (AdamW, linear decay, no warmup): words tokenised with
is_split_into_words, each word's tag on its first sub-token (-100 elsewhere: run_ner.py's default,
label_all_tokens false), DataCollatorForTokenClassification, AutoModelForTokenClassification, entity-level scores
by seqeval. Prints one JSON line: training examples (sentences) per second of `trainer.train()` and the dev scores.

    python bench/peers/hf_ner_peer.py --model DIR --train FOLDER/train.txt --dev FOLDER/dev.txt --epochs 1
"""

import numpy as np
from datasets import Dataset
from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification, Trainer

from _hf_peer import peer_parser, peer_training_arguments, report, timed_train


def read_conll(path):
    """Sentences of words and their last-column tags; blank lines and -DOCSTART- end a sentence."""
    sentences, words, tags = [], [], []
    with open(path, encoding="utf-8") as text:
        lines = text.read().splitlines()
    for line in lines + [""]:
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
            words, tags = [], []
        else:
            words.append(columns[0])
            tags.append(columns[-1])
    return sentences


def main():
    args = peer_parser(batch=32, lr=5e-5).parse_args()
    train_sentences, dev_sentences = read_conll(args.train), read_conll(args.dev)
    labels = sorted({tag for _, tags in train_sentences for tag in tags})
    label_ids = {label: index for index, label in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids
    )

    def encode(sentences):
        encoding = tokenizer(
            [words for words, _ in sentences], is_split_into_words=True, truncation=True, max_length=args.seq_len
        )
        all_labels = []
        for row, (_, tags) in enumerate(sentences):
            previous, row_labels = None, []
            for word in encoding.word_ids(row):
                row_labels.append(-100 if word is None or word == previous else label_ids.get(tags[word], 0))
                previous = word
            all_labels.append(row_labels)
        return Dataset.from_dict({**dict(encoding), "labels": all_labels})

    train, dev = encode(train_sentences), encode(dev_sentences)
    training = peer_training_arguments(args, 64)
    trainer = Trainer(
        model=model, args=training, train_dataset=train, data_collator=DataCollatorForTokenClassification(tokenizer)
    )
    train_s = timed_train(trainer)
    output = trainer.predict(dev)
    predictions = np.argmax(output.predictions, axis=-1)
    gold, guessed = [], []
    for row_predictions, row_labels in zip(predictions, output.label_ids):
        kept = [(labels[p], labels[g]) for p, g in zip(row_predictions, row_labels) if g != -100]
        guessed.append([p for p, _ in kept])
        gold.append([g for _, g in kept])
    scores = {
        "f1": f1_score(gold, guessed),
        "precision": precision_score(gold, guessed),
        "recall": recall_score(gold, guessed),
        "accuracy": accuracy_score(gold, guessed),
    }
    dev_scores = {name: round(float(value), 4) for name, value in scores.items()}
    report("hf-trainer-ner", len(train), args.epochs, train_s, dev=dev_scores)


if __name__ == "__main__":
    main()
