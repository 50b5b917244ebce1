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
accuracy is an arm too. Prints the table (median over seeds per label count and arm); a record per arm and (labels,
seed) goes to WORK/runs.jsonl (--work, default runs/bench-ulmfit-bidirectional) and with --update-results to
bench/results/ulmfit_bidirectional.jsonl. --smoke runs ulmfit_sst2.py --smoke forwards and backwards into the work
folder and scores those two (held-out mode).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import _harness as harness
from _common import GLUE, ROOT, require, run


def classifiers(work_dir: Path, variant: str = "", mode: str = "dev") -> dict[tuple[int, int], Path]:
    """(labels, seed) -> checkpoint of every classifier of `variant` ("": the default) in a ulmfit_sst2.py work dir
    (its folders are 3-ulmfit-LABELS-seedSEED[-VARIANT]-MODE)."""
    pattern = re.compile(r"3-ulmfit-(\d+)-seed(\d+)" + (f"-{re.escape(variant)}" if variant else "") + f"-{mode}")
    found = {}
    for folder in work_dir.glob(f"3-ulmfit-*-{mode}"):
        match = pattern.fullmatch(folder.name)
        if match and (folder / "checkpoint" / "config.json").exists():
            found[int(match[1]), int(match[2])] = folder / "checkpoint"
    return found


def main() -> None:
    smoke = "ulmfit_sst2.py --smoke forwards and backwards into the work folder, then this table of those two"
    parser = harness.benchmark_parser(__doc__, "ulmfit-bidirectional", smoke=smoke)
    parser.add_argument("--forward", type=Path, help="ulmfit_sst2.py's work dir, forward flow")
    parser.add_argument("--backward", type=Path, help="its work dir of the backward flow")
    parser.add_argument("--bilm-variants", nargs="*", default=["bilm", "bilm-mix"],
                        help="variants of biLM classifiers in --forward, each an arm where present")  # fmt: skip
    args = parser.parse_args()
    work = harness.work_folder(args, "ulmfit-bidirectional")
    mode = "held-out" if args.smoke else "dev"
    if args.smoke:
        args.forward, args.backward = work / "forward", work / "backward"
        for folder, extra in ((args.forward, []), (args.backward, ["--general-lm-overrides", "corpus.reverse=true"])):
            script = [sys.executable, ROOT / "bench" / "ulmfit_sst2.py", "--smoke", "--sides", "ulmfit"]
            run([*script, "--work", folder, *extra], cwd=ROOT)
    if args.forward is None or args.backward is None:
        sys.exit("bench: give --forward and --backward (ulmfit_sst2.py's work dirs), or --smoke")
    require(GLUE / "SST-2" / "dev.tsv", "GLUE SST-2 dev.tsv")
    forward, backward = classifiers(args.forward, mode=mode), classifiers(args.backward, mode=mode)
    bilm = {variant: classifiers(args.forward, variant, mode) for variant in args.bilm_variants}
    pairs = sorted(set(forward) & set(backward))
    if not pairs:
        sys.exit(f"bench: no (labels, seed) has a {mode} classifier in both {args.forward} and {args.backward}")

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

    def logits(checkpoint: Path):  # 400: the ULMFiT classifier's max_length
        model = load_finetuned(str(checkpoint), spec)
        return model.config, example_logits(accelerator, model, load_tokenizer(str(checkpoint)), examples, 400, 64)

    def accuracy(outputs) -> float:
        return float(compute_metrics(spec, logits_to_predictions(spec, outputs), examples.labels)["accuracy"])

    dirs = {"forward_dir": str(args.forward), "backward_dir": str(args.backward)}
    records = []
    for labels, seed in pairs:
        (forward_config, forward_logits), (backward_config, backward_logits) = map(
            logits, (forward[labels, seed], backward[labels, seed])
        )
        if reads_backwards(forward_config) or not reads_backwards(backward_config):
            sys.exit(f"bench: {labels} labels, seed {seed}: the --forward classifier must read forwards and the "
                     "--backward one backwards (finetune_reverse in config.json)")  # fmt: skip
        scores = {"forward": accuracy(forward_logits), "backward": accuracy(backward_logits),
                  "ensemble": accuracy(ensemble_outputs(spec, [forward_logits, backward_logits]))}  # fmt: skip
        for variant, found in bilm.items():
            if (labels, seed) in found:
                config, outputs = logits(found[labels, seed])
                if not reads_both_directions(config):
                    sys.exit(f"bench: {found[labels, seed]} is not a biLM classifier (model.backward_checkpoint)")
                scores[variant] = accuracy(outputs)
        for arm, value in scores.items():
            records.append({"arm": arm, "labels": labels, "seed": seed, "dev_accuracy": value, **dirs})
            harness.record_run(work, records[-1], "ulmfit_bidirectional" if args.update_results else None)
    rows = harness.medians(records, ("labels", "arm"), lambda record: 100 * record["dev_accuracy"])
    print("\nSST-2 dev accuracy x100, median over seeds (ensemble: the mean of the two classifiers' probabilities; "
          "bilm variants: one classifier on both LMs)\n")  # fmt: skip
    print(harness.markdown_table(rows, {"labels": "labels", "arm": "arm", "seeds": "n", "dev accuracy": "median"}))


if __name__ == "__main__":
    main()
