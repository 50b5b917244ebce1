"""`finetune generate CHECKPOINT`: text sampled from a causal language model this toolkit writes, streamed as it comes.

Every family generates through transformers' `generate`: GPT2LMHeadModel with its key/value cache; our own model
types through the contract of models/generation.py (the causal transformer carrying its memory, the AWD-LSTM /
QRNN / RNN its recurrent state one token per step, the n-gram model reading its last n - 1 tokens). So greedy
search, temperature, top-k and top-p mean exactly what they mean there, and `model.generate(...)` gives the same
tokens from Python.

The prompt is read as pretraining read text: each non-empty line a document (stripped), each document after
<|endoftext|>, so the model continues the prompt's last line as the document it begins, and an empty prompt starts a
new document. Generation stops at <|endoftext|> (the end of that document) unless told not to; then the documents
it goes on to write are separated by <|endoftext|> in the text, as in a corpus.

Text is decoded incrementally by transformers' TextStreamer, which holds back a token's bytes until they make whole
characters (byte-level BPE splits a character's UTF-8 bytes over tokens). Samples are drawn one after another from
one seeded generator, so the same --seed gives the same samples whether they are streamed or written as JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TextStreamer

from finetune.console import console
from finetune.data.corpus import text_documents
from finetune.data.reverse import reads_backwards
from finetune.data.token_cache import encode
from finetune.errors import UserError, recipe_key
from finetune.inference.language_model_validation import learned_positions, load_causal_language_model
from finetune.training.checkpoints import trained_document_kind


@dataclass(frozen=True)
class Sampling:
    """How each new token is chosen, and when a sample ends (the CLI's options, with their defaults)."""

    max_new_tokens: int = 100
    greedy: bool = False  # the most probable token every time (temperature, top-k and top-p then do nothing)
    temperature: float = 1.0  # logits divided by it: below 1 sharper, above 1 flatter
    top_k: int = 0  # sample among the k most probable tokens only; 0: all
    top_p: float = 1.0  # sample among the fewest tokens whose probabilities add up to p (nucleus); 1: all
    stop_at_end_of_text: bool = True  # end a sample at <|endoftext|>, the end of the document it writes
    min_new_tokens: int = 0  # <|endoftext|> is not drawn before this many new tokens (a document at least this long)

    def check(self) -> None:
        """Values `generate` would refuse with a traceback, or accept and ignore, as one line naming the option."""
        if self.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens: at least 1 (got {self.max_new_tokens})")
        if not self.temperature > 0:
            raise UserError(f"--temperature: above 0 (got {self.temperature}); --greedy takes the most probable token")
        if self.top_k < 0:
            raise UserError(f"--top-k: 0 (off) or more (got {self.top_k})")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p: in (0, 1] (got {self.top_p})")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise UserError(
                f"--min-new-tokens: from 0 to --max-new-tokens ({self.max_new_tokens}) (got {self.min_new_tokens})"
            )


@dataclass(frozen=True)
class Sample:
    """One generated continuation of the prompt."""

    text: str  # the new text only, decoded as it was streamed
    new_tokens: int
    ended_document: bool  # true: it stopped at <|endoftext|>; false: at --max-new-tokens


def prompt_ids(tokenizer, prompt: str, document: str = "line") -> list[int]:
    """The prompt as pretraining read text: <|endoftext|>, then each document's ids (`document`: each non-empty line,
    paragraph, or the whole prompt, as corpus.document read it), <|endoftext|> between."""
    separator = tokenizer.eos_token_id
    ids = [separator]
    with recipe_key("--document"):
        documents = text_documents(prompt, document)
    for index, document_ids in enumerate(encode(tokenizer, documents) if documents else []):
        ids += document_ids + ([separator] if index < len(documents) - 1 else [])
    return ids


class _CallbackStreamer(TextStreamer):
    """TextStreamer's incremental decoding, its text handed to a callback instead of printed."""

    def __init__(self, tokenizer, on_text: Callable[[str], None], **decode_options):
        super().__init__(tokenizer, skip_prompt=True, **decode_options)
        self.on_text = on_text

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.on_text(text)


def generate_samples(
    model,
    tokenizer,
    prompt: str,
    sampling: Sampling = Sampling(),
    count: int = 1,
    seed: int | None = None,
    on_text: Callable[[str], None] | None = None,
    document: str = "line",
) -> Iterator[Sample]:
    """`count` continuations of `prompt` by a loaded causal model, each yielded when it is complete; `on_text`
    receives the text of the one in progress as it is produced (whole characters only). `seed` seeds torch's
    generator first. Refusals come at the call, before the first sample."""
    sampling.check()
    if reads_backwards(model.config):
        raise UserError(
            "CHECKPOINT: this model reads text backwards (a backward language model, corpus.reverse): "
            "it would write text that ends where the prompt starts; generate with the forward model"
        )
    ids = prompt_ids(tokenizer, prompt, document)
    positions = learned_positions(model.config)
    if positions is not None and len(ids) + sampling.max_new_tokens > positions:
        raise UserError(
            f"the prompt's {len(ids)} tokens and --max-new-tokens {sampling.max_new_tokens} exceed the "
            f"model's {positions} positions"
        )
    end_of_text = tokenizer.eos_token_id
    decode_options = {"skip_special_tokens": sampling.stop_at_end_of_text}  # else the documents' separators show
    options = {
        "max_new_tokens": sampling.max_new_tokens,
        "do_sample": not sampling.greedy,
        "eos_token_id": end_of_text if sampling.stop_at_end_of_text else None,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_text,
    }
    if not sampling.greedy:
        options.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    if sampling.stop_at_end_of_text and sampling.min_new_tokens:  # without a stop, <|endoftext|> is only a separator
        options["min_new_tokens"] = sampling.min_new_tokens
    inputs = torch.tensor([ids], device=model.device)

    def draw() -> Iterator[Sample]:
        if seed is not None:
            torch.manual_seed(seed)
        for _ in range(count):
            streamer = None if on_text is None else _CallbackStreamer(tokenizer, on_text, **decode_options)
            with torch.inference_mode():  # no version counters or view tracking: the model is only read
                new_ids = model.generate(inputs, streamer=streamer, **options)[0, len(ids) :].tolist()
            ended = sampling.stop_at_end_of_text and bool(new_ids) and new_ids[-1] == end_of_text
            yield Sample(tokenizer.decode(new_ids, **decode_options), len(new_ids), ended)

    return draw()


def end_of_document_note(sample: Sample, end_of_text: str) -> str:
    """The line that says a sample stopped at the end-of-document token, after how many tokens, and how to go on."""
    empty = "" if sample.text.strip() else ", before any text"
    return (
        f"generation stopped at the end-of-document token {end_of_text} after {sample.new_tokens} new token(s)"
        f"{empty}: the model ended the document; --min-new-tokens N writes at least N tokens first, --no-stop-at-eos "
        "writes on into new documents"
    )


def sample_rows(prompt: str, samples: list[Sample], seed: int | None) -> list[dict]:
    """What --output writes: one JSON object per sample."""
    return [
        {
            "prompt": prompt,
            "sample": index,
            "seed": seed,
            "text": sample.text,
            "new_tokens": sample.new_tokens,
            "stop": "end_of_text" if sample.ended_document else "max_new_tokens",
        }
        for index, sample in enumerate(samples)
    ]


def write_json_lines(rows: list[dict], path: Path) -> None:
    """The rows as JSON Lines, written under a temporary name and renamed when complete."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def run_generate(
    checkpoint: str,
    prompt: str,
    sampling: Sampling,
    count: int,
    seed: int | None,
    output: str | None,
    write: Callable[[str], None],
    document: str | None = None,
) -> None:
    """The CLI's work. Without `output` (or with a file) each sample is written through `write` as it comes: the
    prompt, its continuation, a blank line between samples; `output` "-" writes JSON Lines through `write` instead.
    `document`: how the prompt is cut into documents; None: as the checkpoint's pretraining read its text."""
    sampling.check()  # before the model is loaded: a mistake in an option costs nothing
    if output not in (None, "-") and not Path(output).parent.is_dir():
        raise UserError(f"--output: no such folder: {Path(output).parent}")
    model, tokenizer = load_causal_language_model(checkpoint, "generate")
    if torch.cuda.is_available():
        model.to("cuda")
    prompt = prompt.rstrip()  # what the model continues: the last line stripped, as pretraining read it
    streaming = output != "-"
    document = document or trained_document_kind(checkpoint)
    drawn = generate_samples(model, tokenizer, prompt, sampling, count, seed, write if streaming else None, document)
    if streaming:
        write(prompt)
    samples = []
    for sample in drawn:
        samples.append(sample)
        if streaming:
            write("\n")
            if sample.ended_document:  # else a sample that ends at once shows the prompt alone, without a word why
                console.print(
                    end_of_document_note(sample, tokenizer.eos_token), markup=False, highlight=False, soft_wrap=True
                )
            write("\n" + prompt if len(samples) < count else "")
    rows = sample_rows(prompt, samples, seed)
    if output == "-":
        write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    elif output is not None:
        write_json_lines(rows, Path(output))
