"""GPT's similarity transformation on STS-B: a decoder reading each pair in both orders against one order.

    .venv/bin/python bench/stsb_both_orders.py                     # ~40 minutes on 2 CPU cores with the defaults
    .venv/bin/python bench/stsb_both_orders.py --checkpoint DIR    # a GPT-2 checkpoint of your own, no pretraining
    .venv/bin/python bench/stsb_both_orders.py --smoke             # 2 steps of pretraining and of each arm, seed 0

A decoder reads a sentence pair left to right, so (a, b) and (b, a) score one symmetric question twice. The GPT
paper read both orders and added the two last-token states before the linear head (`task.both_orders: true`); this
measures what that buys against (a, b) alone at the same steps (both orders cost twice the tokens a step).

The decoder is the GPT-2-mini of recipes/pretrain/gpt2-mini-wikitext2.yaml (4 layers, hidden 256, 7.4M parameters),
pretrained here for one epoch of WikiText-2 (about 13 minutes) into the work folder (--work, default
runs/bench-stsb-both-orders; a finished pretraining there is reused); --checkpoint takes any GPT-2-family folder
instead. Both arms (one, both) fine-tune it with recipes/finetune/gpt2-mini-stsb.yaml on STS-B's 5,749 training
pairs for --epochs epochs (batch 32, --lr, linear schedule with 10% warmup), differing in task.both_orders only,
the last weights scored by Pearson and Spearman on the 1,500 dev pairs, one run per --seeds seed. Each checkpoint
then predicts dev in both orders: the order gap is the mean |score(a, b) - score(b, a)|, beside the Pearson of
(b, a) alone and of the two orders' mean. A record per seed and arm goes to the work folder's runs.jsonl (a run
recorded there is not repeated), and to bench/results/stsb_both_orders.jsonl with --update-results.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import _harness as harness
from _common import GLUE, WIKITEXT, describe_machine, finetune_cli, last_record, rate_over_epochs, require

STSB = GLUE / "STS-B"
BATCH_SIZE = 32
TRAIN_PAIRS = 5749  # STS-B's train.tsv rows, for one log record per epoch
ORDERS = {"one": "false", "both": "true"}  # an arm's name: its task.both_orders
SMOKE_STEPS = ["training.max_steps=2", "training.log_every=2"]


def pretrained_decoder(work: Path, smoke: bool) -> Path:
    """The GPT-2-mini pretrained on WikiText-2 by the shipped recipe, trained once into the work folder."""
    run_dir = work / "pretrain"
    checkpoint = run_dir / "checkpoint"
    if (checkpoint / "config.json").exists():
        print(f"reusing the pretrained decoder in {checkpoint}", flush=True)
        return checkpoint
    recipe = "recipes/pretrain/gpt2-mini-wikitext2.yaml"
    finetune_cli("pretrain", recipe, f"run_dir={run_dir}", "overwrite=true", *SMOKE_STEPS * smoke, echo=True)
    return checkpoint


def order_agreement(checkpoint: Path) -> dict:
    """The checkpoint's dev scores read as (a, b) and as (b, a): how far the two orders' predictions lie apart (0
    for a both-orders model, whose prediction is the same for either order) and the Pearson of (b, a) alone and of
    the mean of the two (one-order training with both orders at test time only)."""
    from scipy.stats import pearsonr

    from finetune.commands.predict import load_predictor
    from finetune.data.task_files import read_task_split
    from finetune.glue.specs import GLUE_TASKS

    dev = read_task_split(GLUE_TASKS["stsb"], STSB, "dev")  # the toolkit's reader: the pairs the run scored
    pairs, gold = [tuple(texts) for texts in dev.texts], dev.labels
    predictor = load_predictor(str(checkpoint))
    forward = np.array([row["score"] for row in predictor.predict(pairs)])
    swapped = np.array([row["score"] for row in predictor.predict([(b, a) for a, b in pairs])])
    return {
        "order_gap": round(float(np.abs(forward - swapped).mean()), 4),
        "pearson_swapped": round(float(pearsonr(swapped, gold)[0]), 4),
        "pearson_mean_of_orders": round(float(pearsonr((forward + swapped) / 2, gold)[0]), 4),
    }


def fine_tune(args, checkpoint: Path, job: tuple[int, str]) -> dict:
    """One fine-tuning run: pairs/s over its training, the last weights' dev Pearson and Spearman, and how its
    predictions move with the pair's order."""
    seed, orders = job[:2]
    run_dir = args.work / f"{orders}-order-seed{seed}"
    finetune_cli(
        "finetune", "recipes/finetune/gpt2-mini-stsb.yaml", f"model.checkpoint={checkpoint}", f"task.data_dir={STSB}",
        f"task.both_orders={ORDERS[orders]}", f"training.epochs={args.epochs}", f"training.lr={args.lr}",
        f"training.log_every={-(-TRAIN_PAIRS // BATCH_SIZE)}", "keep_best=false", f"seed={seed}", f"run_dir={run_dir}",
        "overwrite=true", *SMOKE_STEPS * args.smoke, echo=True,
    )  # fmt: skip
    dev = last_record(run_dir, "eval")
    return {
        "arm": orders,
        "checkpoint": str(checkpoint),
        "epochs": args.epochs,
        "lr": args.lr,
        "seed": seed,
        "pairs_per_s": round(rate_over_epochs(run_dir, args.epochs), 1),
        "pearson": round(dev["dev_pearson"], 4),
        "spearman": round(dev["dev_spearman"], 4),
        **order_agreement(run_dir / "checkpoint"),
    }


def main() -> None:
    parser = harness.benchmark_parser(
        __doc__, "stsb-both-orders", seeds=[0, 1, 2, 3, 4], smoke="2 pretraining and 2 fine-tuning steps, seed 0"
    )
    parser.add_argument("--checkpoint", type=Path, help="a GPT-2-family checkpoint folder (default: pretrain one)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    machine = describe_machine()  # the figures below belong to this machine
    require(STSB / "train.tsv", "GLUE STS-B (../shared/data/glue/STS-B)")
    if args.checkpoint is None:
        require(WIKITEXT / "train.txt", "WikiText-2 (../shared/data/wikitext-2)")
    elif not (args.checkpoint / "config.json").exists():
        raise SystemExit(f"bench: --checkpoint {args.checkpoint} holds no config.json (a checkpoint folder is needed)")
    args.work = harness.work_folder(args, "stsb-both-orders")
    if args.smoke:
        args.epochs, args.seeds = 1, [0]
    checkpoint = args.checkpoint or pretrained_decoder(args.work, args.smoke)
    jobs = [(seed, orders, args.epochs, args.lr) for seed in args.seeds for orders in ORDERS]
    key = lambda r: (r["seed"], r["arm"], r["epochs"], r["lr"])
    records = harness.run_grid(args.work, jobs, key, lambda job: fine_tune(args, checkpoint, job),
                               "stsb_both_orders" if args.update_results else None, machine)  # fmt: skip
    records = [r for r in records if key(r) in jobs]
    columns = {
        "arm": "arm", "seed": "seed", "pairs/s": "pairs_per_s", "dev Pearson": lambda r: 100 * r["pearson"],
        "dev Spearman": lambda r: 100 * r["spearman"], "order gap": "order_gap",
        "Pearson (b, a)": lambda r: 100 * r["pearson_swapped"],
        "Pearson, averaged": lambda r: 100 * r["pearson_mean_of_orders"],
    }  # fmt: skip
    print(harness.markdown_table(records, columns, formats={"order gap": "{:.3f}"}))
    summary = {name: columns[name] for name in ("dev Pearson", "Pearson, averaged", "pairs/s")}
    print("\n" + harness.markdown_table(records, summary, by=("arm",)) + "\n\nmean [95% interval] over the seeds")


if __name__ == "__main__":
    main()
