"""Peer baseline: extractive question answering with the Hugging Face Trainer, the way transformers' run_qa.py does it.

Only transformers, datasets and the Trainer with its defaults (AdamW, linear decay, no warmup, no weight decay):
each question and its context cut into windows of --seq-len tokens sharing --doc-stride (truncation="only_second",
offsets kept), padded to --seq-len as run_qa.py's pad_to_max_length does (--no-pad-to-max-length: per batch), a
window labelled with its answer's first and last token or [CLS] when the answer is not wholly in it or there is
none; AutoModelForQuestionAnswering. Dev answers by run_qa.py's post-processing: the --n-best starts and ends over a
question's windows, spans of at most --max-answer-length tokens; with --version-2-with-negative no answer when the
no-answer score (the lowest [CLS] start + end) beats the best span by more than --null-score-diff-threshold.

Nothing is downloaded or scored here: the SQuAD JSON files are read with `json`, and the answers (id -> text, ""
for none), each question's best span and null margin go to --predictions for the caller to score. Prints one JSON
line: training windows (and questions) per second of `trainer.train()`.

    python bench/peers/hf_qa_peer.py --model DIR --train FOLDER/train.json --dev FOLDER/dev.json --predictions OUT.json
"""

import argparse
import json

import numpy as np
from datasets import Dataset
from transformers import (
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    default_data_collator,
    set_seed,
)

from _hf_peer import peer_parser, peer_training_arguments, timed_train


def read_squad_columns(path):
    """A SQuAD JSON file as run_qa.py's columns: id, title, context, question, answers {text, answer_start}."""
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    columns = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    for article in document["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                columns["id"].append(str(qa["id"]))
                columns["title"].append(article.get("title", ""))
                columns["context"].append(paragraph["context"])
                columns["question"].append(qa["question"])
                answers = qa.get("answers") or []
                columns["answers"].append(
                    {
                        "text": [answer["text"] for answer in answers],
                        "answer_start": [answer["answer_start"] for answer in answers],
                    }
                )
    return Dataset.from_dict(columns)


def windows_of(tokenizer, batch, args):
    """The batch's questions (leading spaces dropped, as run_qa.py does) and contexts cut into windows."""
    return tokenizer(
        [question.lstrip() for question in batch["question"]],
        batch["context"],
        truncation="only_second",
        max_length=args.max_length,
        stride=args.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if args.pad_to_max_length else False,
    )


def training_features(tokenizer, args):
    """A `Dataset.map` function: each window with start_positions and end_positions (both [CLS] when the answer is
    not wholly inside the window's context, or the question has none)."""

    def prepare(batch):
        windows = windows_of(tokenizer, batch, args)
        question_of = windows.pop("overflow_to_sample_mapping")
        all_offsets = windows.pop("offset_mapping")
        windows["start_positions"], windows["end_positions"] = [], []
        for row, offsets in enumerate(all_offsets):
            input_ids = windows["input_ids"][row]
            cls = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
            answers = batch["answers"][question_of[row]]
            start, end = cls, cls
            if answers["answer_start"]:
                first_char = answers["answer_start"][0]
                last_char = first_char + len(answers["text"][0])
                context = [position for position, part in enumerate(windows.sequence_ids(row)) if part == 1]
                if offsets[context[0]][0] <= first_char and offsets[context[-1]][1] >= last_char:
                    # the last context token starting at or before the answer, the first ending at or after it
                    start = max(position for position in context if offsets[position][0] <= first_char)
                    end = min(position for position in context if offsets[position][1] >= last_char)
            windows["start_positions"].append(start)
            windows["end_positions"].append(end)
        return windows

    return prepare


def evaluation_features(tokenizer, args):
    """A `Dataset.map` function: each window with its question's id and the character offsets of its context
    tokens (None for the question and special tokens), for post-processing."""

    def prepare(batch):
        windows = windows_of(tokenizer, batch, args)
        question_of = windows.pop("overflow_to_sample_mapping")
        windows["example_id"] = [batch["id"][index] for index in question_of]
        windows["offset_mapping"] = [
            [offset if part == 1 else None for offset, part in zip(offsets, windows.sequence_ids(row))]
            for row, offsets in enumerate(windows["offset_mapping"])
        ]
        return windows

    return prepare


def best_answers(questions, features, start_logits, end_logits, args):
    """Each question's answer, best span and null margin from its windows' logits (run_qa.py's post-processing)."""
    windows_of_question = {}
    for window, identifier in enumerate(features["example_id"]):
        windows_of_question.setdefault(identifier, []).append(window)
    all_offsets = features["offset_mapping"]
    answers, spans, margins, without_span = {}, {}, {}, 0
    for identifier, context in zip(questions["id"], questions["context"]):
        null_score, candidates = None, []
        for window in windows_of_question[identifier]:
            starts, ends, offsets = start_logits[window], end_logits[window], all_offsets[window]
            window_null = float(starts[0] + ends[0])  # [CLS] is the first token of a BERT window
            null_score = window_null if null_score is None else min(null_score, window_null)
            for first in np.argsort(starts)[::-1][: args.n_best]:
                for last in np.argsort(ends)[::-1][: args.n_best]:
                    if (
                        first >= len(offsets)
                        or last >= len(offsets)
                        or offsets[first] is None
                        or offsets[last] is None
                        or last < first
                        or last - first + 1 > args.max_answer_length
                    ):
                        continue
                    candidates.append((float(starts[first] + ends[last]), offsets[first][0], offsets[last][1]))
        if candidates:
            score, first_char, last_char = max(candidates)
            span = context[first_char:last_char]
        else:  # no valid span in any window: run_qa.py answers the placeholder "empty", scored 0
            score, span, without_span = 0.0, "empty", without_span + 1
        margin = null_score - score
        answers[identifier] = "" if args.version_2_with_negative and margin > args.null_score_diff_threshold else span
        spans[identifier], margins[identifier] = span, margin
    return answers, spans, margins, without_span


def main():
    parser = peer_parser(batch=16, lr=5e-5, epochs=2.0, seq_len=384)
    parser.add_argument("--predictions", required=True, help="the JSON file the dev answers are written to")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps (-1: the epochs)")
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--pad-to-max-length", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--version-2-with-negative", action="store_true")
    parser.add_argument("--null-score-diff-threshold", type=float, default=0.0)
    parser.add_argument("--n-best", type=int, default=20)
    parser.add_argument("--max-answer-length", type=int, default=30)
    args = parser.parse_args()
    set_seed(args.seed)  # before the model, as run_qa.py: the new head's initial weights follow the seed
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForQuestionAnswering.from_pretrained(args.model)
    args.max_length = min(args.seq_len, tokenizer.model_max_length)
    train_questions, dev_questions = read_squad_columns(args.train), read_squad_columns(args.dev)
    train = train_questions.map(
        training_features(tokenizer, args), batched=True, remove_columns=train_questions.column_names
    )
    dev = dev_questions.map(
        evaluation_features(tokenizer, args), batched=True, remove_columns=dev_questions.column_names
    )
    training = peer_training_arguments(args, 32, max_steps=args.max_steps)
    collator = default_data_collator if args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    trainer = Trainer(model=model, args=training, train_dataset=train, data_collator=collator)
    train_s = timed_train(trainer)
    # The Trainer drops the columns the model does not take (example_id, offset_mapping) from its batches.
    start_logits, end_logits = trainer.predict(dev).predictions
    answers, spans, margins, without_span = best_answers(dev_questions, dev, start_logits, end_logits, args)
    with open(args.predictions, "w", encoding="utf-8") as out:
        json.dump({"answers": answers, "spans": spans, "null_margins": margins}, out, ensure_ascii=False)
    steps = trainer.state.global_step
    trained = min(len(train) * args.epochs, steps * args.batch) if args.max_steps > 0 else len(train) * args.epochs
    figures = {
        "train_questions": len(train_questions),
        "train_windows": len(train),
        "dev_questions": len(dev_questions),
    }
    figures |= {"dev_windows": len(dev), "epochs": args.epochs, "steps": steps}
    figures |= {"padded_to_max_length": args.pad_to_max_length, "train_s": round(train_s, 1)}
    figures |= {"windows_per_s": round(trained / train_s, 2), "dev_without_span": without_span}
    figures |= {"questions_per_s": round(trained * len(train_questions) / len(train) / train_s, 2)}
    print(json.dumps({"peer": "hf-trainer-question-answering", **figures}))


if __name__ == "__main__":
    main()
