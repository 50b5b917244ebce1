"""ULMFiT's three stages on SST-2 against the same AWD-LSTM classifier trained from scratch.

    .venv/bin/python bench/ulmfit_sst2.py                          # about an hour on one CPU thread, default sizes
    .venv/bin/python bench/ulmfit_sst2.py --embedding 400 --hidden 1152 --lm-steps 0   # ULMFiT's sizes, hours

Stage 1 pretrains an AWD-LSTM language model on WikiText-2 (recipes/pretrain/awd-lstm-wikitext2.yaml),
stage 2 fine-tunes it on SST-2's own text (recipes/ulmfit/sst2-2-language-model.yaml: the training and
unlabeled test sentences, a vocabulary rebuilt on that text, discriminative LRs and STLR), stage 3 trains
the concat-pooling classifier with gradual unfreezing (recipes/ulmfit/sst2-3-classifier.yaml). The
baseline is the same classifier, same vocabulary and same recipe, from random weights with every group
trainable from the start (gradual unfreezing of random layers only wastes epochs). Both are trained on the
first --labels training rows (and on all 67,349), and scored on the whole dev set (872 sentences) at the
best dev evaluation (keep_best, as the shipped recipe does).

The shipped recipes use ULMFiT's sizes (embedding 400, 3 x 1,152 hidden), which a 2-core CPU trains at a
few hundred tokens per second; the defaults here shrink the model and cap stage 1 at --lm-steps steps
so that the whole comparison fits in about an hour. The printed table states the sizes it ran with.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
WIKITEXT, SST2 = SHARED / "wikitext-2", SHARED / "glue" / "SST-2"


def finetune_cli(*arguments: str) -> None:
    """Run one stage through the CLI, as a user would; stop the benchmark with its error if it fails."""
    print("$ finetune " + " ".join(arguments), file=sys.stderr, flush=True)
    completed = subprocess.run([sys.executable, "-m", "finetune", *arguments], cwd=ROOT, text=True,
                               capture_output=True)
    if completed.returncode != 0:
        sys.exit(f"bench: stage failed ({completed.returncode}):\n{completed.stderr[-3000:]}")


def labelled_subset(rows: int, folder: Path) -> Path:
    """A copy of SST-2 whose train.tsv keeps the header and the first `rows` rows (dev.tsv whole)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "train.tsv").write_text("".join(lines[: rows + 1]), encoding="utf-8")
    (folder / "dev.tsv").write_text((SST2 / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def best_dev_accuracy(run_dir: Path) -> float:
    return json.loads((run_dir / "result.json").read_text(encoding="utf-8"))["best"]["dev_accuracy"]


def last_validation(run_dir: Path) -> dict:
    """The language model's last validation record (loss, perplexity)."""
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl", encoding="utf-8")]
    return [record for record in records if record.get("phase") == "eval"][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedding", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=400)
    parser.add_argument("--vocab", type=int, default=8000, help="byte-level BPE pieces, stage 1 and stage 2")
    parser.add_argument("--lm-steps", type=int, default=300, help="cap on stage 1's steps (0: the recipe's 2 epochs)")
    parser.add_argument("--lm-finetune-epochs", type=int, default=1)
    parser.add_argument("--classifier-epochs", type=int, default=5)
    parser.add_argument("--labels", type=int, nargs="+", default=[1000, 67349])
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the runs here (default: a temp folder)")
    arguments = parser.parse_args()
    for needed in (WIKITEXT / "train.txt", SST2 / "train.tsv"):
        if not needed.is_file():
            sys.exit(f"bench: {needed} not found; this benchmark needs the shared data folder beside the repository")

    with tempfile.TemporaryDirectory() as temporary:
        work = arguments.work_dir or Path(temporary)
        sizes = [f"model.embedding_size={arguments.embedding}", f"model.hidden={arguments.hidden}"]
        general, target = work / "1-wikitext2", work / "2-sst2-language-model"
        finetune_cli("pretrain", "recipes/pretrain/awd-lstm-wikitext2.yaml", *sizes, f"run_dir={general}",
                     f"tokenizer.vocab_size={arguments.vocab}",
                     *([f"training.max_steps={arguments.lm_steps}"] if arguments.lm_steps else []))
        finetune_cli("pretrain", "recipes/ulmfit/sst2-2-language-model.yaml", f"run_dir={target}",
                     f"model.checkpoint={general / 'checkpoint'}", f"tokenizer.vocab_size={arguments.vocab}",
                     f"corpus.task.data_dir={SST2}", f"training.epochs={arguments.lm_finetune_epochs}")

        results = []
        for rows in arguments.labels:
            data = labelled_subset(rows, work / f"sst2-{rows}")
            common = ["recipes/ulmfit/sst2-3-classifier.yaml", f"model.checkpoint={target / 'checkpoint'}",
                      f"task.data_dir={data}", f"training.epochs={arguments.classifier_epochs}"]
            ulmfit, scratch = work / f"3-ulmfit-{rows}", work / f"3-scratch-{rows}"
            finetune_cli("finetune", *common, f"run_dir={ulmfit}")
            finetune_cli("finetune", *common, f"run_dir={scratch}", "model.init=random", "unfreezing.mode=none")
            results.append({"labels": rows, "ulmfit": best_dev_accuracy(ulmfit),
                            "scratch": best_dev_accuracy(scratch)})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)

        stage1, stage2 = last_validation(general), last_validation(target)
    print(f"\nAWD-LSTM embedding {arguments.embedding}, 3 x {arguments.hidden} hidden, BPE {arguments.vocab}; "
          f"stage 1: {'%d steps' % arguments.lm_steps if arguments.lm_steps else 'the recipe'} on WikiText-2 "
          f"(validation perplexity {stage1['validation_perplexity']:.1f}); stage 2: "
          f"{arguments.lm_finetune_epochs} epoch(s) on SST-2 text (perplexity {stage2['validation_perplexity']:.1f}); "
          f"classifier: {arguments.classifier_epochs} epochs, best dev evaluation\n")
    print("| SST-2 training labels | ULMFiT (WikiText-2 LM -> SST-2 LM -> classifier) | same classifier from scratch |")
    print("|---:|---:|---:|")
    for row in results:
        print(f"| {row['labels']:,} | {100 * row['ulmfit']:.1f} | {100 * row['scratch']:.1f} |")
    print(json.dumps({"arguments": {k: str(v) for k, v in vars(arguments).items()}, "stage1": stage1,
                      "stage2": stage2, "results": results}))


if __name__ == "__main__":
    main()
