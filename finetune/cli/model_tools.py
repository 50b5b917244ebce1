"""The commands that run or reshape a language model's checkpoint: generate, score, push, merge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from finetune.cli.common import _fail, refuse_missing_model_folder
from finetune.errors import UserError

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


# generate's longer options, named here to keep its signature readable
PromptOption = Annotated[
    str | None,
    typer.Option(
        "--prompt",
        "-p",
        help="Text to continue, read as pretraining reads text (each line a document; the model "
        "continues the last). Default: stdin when it is piped, else none (a new document).",
        show_default=False,
    ),
]

GreedyOption = Annotated[
    bool,
    typer.Option(
        "--greedy",
        help="Take the most probable token every time instead of "
        "sampling (--temperature, --top-k and --top-p then do nothing).",
    ),
]

StopAtEosOption = Annotated[
    bool,
    typer.Option(
        "--stop-at-eos/--no-stop-at-eos",
        help="End a sample at <|endoftext|>, the end of the document it writes; "
        "--no-stop-at-eos writes on into new documents (shown separated by <|endoftext|>) up to "
        "--max-new-tokens.",
    ),
]

SamplesOutputOption = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-o",
        help="Also write the samples as JSON Lines to this file (prompt, sample, seed, text, "
        "new_tokens, stop); - writes them to stdout instead of the streamed text.",
        show_default=False,
    ),
]


def generate(
    checkpoint: CausalCheckpointArgument,
    prompt: PromptOption = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate per sample, at most.")] = 100,
    greedy: GreedyOption = False,
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
    stop_at_eos: StopAtEosOption = True,
    min_new_tokens: Annotated[
        int, typer.Option(help="Tokens to generate per sample before <|endoftext|> may end it; 0: no minimum.")
    ] = 0,
    output: SamplesOutputOption = None,
    document: DocumentOption = None,
) -> None:
    """Generate text with a causal language model, streamed to the terminal as it is produced.

    The prompt is encoded as pretraining read text (after <|endoftext|>), and every family generates through
    transformers' `generate`: the same tokens as `model.generate(...)` from Python.
    """
    refuse_missing_model_folder(checkpoint)
    import sys

    from finetune.commands.generate import Sampling, run_generate
    from finetune.console import quiet_library_chatter

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
        min_new_tokens=min_new_tokens,
    )
    try:
        quiet_library_chatter()
        run_generate(checkpoint, prompt, sampling, num_samples, seed, output, write, document)
    except UserError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        raise typer.Exit(code=130) from None  # the interruption is the message


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
    refuse_missing_model_folder(checkpoint)
    import json

    from finetune.console import quiet_library_chatter
    from finetune.inference.language_model_validation import score_text

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
    from finetune.commands.push import push_checkpoint

    try:
        push_checkpoint(run_dir, repo_id, private=private)
    except UserError as error:
        _fail(str(error))


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
    refuse_missing_model_folder(checkpoint)
    from finetune.commands.merge import run_merge
    from finetune.console import quiet_library_chatter

    try:
        quiet_library_chatter()
        run_merge(checkpoint, output)
    except UserError as error:
        _fail(str(error))
