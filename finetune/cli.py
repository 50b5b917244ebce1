"""The `finetune` command: thin typer wrappers that load a recipe and call one stage."""

from __future__ import annotations

import errno
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from finetune._version import __version__
from finetune.cli_recipes import recipes_app
from finetune.errors import RunFailed, RunInterrupted, UserError

app = typer.Typer(
    help="Transfer learning for NLP: pretrain a language model, fine-tune it with ULMFiT's techniques, "
    "evaluate on GLUE. Every command takes a recipe YAML file and optional dotted key=value overrides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

RecipeArgument = Annotated[
    Path,
    typer.Argument(
        help="Recipe YAML file, or a shipped recipe's name, e.g. finetune/minilm-sst2-lora (`finetune recipes` lists "
        "them).",
        show_default=False,
    ),
]
OverridesArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted key=value overrides applied on top of the recipe, e.g. training.lr=1e-3 "
        "run_dir=runs/try2. Values are parsed as YAML.",
        show_default=False,
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue the stopped run in the recipe's run_dir from its newest periodic checkpoint (see "
        "checkpoint_every), exactly as if it had not stopped; the recipe must be the one it started with.",
    ),
]


def _fail(message: str, code: int = 2) -> None:
    """Print a one-line error to stderr and exit with `code`: 2 for a user mistake, 1 for a run that failed."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def _finished_stages_kept(stage: str, command: str) -> str:
    """What an interrupted ulmfit flow still has: the stages it finished, which --resume keeps."""
    return f"; the flow's finished stages are kept: continue with: {command}" if stage == "ulmfit" else ""


def _run_stage(
    stage: str,
    recipe_path: Path,
    overrides: list[str] | None,
    runner: Callable,
    recipe_stages: tuple[str, ...] | None = None,
) -> None:
    """Validate the recipe completely, then run the stage; user mistakes and failed runs become one-line errors.

    Exit codes: 2 a mistake in the input, 1 a run that failed (diverged, out of memory, disk full),
    130 interrupted with Ctrl-C (the line printed says how to resume). `recipe_stages`: the recipe stages a
    command other than a stage's own accepts (lr-find: pretrain and finetune).
    """
    from finetune.console import quiet_library_chatter
    from finetune.recipes import load_recipe
    from finetune.recipes.shipped import resolve_recipe

    resume_command = shlex.join(["finetune", stage, str(recipe_path), *(overrides or []), "--resume"])
    try:
        expected_stage = None if recipe_stages else stage
        recipe = load_recipe(resolve_recipe(recipe_path), overrides or [], expected_stage=expected_stage)
        if recipe_stages and recipe.stage not in recipe_stages:
            raise UserError(
                f"{recipe_path}: `finetune {stage}` takes a {' or '.join(recipe_stages)} recipe; this "
                f"one's stage is '{recipe.stage}'"
            )
        quiet_library_chatter()
        runner(recipe)
    except UserError as error:  # an InputError from data or model loading that no stage named a key for, too
        _fail(str(error))
    except RunFailed as error:
        _fail(str(error), code=1)
    except RunInterrupted as interrupted:
        if interrupted.checkpoint is None:
            typer.echo(
                f"interrupted at step {interrupted.step}; no checkpoint was saved"
                + _finished_stages_kept(stage, resume_command),
                err=True,
            )
        else:
            typer.echo(
                f"interrupted at step {interrupted.step}; checkpoint saved to {interrupted.checkpoint}; "
                f"continue with: {resume_command}",
                err=True,
            )
        raise typer.Exit(code=130) from None  # the message above says what happened
    except KeyboardInterrupt:
        typer.echo("interrupted" + (_finished_stages_kept(stage, resume_command) or "; nothing was saved"), err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message
    except OSError as error:  # a full disk outside the checkpoints (which report it themselves): metrics, reports
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _fail(f"no space left on the device writing {error.filename or 'the run directory'}", code=1)


@app.command()
def pretrain(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: ResumeOption = False) -> None:
    """Pretrain a language model on text files: masked (bert), causal (gpt2) or ULMFiT's AWD-LSTM.

    Trains a tokenizer on the corpus (WordPiece for bert, byte-level BPE for the causal families) or
    reuses one, packs the text into blocks (BPTT streams for awd_lstm), and writes a Hugging Face
    checkpoint to RUN_DIR/checkpoint.
    """
    from finetune.stages.pretrain import run_pretrain

    _run_stage("pretrain", recipe, overrides, lambda loaded: run_pretrain(loaded, resume=resume))


@app.command()
def finetune(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: ResumeOption = False) -> None:
    """Fine-tune a pretrained checkpoint on a classification or regression task.

    Uses ULMFiT's discriminative learning rates, gradual unfreezing and slanted triangular
    learning rates, each set in the recipe; writes a Hugging Face checkpoint to RUN_DIR/checkpoint.
    With `seeds`, --resume keeps the seeds already finished and continues the one in progress.
    """
    from finetune.stages.finetune import run_finetune

    _run_stage("finetune", recipe, overrides, lambda loaded: run_finetune(loaded, resume=resume))


@app.command()
def ulmfit(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Finish a stopped flow: finished stages are kept (their sections unchanged), the stopped "
            "one continues from its newest periodic checkpoint, the later ones run.",
        ),
    ] = False,
) -> None:
    """Run ULMFiT's three stages in one go, each starting from the checkpoint of the one before.

    Stage 1: a general-domain language model (or general_lm.checkpoint); stage 2: that model fine-tuned on the
    task's text; stage 3: the classifier, with gradual unfreezing (RUN_DIR/1-general-lm, 2-target-lm, 3-classifier).

    Overrides reach into the stages (classifier.training.epochs=2); the summary goes to RUN_DIR/result.json.
    """
    from finetune.stages.ulmfit import run_ulmfit

    _run_stage("ulmfit", recipe, overrides, lambda loaded: run_ulmfit(loaded, resume=resume))


@app.command(name="lr-find")
def lr_find(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    steps: Annotated[int, typer.Option(min=5, help="Optimizer steps of the test.")] = 100,
    start_lr: Annotated[float, typer.Option(help="The top layer group's LR at the first step.")] = 1e-7,
    end_lr: Annotated[float, typer.Option(help="The top layer group's LR at the last step.")] = 10.0,
) -> None:
    """The learning-rate range test (fastai's lr_find) of a pretrain or finetune recipe.

    Trains the recipe's model for --steps steps while the LR grows exponentially from --start-lr to --end-lr,
    then prints and draws the smoothed loss against the LR with a suggested LR (the minimum's / 10). Writes to
    RUN_DIR-lr-find (lr_find.md, lr_find.json, lr_find.png); the recipe's run_dir stays free for the real run.
    """
    from finetune.stages.lr_find import run_lr_find

    _run_stage(
        "lr-find",
        recipe,
        overrides,
        lambda loaded: run_lr_find(loaded, steps, start_lr, end_lr),
        recipe_stages=("pretrain", "finetune"),
    )


@app.command()
def profile(
    recipe: RecipeArgument,
    overrides: OverridesArgument = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
    matmul_gflops: Annotated[
        float | None,
        typer.Option(
            "--matmul-gflops",
            min=0.001,
            help="Use this matmul rate (GFLOP/s) for the time estimate instead of "
            "measuring this machine's, e.g. another machine's.",
            show_default=False,
        ),
    ] = None,
    mfu: Annotated[
        float,
        typer.Option(min=0.001, max=1.0, help="The model FLOP utilisation assumed for the time estimate (a fraction)."),
    ] = 0.5,
) -> None:
    """What a pretrain, finetune or ulmfit recipe will cost, before any training: parameters, FLOPs, memory, time.

    Builds the recipe's model on PyTorch's meta device (no weights, no data read, nothing written or downloaded)
    and prints its parameters (total, trainable at the start, embeddings), training FLOPs per token and per step,
    fp32 memory for weights, gradients and AdamW with an activation estimate, and an estimated time per step.
    """
    import json

    from rich.console import Console

    from finetune.reporting.profile_report import profile_tables
    from finetune.stages.profile import profile_recipe

    def show(loaded) -> None:
        if loaded.stage == "eval":
            raise UserError(
                f"recipe {recipe}: `finetune profile` is for training recipes (pretrain, finetune, "
                "ulmfit); an eval recipe trains nothing"
            )
        report = profile_recipe(loaded, matmul_gflops, mfu)
        if as_json:
            typer.echo(json.dumps({"recipe": str(recipe), **report}, indent=2))
            return
        for table in profile_tables(report, str(recipe)):
            Console().print(table)

    _run_stage("profile", recipe, overrides, show, recipe_stages=("pretrain", "finetune", "ulmfit", "eval"))


@app.command(name="predict")
def predict_command(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="A checkpoint fine-tuned by `finetune finetune` (its checkpoint/ folder), or a hub name.",
            show_default=False,
        ),
    ],
    input_file: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="Plain text, one example per line (a pair "
            "task: two texts separated by a tab), or a .tsv/.csv/.jsonl file "
            "with the task's text columns; - reads stdin.",
        ),
    ] = "-",
    output_file: Annotated[
        str, typer.Option("--output", "-o", help="A .jsonl, .tsv or .csv file; - writes JSON lines to stdout.")
    ] = "-",
    batch_size: Annotated[int, typer.Option(min=1, help="Examples per batch.")] = 64,
    max_length: Annotated[
        int | None, typer.Option(min=1, help="Tokens per example; default: the checkpoint's task.max_length.")
    ] = None,
) -> None:
    """Predict labels and probabilities (scores for regression) for raw text with a fine-tuned checkpoint."""
    from finetune.console import console, quiet_library_chatter
    from finetune.stages.predict import run_predict

    try:
        quiet_library_chatter()
        count = run_predict(checkpoint, input_file, output_file, batch_size, max_length)
    except UserError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        typer.echo("interrupted; nothing was written", err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message
    if output_file != "-":
        console.print(f"{count:,} predictions written to {output_file}")


CausalCheckpointArgument = Annotated[
    str,
    typer.Argument(
        help="A causal language model written by `finetune pretrain` (gpt2, Transformer-XL or sparse, AWD-LSTM / "
        "QRNN / RNN, n-gram: its checkpoint/ folder), or a hub name.",
        show_default=False,
    ),
]


DocumentOption = Annotated[
    str | None,
    typer.Option(
        help="What a document of the text is, as corpus.document says for pretraining: line, paragraph or file (the "
        "whole text, line breaks kept). Default: what the checkpoint's own pretraining read (its saved recipe), else "
        "line.",
        show_default=False,
    ),
]


@app.command()
def generate(
    checkpoint: CausalCheckpointArgument,
    prompt: Annotated[
        str | None,
        typer.Option(
            "--prompt",
            "-p",
            help="Text to continue, read as pretraining reads text (each line a document; the model "
            "continues the last). Default: stdin when it is piped, else none (a new document).",
            show_default=False,
        ),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate per sample, at most.")] = 100,
    greedy: Annotated[
        bool,
        typer.Option(
            "--greedy",
            help="Take the most probable token every time instead of "
            "sampling (--temperature, --top-k and --top-p then do nothing).",
        ),
    ] = False,
    temperature: Annotated[
        float, typer.Option(help="Divide the logits by this before sampling: below 1 sharper, above 1 flatter.")
    ] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k most probable tokens only; 0: all.")] = 0,
    top_p: Annotated[
        float,
        typer.Option(help="Sample among the fewest tokens whose probabilities add up to p (nucleus sampling); 1: all."),
    ] = 1.0,
    num_samples: Annotated[
        int, typer.Option("--num-samples", "-n", min=1, help="Samples to draw, one after another.")
    ] = 1,
    seed: Annotated[
        int | None, typer.Option(help="Seed the sampling: the same seed gives the same samples.", show_default=False)
    ] = None,
    stop_at_eos: Annotated[
        bool,
        typer.Option(
            "--stop-at-eos/--no-stop-at-eos",
            help="End a sample at <|endoftext|>, the end of the document it writes; "
            "--no-stop-at-eos writes on into new documents (shown separated by <|endoftext|>) up to "
            "--max-new-tokens.",
        ),
    ] = True,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="Also write the samples as JSON Lines to this file (prompt, sample, seed, text, "
            "new_tokens, stop); - writes them to stdout instead of the streamed text.",
            show_default=False,
        ),
    ] = None,
    document: DocumentOption = None,
) -> None:
    """Generate text with a causal language model, streamed to the terminal as it is produced.

    The prompt is encoded as pretraining read text (after <|endoftext|>), and every family generates through
    transformers' `generate`: the same tokens as `model.generate(...)` from Python.
    """
    import sys

    from finetune.console import quiet_library_chatter
    from finetune.stages.generate import Sampling, run_generate

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    if prompt is None:
        prompt = "" if sys.stdin.isatty() else sys.stdin.read()
    sampling = Sampling(
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_at_end_of_text=stop_at_eos,
    )
    try:
        quiet_library_chatter()
        run_generate(checkpoint, prompt, sampling, num_samples, seed, output, write, document)
    except UserError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message


@app.command()
def score(
    checkpoint: CausalCheckpointArgument,
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Text files, one document per line as pretraining reads them, scored as one text.", show_default=False
        ),
    ],
    segment_length: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Tokens read at a time; default: the model's positions (the block it trained on), or 1024 for a "
            "model without a position table.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the line.")] = False,
    document: DocumentOption = None,
) -> None:
    """Nats per token and perplexity of text files under a causal language model (any family pretrain writes).

    Every token and every document's end is predicted from the text before it, read in order as pretraining's
    validation reads it: the AWD-LSTM's state and Transformer-XL's memory carried from segment to segment.
    """
    import json

    from finetune.console import quiet_library_chatter
    from finetune.stages.language_model_validation import score_text

    try:
        quiet_library_chatter()
        result = score_text(checkpoint, files, segment_length, document=document)
    except UserError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message
    if as_json:
        typer.echo(json.dumps({"checkpoint": checkpoint, "files": [str(path) for path in files], **result}))
        return
    typer.echo(
        f"{result['tokens']:,} tokens: {result['nats_per_token']:.4f} nats per token, perplexity "
        f"{result['perplexity']:.2f}, next-token accuracy {result['next_token_accuracy']:.4f}"
    )


@app.command(name="push")
def push(
    run_dir: Annotated[
        Path, typer.Argument(help="A finished run directory (or its checkpoint folder).", show_default=False)
    ],
    repo_id: Annotated[
        str,
        typer.Argument(
            help="The hub model repository, e.g. your-name/minilm-sst2 (created if needed).", show_default=False
        ),
    ],
    private: Annotated[bool, typer.Option("--private", help="Create the repository private.")] = False,
) -> None:
    """Upload a run's final checkpoint (weights, tokenizer, recipe, model card) to the Hugging Face hub."""
    from finetune.stages.push import push_checkpoint

    try:
        push_checkpoint(run_dir, repo_id, private=private)
    except UserError as error:
        _fail(str(error))


@app.command()
def merge(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="A checkpoint trained with a LoRA adapter (model.adapter): its folder, as finetune or pretrain saved "
            "it.",
            show_default=False,
        ),
    ],
    output: Annotated[Path, typer.Argument(help="A new folder for the merged model.", show_default=False)],
) -> None:
    """Merge a LoRA adapter into its base: a plain Hugging Face model folder that `AutoModelFor*.from_pretrained`
    loads without peft (predict, eval and later stages take the adapter's folder as it is too)."""
    from finetune.console import quiet_library_chatter
    from finetune.stages.merge import run_merge

    try:
        quiet_library_chatter()
        run_merge(checkpoint, output)
    except UserError as error:
        _fail(str(error))


@app.command(name="eval")
def evaluate(recipe: RecipeArgument, overrides: OverridesArgument = None) -> None:
    """Score fine-tuned checkpoints on a task split, or on GLUE tasks; write RUN_DIR/report.json and report.md.

    With `tasks` (GLUE task -> checkpoints) the report has each task's dev scores over its runs, the
    GLUE score under each convention and the missing tasks; `submission: true` also writes
    RUN_DIR/submission.zip for the leaderboard (check it with `finetune validate-submission`).
    """
    from finetune.stages.evaluate import run_eval

    _run_stage("eval", recipe, overrides, run_eval)


@app.command(name="validate-submission")
def validate_submission_command(
    archive: Annotated[
        Path, typer.Argument(help="The GLUE submission zip, e.g. RUN_DIR/submission.zip.", show_default=False)
    ],
    glue_dir: Annotated[
        Path | None,
        typer.Option(
            "--glue-dir",
            help="GLUE root (download_glue_data.py's layout): rows are checked against its test files, "
            "index by index; without it, against the official test-set sizes.",
            show_default=False,
        ),
    ] = None,
    allow_incomplete: Annotated[
        bool, typer.Option("--allow-incomplete", help="Accept an archive without some tasks' files (they are listed).")
    ] = False,
) -> None:
    """Check a GLUE leaderboard archive: file names at its root, headers, labels, row counts, index coverage.

    Exits 0 when the archive is valid, 1 when it has problems or lacks tasks (each one printed).
    """
    from finetune.glue.specs import SUBMISSION_FILES
    from finetune.glue.submission import glue_test_ids, validate_submission

    try:
        if not archive.is_file():
            raise UserError(f"{archive}: no such file")
        if glue_dir is not None and not glue_dir.is_dir():
            raise UserError(f"--glue-dir: no such folder: {glue_dir}")
        test_ids = glue_test_ids(glue_dir) if glue_dir is not None else {}
        check = validate_submission(archive, test_ids)
    except UserError as error:
        _fail(str(error))
    file_of = {spec.name: file_name for file_name, spec in SUBMISSION_FILES.items()}  # the tasks an archive holds
    for name in check.present:
        file_name = file_of[name]
        against = "test file" if name in test_ids else "official test-set size"
        typer.echo(f"{file_name}: {check.rows[file_name]} rows (checked against the {against})")
    if check.missing:
        typer.echo("missing: " + ", ".join(file_of[name] for name in check.missing))
    for problem in check.problems:
        typer.echo(f"problem: {problem}", err=True)
    if not check.accepted(allow_incomplete):
        typer.echo(
            f"{archive}: not valid" + ("" if check.problems else " (incomplete; --allow-incomplete accepts it)"),
            err=True,
        )
        raise typer.Exit(code=1)
    typer.echo(f"{archive}: valid" + (f", {len(check.missing)} task(s) missing" if check.missing else ", complete"))


app.add_typer(recipes_app, name="recipes")


@app.command()
def plot(
    run_dir: Annotated[
        Path, typer.Argument(help="A pretrain or finetune run directory (it holds metrics.jsonl).", show_default=False)
    ],
) -> None:
    """Draw a run's plots again from its metrics.jsonl into RUN_DIR/plots/: loss, LRs, evaluations, throughput.

    Every run draws them when it ends; a multi-seed run directory gets the plots of each seed-N folder.
    """
    from finetune.reporting.plots import write_plots
    from finetune.run_dir import METRICS_FILE

    if not run_dir.is_dir():
        _fail(f"{run_dir}: no such folder")
    targets = (
        [run_dir]
        if (run_dir / METRICS_FILE).is_file()
        else sorted(path.parent for path in run_dir.glob(f"seed-*/{METRICS_FILE}"))
    )
    if not targets:
        _fail(f"{run_dir}: not a run directory (no {METRICS_FILE})")
    for target in targets:
        try:
            written = write_plots(target)
        except UserError as error:  # a metrics.jsonl line that is not a JSON object, named by read_metrics
            _fail(str(error))
        for path in written:
            typer.echo(str(path))


runs_app = typer.Typer(no_args_is_help=True)
app.add_typer(runs_app, name="runs")


@runs_app.callback()
def runs() -> None:
    """Look at finished runs side by side (`finetune runs compare`)."""


@runs_app.command()
def compare(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories (pretrain or finetune) to compare.", show_default=False)
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the Markdown report to this file and the overlay PNG beside it (report.md -> "
            "report.png); without it the report is printed and the PNG written to runs/runs-compare.png.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Compare runs: a Markdown table of the recipe keys that differ, final metrics, wall time and throughput.

    Also draws the runs' training loss and main evaluation metric over each other in one PNG.
    """
    from finetune.reporting.compare import compare_runs

    try:
        markdown, curves = compare_runs(run_dirs, output)
    except UserError as error:
        _fail(str(error))
    if output is None:
        typer.echo(markdown, nl=False)
    else:
        typer.echo(f"report written to {output}", err=True)
    typer.echo(f"curves written to {curves}", err=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"finetune {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = None,
) -> None:
    """Transfer learning for NLP in the line of ULMFiT, GPT and BERT."""
