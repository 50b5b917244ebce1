"""ULMFiT's bidirectional model on SST-2: a forward and a backward classifier, each alone and averaged.

    # 1. the forward flow: bench/ulmfit_sst2.py as documented there (its work dir keeps every classifier)
    # 2. the same flow read backwards: stage 1 trains on reversed documents; stages 2 and 3 follow its checkpoint
    .venv/bin/python bench/ulmfit_sst2.py --work-dir /work/bench-ulmfit-backward --sides ulmfit \
        --general-lm-overrides corpus.reverse=true
    # 3. this table
    .venv/bin/python bench/ulmfit_bidirectional.py --forward /work/bench-ulmfit-lr --backward /work/bench-ulmfit-backward

Howard & Ruder (2018), section 3.3: "we pretrain both a forward and a backward LM ... fine-tune a classifier for
each LM independently ... average the classifier predictions". Here: for every (labels, seed) whose ULMFiT
classifier exists in both work dirs (dev mode, the default variant: the folders 3-ulmfit-{labels}-seed{seed}-dev),
the SST-2 dev accuracy of the forward classifier, of the backward one (which reads every text backwards by itself:
its config says so) and of the ensemble (the mean of the two classifiers' class probabilities: `finetune eval`'s
ensemble, finetune/training/ensemble.py). Both flows draw the same labelled rows for a seed (ulmfit_sst2.py draws
them from the seed alone). Prints the table (median over seeds per label count), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from _common import GLUE, ROOT, require

FOLDER = re.compile(r"3-ulmfit-(\d+)-seed(\d+)-dev")


def classifiers(work_dir: Path) -> dict[tuple[int, int], Path]:
    """(labels, seed) -> checkpoint of every default-variant dev classifier in a ulmfit_sst2.py work dir."""
    found = {}
    for folder in work_dir.glob("3-ulmfit-*-dev"):
        match = FOLDER.fullmatch(folder.name)
        if match and (folder / "checkpoint" / "config.json").exists():
            found[int(match[1]), int(match[2])] = folder / "checkpoint"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forward", type=Path, required=True, help="ulmfit_sst2.py's work dir, forward flow")
    parser.add_argument("--backward", type=Path, required=True, help="its work dir of the backward flow")
    arguments = parser.parse_args()
    require(GLUE / "SST-2" / "dev.tsv", "GLUE SST-2 dev.tsv")
    forward, backward = classifiers(arguments.forward), classifiers(arguments.backward)
    pairs = sorted(set(forward) & set(backward))
    if not pairs:
        sys.exit(f"bench: no (labels, seed) has a dev classifier in both {arguments.forward} and {arguments.backward}")

    sys.path.insert(0, str(ROOT))
    from accelerate import Accelerator

    from finetune.data.reverse import reads_backwards
    from finetune.data.tasks import read_task_split
    from finetune.glue.metrics import compute_metrics
    from finetune.glue.specs import GLUE_TASKS
    from finetune.models.heads import load_finetuned
    from finetune.models.hub import load_tokenizer
    from finetune.training.ensemble import ensemble_outputs
    from finetune.training.predict import example_logits, logits_to_predictions

    spec = GLUE_TASKS["sst2"]
    examples = read_task_split(spec, GLUE / "SST-2", "dev")
    accelerator = Accelerator(cpu=True)

    def logits(checkpoint: Path):
        model = load_finetuned(str(checkpoint), spec, "checkpoint")
        return model.config, example_logits(accelerator, model, load_tokenizer(str(checkpoint), "checkpoint"),
                                            examples, 400, 64)  # the ULMFiT classifier's max_length

    def accuracy(outputs) -> float:
        return float(compute_metrics(spec, logits_to_predictions(spec, outputs), examples.labels)["accuracy"])

    runs = []
    for labels, seed in pairs:
        forward_config, forward_logits = logits(forward[labels, seed])
        backward_config, backward_logits = logits(backward[labels, seed])
        if reads_backwards(forward_config) or not reads_backwards(backward_config):
            sys.exit(f"bench: {labels} labels, seed {seed}: the --forward classifier must read forwards and the "
                     "--backward one backwards (finetune_reverse in config.json)")
        runs.append({"labels": labels, "seed": seed, "forward": accuracy(forward_logits),
                     "backward": accuracy(backward_logits),
                     "ensemble": accuracy(ensemble_outputs(spec, [forward_logits, backward_logits]))})
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)

    print("\n| labels | seeds | forward | backward | ensemble (mean probabilities) |\n|---:|---:|---:|---:|---:|")
    for labels in sorted({run["labels"] for run in runs}):
        rows = [run for run in runs if run["labels"] == labels]
        medians = {side: 100 * statistics.median(run[side] for run in rows) for side in ("forward", "backward",
                                                                                         "ensemble")}
        print(f"| {labels:,} | {len(rows)} | {medians['forward']:.1f} | {medians['backward']:.1f} | "
              f"{medians['ensemble']:.1f} |")
    print(json.dumps({"forward_dir": str(arguments.forward), "backward_dir": str(arguments.backward), "runs": runs}))


if __name__ == "__main__":
    main()
