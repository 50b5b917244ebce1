"""ULMFiT's bidirectional model on SST-2: a forward and a backward classifier, each alone and averaged.

    # 1. the forward flow: bench/ulmfit_sst2.py as documented there (its work dir keeps every classifier)
    # 2. the same flow read backwards: stage 1 trains on reversed documents; stages 2 and 3 follow its checkpoint
    .venv/bin/python bench/ulmfit_sst2.py --work-dir /work/bench-ulmfit-backward --sides ulmfit \
        --general-lm-overrides corpus.reverse=true \
        model.embedding_size=200 model.hidden=400 tokenizer.vocab_size=8000 training.max_steps=700 ngram_floor=null
    # 3. (optional) ELMo's biLM: one classifier on both stage-2 LMs, as variants of the forward work dir
    .venv/bin/python bench/ulmfit_sst2.py --work-dir /work/bench-ulmfit-lr --sides ulmfit --variant bilm \
        --classifier-overrides model.backward_checkpoint=/work/bench-ulmfit-backward/2-target-lm/checkpoint
    .venv/bin/python bench/ulmfit_sst2.py --work-dir /work/bench-ulmfit-lr --sides ulmfit --variant bilm-mix \
        --classifier-overrides model.backward_checkpoint=/work/bench-ulmfit-backward/2-target-lm/checkpoint \
        pooling=scalar_mix
    # 4. this table
    .venv/bin/python bench/ulmfit_bidirectional.py --forward /work/bench-ulmfit-lr \
        --backward /work/bench-ulmfit-backward

Howard & Ruder (2018), section 3.3: "we pretrain both a forward and a backward LM ... fine-tune a classifier for
each LM independently ... average the classifier predictions". Here: for every (labels, seed) whose ULMFiT
classifier exists in both work dirs (dev mode, the default variant: the folders 3-ulmfit-{labels}-seed{seed}-dev),
the SST-2 dev accuracy of the forward classifier, of the backward one (which reads every text backwards by itself:
its config says so) and of the ensemble (the mean of the two classifiers' class probabilities: `finetune eval`'s
ensemble, finetune/inference/ensemble.py). Both flows draw the same labelled rows for a seed (ulmfit_sst2.py draws
them from the seed alone). Where the forward work dir also holds classifiers of the --bilm-variants (step 3: one
classifier reading both stage-2 LMs, `model.backward_checkpoint`, trained on the same rows and budget), their dev
accuracy is a column too. Prints the table (median over seeds per label count), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from _common import GLUE, ROOT, append_result, require


def classifiers(work_dir: Path, variant: str = "") -> dict[tuple[int, int], Path]:
    """(labels, seed) -> checkpoint of every dev classifier of `variant` ("": the default) in a ulmfit_sst2.py work
    dir (its folders are 3-ulmfit-LABELS-seedSEED[-VARIANT]-dev)."""
    pattern = re.compile(r"3-ulmfit-(\d+)-seed(\d+)" + (f"-{re.escape(variant)}" if variant else "") + "-dev")
    found = {}
    for folder in work_dir.glob("3-ulmfit-*-dev"):
        match = pattern.fullmatch(folder.name)
        if match and (folder / "checkpoint" / "config.json").exists():
            found[int(match[1]), int(match[2])] = folder / "checkpoint"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forward", type=Path, required=True, help="ulmfit_sst2.py's work dir, forward flow")
    parser.add_argument("--backward", type=Path, required=True, help="its work dir of the backward flow")
    parser.add_argument(
        "--bilm-variants",
        nargs="*",
        default=["bilm", "bilm-mix"],
        help="variants of biLM classifiers in --forward, each a column where present",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="also append the result to bench/results/ulmfit_bidirectional.jsonl",
    )
    arguments = parser.parse_args()
    require(GLUE / "SST-2" / "dev.tsv", "GLUE SST-2 dev.tsv")
    forward, backward = classifiers(arguments.forward), classifiers(arguments.backward)
    bilm = {variant: classifiers(arguments.forward, variant) for variant in arguments.bilm_variants}
    pairs = sorted(set(forward) & set(backward))
    if not pairs:
        sys.exit(f"bench: no (labels, seed) has a dev classifier in both {arguments.forward} and {arguments.backward}")

    sys.path.insert(0, str(ROOT))
    from accelerate import Accelerator

    from finetune.data.reverse import reads_backwards, reads_both_directions
    from finetune.data.task_files import read_task_split
    from finetune.glue.specs import GLUE_TASKS
    from finetune.inference.ensemble import ensemble_outputs
    from finetune.inference.predict import example_logits, logits_to_predictions
    from finetune.models.heads import load_finetuned
    from finetune.models.hub import load_tokenizer
    from finetune.tasks.metrics import compute_metrics

    spec = GLUE_TASKS["sst2"]
    examples = read_task_split(spec, GLUE / "SST-2", "dev")
    accelerator = Accelerator(cpu=True)

    def logits(checkpoint: Path):
        model = load_finetuned(str(checkpoint), spec)
        return model.config, example_logits(
            accelerator, model, load_tokenizer(str(checkpoint)), examples, 400, 64
        )  # the ULMFiT classifier's max_length

    def accuracy(outputs) -> float:
        return float(compute_metrics(spec, logits_to_predictions(spec, outputs), examples.labels)["accuracy"])

    runs = []
    for labels, seed in pairs:
        forward_config, forward_logits = logits(forward[labels, seed])
        backward_config, backward_logits = logits(backward[labels, seed])
        if reads_backwards(forward_config) or not reads_backwards(backward_config):
            sys.exit(
                f"bench: {labels} labels, seed {seed}: the --forward classifier must read forwards and the "
                "--backward one backwards (finetune_reverse in config.json)"
            )
        runs.append(
            {
                "labels": labels,
                "seed": seed,
                "forward": accuracy(forward_logits),
                "backward": accuracy(backward_logits),
                "ensemble": accuracy(ensemble_outputs(spec, [forward_logits, backward_logits])),
            }
        )
        for variant, found in bilm.items():
            if (labels, seed) in found:
                config, outputs = logits(found[labels, seed])
                if not reads_both_directions(config):
                    sys.exit(f"bench: {found[labels, seed]} is not a biLM classifier (model.backward_checkpoint)")
                runs[-1][variant] = accuracy(outputs)
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)

    columns = ["forward", "backward", "ensemble"] + [variant for variant in bilm if any(variant in run for run in runs)]
    print(
        "\n| labels | seeds | forward | backward | ensemble (mean probabilities) |"
        + "".join(f" {variant} (one classifier, both LMs) |" for variant in columns[3:])
        + "\n|---:|---:|---:|---:|---:|"
        + "---:|" * len(columns[3:])
    )
    for labels in sorted({run["labels"] for run in runs}):
        rows = [run for run in runs if run["labels"] == labels]
        cells = []
        for column in columns:
            scores = [run[column] for run in rows if column in run]
            cells.append(
                f"{100 * statistics.median(scores):.1f}"
                + ("" if len(scores) == len(rows) else f" ({len(scores)} seeds)")
                if scores
                else "-"
            )
        print(f"| {labels:,} | {len(rows)} | " + " | ".join(cells) + " |")
    result = {"forward_dir": str(arguments.forward), "backward_dir": str(arguments.backward), "runs": runs}
    print(json.dumps(result))
    if arguments.update_results:  # quality only: the CPU and matmul rate are today's, read when appending
        append_result("ulmfit_bidirectional", result)


if __name__ == "__main__":
    main()
