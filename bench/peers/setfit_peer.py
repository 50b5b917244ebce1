"""Peer baseline: SetFit (the `setfit` library) with its defaults, trained on a few labelled rows and scored on a test
file: contrastive fine-tuning of a sentence-transformers body on pairs of the training rows (same class: similar,
different classes: dissimilar; CosineSimilarityLoss), then a scikit-learn LogisticRegression head on its embeddings.

    python bench/peers/setfit_peer.py --model DIR --train FOLDER/train.jsonl [FOLDER/dev.jsonl] \
        --test FOLDER/test.jsonl --text-columns sentence --output OUT/setfit.json --seed 0

Only setfit (and what it imports), never the toolkit: `SetFitModel.from_pretrained(DIR)` on a local folder
(HF_HUB_OFFLINE=1) and setfit's `Trainer` with the library's defaults (batch 16, one epoch of pairs, body LR 2e-5,
warmup 10%, LogisticRegression head) except num_iterations=20 (--num-iterations: 20 positive and 20 negative pairs
per training row, as the issue's measurement ran it; the default takes every pair), --seed (default 42 there), and
nothing saved or reported (none of which changes the model).

Input: JSON Lines rows with the text column(s) and the label column (compared as text); every --train file is
trained on. The classes are the training rows' (sorted); a test row of another class counts as an error. Two
--text-columns (a pair, CB's premise and hypothesis) are joined as "premise [SEP] hypothesis" with the tokenizer's
separator: SetFit reads one text. Output: one JSON line, written to --output and printed: accuracy and macro-F1 on
the test file (over the test rows' classes that are training classes), the rows, the classes, the embedding
phase's steps and the seconds of loading, training (both phases) and predicting; --predictions also writes each
test row's predicted label (JSON Lines). Checked with setfit 1.2.0 (installed --no-deps) beside transformers 5.
"""

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model folder only: never a download (read on import)

NUM_ITERATIONS = 20  # pairs per training row and side, as the measurement ran SetFit


def read_rows(path, text_columns, label_column, separator):
    """(texts, labels as text) of a JSON Lines file; two text columns joined as `a SEP b`."""
    texts, labels = [], []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            texts.append(f" {separator} ".join(str(row[column]) for column in text_columns))
            labels.append(str(row[label_column]))
    return texts, labels


def scores(references, predictions, classes):
    """Accuracy, and macro-F1 over the true labels' classes that are training `classes` (a row of another class is
    an error in both: it is never predicted). The benchmark's tests check that its own scorer agrees."""
    from sklearn.metrics import accuracy_score, f1_score

    scored = sorted(set(references) & set(classes))
    return {
        "accuracy": round(float(accuracy_score(references, predictions)), 6),
        "f1_macro": round(float(f1_score(references, predictions, labels=scored, average="macro", zero_division=0)), 6),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local sentence-transformers model folder")
    parser.add_argument("--train", nargs="+", required=True, help="JSON Lines file(s) of labelled rows, all trained on")
    parser.add_argument("--test", required=True, help="the JSON Lines file to score")
    parser.add_argument("--text-columns", nargs="+", default=["text"], help="one column, or two (a sentence pair)")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--num-iterations", type=int, default=NUM_ITERATIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="the JSON file the result line is written to")
    parser.add_argument("--predictions", help="also write the test rows' predicted labels here (JSON Lines)")
    args = parser.parse_args()
    if len(args.text_columns) > 2:
        parser.error("--text-columns: one text, or two for a sentence pair")
    # Here, not at the top: the benchmark's tests import this file's scorer without setfit's few seconds of imports.
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    start = time.perf_counter()
    model = SetFitModel.from_pretrained(args.model)
    separator = model.model_body.tokenizer.sep_token
    load_s = time.perf_counter() - start
    rows = [read_rows(path, args.text_columns, args.label_column, separator) for path in args.train]
    texts, labels = [text for part, _ in rows for text in part], [label for _, part in rows for label in part]
    classes = sorted(set(labels))
    model.labels = classes  # what from_pretrained(labels=...) sets: the head's class ids are indices into it
    index = {label: position for position, label in enumerate(classes)}
    train = Dataset.from_dict({"text": texts, "label": [index[label] for label in labels]})
    test_texts, test_labels = read_rows(args.test, args.text_columns, args.label_column, separator)

    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="setfit-peer-"),
        num_iterations=args.num_iterations,
        seed=args.seed,
        save_strategy="no",
        report_to="none",
    )
    trainer = Trainer(model=model, args=training, train_dataset=train)
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    predicted = [classes[int(value)] for value in model.predict(test_texts, use_labels=False)]
    predict_s = time.perf_counter() - start

    if args.predictions:
        with open(args.predictions, "w", encoding="utf-8") as out:
            out.writelines(json.dumps({"label": label}) + "\n" for label in predicted)
    result = {"peer": "setfit", "train_rows": len(texts), "classes": len(classes), "test_rows": len(test_texts)}
    result |= {"num_iterations": args.num_iterations, "seed": args.seed, "steps": trainer.st_trainer.state.global_step}
    result |= scores(test_labels, predicted, classes)
    result |= {"load_s": round(load_s, 2), "train_s": round(train_s, 2), "predict_s": round(predict_s, 2)}
    line = json.dumps(result)
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
