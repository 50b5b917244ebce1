"""The commands that train, or size a training run: pretrain, finetune, ulmfit, intermediate, lr-find, profile."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from finetune.cli.common import FlowResumeOption, OverridesArgument, RecipeArgument, ResumeOption, _run_stage
from finetune.errors import UserError


def pretrain(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: ResumeOption = False) -> None:
    """Pretrain a language model on text files: masked (bert), causal (gpt2) or ULMFiT's AWD-LSTM.

    Trains a tokenizer on the corpus (WordPiece for bert, byte-level BPE for the causal families) or
    reuses one, packs the text into blocks (BPTT streams for awd_lstm), and writes a Hugging Face
    checkpoint to RUN_DIR/checkpoint.
    """

    def run(loaded) -> None:
        from finetune.stages.pretrain import run_pretrain  # after the recipe is checked: a mistake needs no torch

        run_pretrain(loaded, resume=resume)

    _run_stage("pretrain", recipe, overrides, run)


def finetune(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: ResumeOption = False) -> None:
    """Fine-tune a pretrained checkpoint on a classification or regression task.

    Uses ULMFiT's discriminative learning rates, gradual unfreezing and slanted triangular
    learning rates, each set in the recipe; writes a Hugging Face checkpoint to RUN_DIR/checkpoint.
    With `seeds`, --resume keeps the seeds already finished and continues the one in progress.
    """

    from finetune.data.task_paths import check_task_files, training_splits

    def run(loaded) -> None:
        from finetune.stages.finetune import run_finetune  # after the recipe is checked: a mistake needs no torch

        run_finetune(loaded, resume=resume)

    def check(loaded) -> None:  # the task's files, found before the libraries that read them load
        check_task_files(loaded.task, training_splits(loaded.task))

    _run_stage("finetune", recipe, overrides, run, check=check)


def ulmfit(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: FlowResumeOption = False) -> None:
    """Run ULMFiT's three stages in one go, each starting from the checkpoint of the one before.

    Stage 1: a general-domain language model (or general_lm.checkpoint); stage 2: that model fine-tuned on the
    task's text; stage 3: the classifier, with gradual unfreezing (RUN_DIR/1-general-lm, 2-target-lm, 3-classifier).

    Overrides reach into the stages (classifier.training.epochs=2); the summary goes to RUN_DIR/result.json.
    """

    def run(loaded) -> None:
        from finetune.stages.ulmfit import run_ulmfit  # after the recipe is checked: a mistake needs no torch

        run_ulmfit(loaded, resume=resume)

    _run_stage("ulmfit", recipe, overrides, run)


def intermediate(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: FlowResumeOption = False) -> None:
    """Intermediate-task training (STILTs): task A, then task B from A's encoder under a new head.

    Stage 1: the intermediate task from intermediate.model.checkpoint; stage 2: the target task from stage 1's
    encoder; stage 3 (compare: true): the target task from intermediate.model.checkpoint alone, to compare
    (RUN_DIR/1-intermediate, 2-target, 3-target-alone).

    Overrides reach into the stages (target.training.epochs=2); RUN_DIR/report.md compares B with and without A.
    """

    def run(loaded) -> None:
        from finetune.stages.intermediate import run_intermediate  # after the recipe is checked

        run_intermediate(loaded, resume=resume)

    _run_stage("intermediate", recipe, overrides, run)


def multitask(recipe: RecipeArgument, overrides: OverridesArgument = None, resume: ResumeOption = False) -> None:
    """Fine-tune several tasks at once: one shared encoder, a head per task (MT-DNN).

    Each optimizer step trains one task, drawn by `sampling` (proportional to its rows, a temperature on that, or
    equal), its loss times its `loss_weights` entry; each evaluation scores every task, and their mean (or
    metric_for_best's task) keeps the best. Writes RUN_DIR/checkpoint/TASK for each task: a Hugging Face checkpoint
    of the encoder with that task's head, which predict, eval, export and finetune take as they are.
    """

    from finetune.data.task_paths import check_task_files, training_splits

    def run(loaded) -> None:
        from finetune.stages.multitask import run_multitask  # after the recipe is checked: a mistake needs no torch

        run_multitask(loaded, resume=resume)

    def check(loaded) -> None:  # every task's files, found before the libraries that read them load
        for task in loaded.tasks:
            check_task_files(task.task, training_splits(task.task))

    _run_stage("multitask", recipe, overrides, run, check=check)


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

    def run(loaded) -> None:
        from finetune.stages.lr_find import run_lr_find  # after the recipe is checked: a mistake needs no torch

        run_lr_find(loaded, steps, start_lr, end_lr)

    _run_stage("lr-find", recipe, overrides, run, recipe_stages=("pretrain", "finetune"))


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
    """What a pretrain, finetune, ulmfit, intermediate or multitask recipe will cost, before any training:
    parameters, FLOPs, memory, time (a flow's: each stage's; a multitask recipe's: each task's step).

    Builds the recipe's model on PyTorch's meta device (no weights, no data read, nothing written or downloaded)
    and prints its parameters (total, trainable at the start, embeddings), training FLOPs per token and per step,
    fp32 memory for weights, gradients and AdamW with an activation estimate, and an estimated time per step.
    """

    def show(loaded) -> None:
        if loaded.stage == "eval":
            raise UserError(
                f"recipe {recipe}: `finetune profile` is for training recipes (pretrain, finetune, "
                "ulmfit, intermediate, multitask); an eval recipe trains nothing"
            )
        from finetune.commands.profile import profile_recipe  # after the recipe is checked: a mistake needs no torch
        from finetune.reporting.profile_report import profile_tables

        report = profile_recipe(loaded, matmul_gflops, mfu)
        if as_json:
            typer.echo(json.dumps({"recipe": str(recipe), **report}, indent=2))
            return
        for table in profile_tables(report, str(recipe)):
            Console().print(table)

    stages = ("pretrain", "finetune", "ulmfit", "intermediate", "multitask", "eval")
    _run_stage("profile", recipe, overrides, show, recipe_stages=stages)
