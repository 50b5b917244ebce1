"""`finetune generate` and `finetune score`, and transformers' generation contract on this toolkit's own causal model
types: greedy output against a plain argmax loop, carried states against full forwards, the n-gram's samples
against its probabilities, streamed text, scores against hand computations, refusals."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.generate import Sampling, _CallbackStreamer, generate_samples, prompt_ids
from finetune.data.corpus import read_documents
from finetune.data.token_cache import encode
from finetune.data.tokenizers import train_byte_level_bpe
from finetune.errors import UserError
from finetune.inference.language_model_validation import score_text
from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.causal_transformer import CausalTransformerConfig, CausalTransformerForCausalLM
from finetune.models.ngram import NGramForCausalLM
from tests.conftest import save_tiny_masked_lm, write_corpus

runner = CliRunner()
TRANSFORMER = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    dropout=0.0,
    attention_dropout=0.0,
    max_position_embeddings=64,
)
FAMILIES = {  # the causal models `finetune pretrain` writes, tiny, as (config -> model) makers
    "gpt2": lambda vocab: GPT2LMHeadModel(
        GPT2Config(vocab_size=vocab, n_embd=16, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)
    ),  # the tokenizer's <|endoftext|>
    "transformer-xl": lambda vocab: CausalTransformerForCausalLM(
        CausalTransformerConfig(vocab_size=vocab, memory_length=4, **TRANSFORMER)
    ),
    "strided": lambda vocab: CausalTransformerForCausalLM(
        CausalTransformerConfig(
            vocab_size=vocab, relative_positions=False, attention_pattern="strided", attention_stride=4, **TRANSFORMER
        )
    ),
    "fixed-with-memory": lambda vocab: CausalTransformerForCausalLM(
        CausalTransformerConfig(
            vocab_size=vocab, memory_length=8, attention_pattern="fixed", attention_stride=4, **TRANSFORMER
        )
    ),
    "awd_lstm": lambda vocab: AWDLSTMForCausalLM(
        AWDLSTMConfig(vocab_size=vocab, embedding_size=16, hidden_size=24, num_layers=2)
    ),
    "qrnn": lambda vocab: AWDLSTMForCausalLM(
        AWDLSTMConfig(vocab_size=vocab, embedding_size=16, hidden_size=24, num_layers=2, cell="qrnn")
    ),
    "rnn": lambda vocab: AWDLSTMForCausalLM(
        AWDLSTMConfig(vocab_size=vocab, embedding_size=16, hidden_size=24, num_layers=2, cell="rnn")
    ),
}
CARRYING_STATE = ["transformer-xl", "fixed-with-memory", "awd_lstm", "qrnn", "rnn"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), lines=120)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_byte_level_bpe(read_documents([corpus]), vocab_size=300, min_frequency=1)


def tiny_model(family: str, vocab_size: int, seed: int = 0):
    """A family's model in eval mode, its matrices drawn wide enough that greedy output does not repeat one token."""
    torch.manual_seed(seed)
    model = FAMILIES[family](vocab_size).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def ngram(corpus, tokenizer) -> NGramForCausalLM:
    stream = [token for ids in encode(tokenizer, read_documents([corpus])) for token in ids + [tokenizer.eos_token_id]]
    return NGramForCausalLM.count(stream, len(tokenizer), order=3, eos_token_id=tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer, ngram) -> dict[str, Path]:
    """A saved checkpoint (weights and tokenizer) of every family, and of the n-gram model counted on the corpus."""
    folder = tmp_path_factory.mktemp("checkpoints")
    models = {family: tiny_model(family, len(tokenizer)) for family in FAMILIES} | {"ngram": ngram}
    for family, model in models.items():
        model.save_pretrained(folder / family)
        tokenizer.save_pretrained(folder / family)
    return {family: folder / family for family in models}


def argmax_loop(model, ids: list[int], steps: int) -> list[int]:
    """The reference: a full forward over the whole sequence at every step, its last position's argmax appended."""
    sequence = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            sequence = torch.cat([sequence, model(sequence).logits[:, -1:].argmax(-1)], dim=1)
    return sequence[0, len(ids) :].tolist()


# ---------------------------------------------------------------------------------------------
# transformers' generation contract
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [*FAMILIES, "ngram"])
def test_greedy_generation_is_the_argmax_loop(family, tokenizer, ngram):
    model = ngram if family == "ngram" else tiny_model(family, len(tokenizer))
    ids = prompt_ids(tokenizer, "the film was")
    expected = argmax_loop(model, ids, 20)
    assert len(set(expected)) > 2  # a sequence worth comparing, not one token repeated
    generated = model.generate(
        torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id
    )
    assert generated[0, len(ids) :].tolist() == expected
    greedy = Sampling(max_new_tokens=20, greedy=True, stop_at_end_of_text=False)
    [sample] = generate_samples(model, tokenizer, "the film was", greedy)
    assert sample.text == tokenizer.decode(expected) and sample.new_tokens == 20


@pytest.mark.parametrize("family", CARRYING_STATE)
def test_each_step_gives_the_distribution_of_a_full_forward_over_the_prefix(family, tokenizer):
    """The state carried from token to token (memory, recurrent state) reads as the whole prefix does: at every
    step of sampling, the logits equal those of a forward over everything before (a prompt length that is not a
    multiple of the fixed pattern's stride: its blocks must stay where they lie in the text)."""
    model = tiny_model(family, len(tokenizer))
    prompt = torch.tensor([prompt_ids(tokenizer, "the plot was")])
    assert prompt.shape[1] % 4
    torch.manual_seed(1)
    result = model.generate(
        prompt,
        max_new_tokens=16,
        do_sample=True,
        top_k=0,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    sequence = result.sequences
    for step, logits in enumerate(result.logits):
        with torch.no_grad():
            full = model(sequence[:, : prompt.shape[1] + step]).logits[:, -1]
        torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["awd_lstm", "qrnn", "transformer-xl", "ngram"])
def test_after_the_prompt_each_step_reads_one_token(family, tokenizer, ngram):
    """No recomputation: the prompt is read once, then every step reads the one new token (the n-gram model its
    last n - 1 tokens, all it ever reads)."""
    model = ngram if family == "ngram" else tiny_model(family, len(tokenizer))
    read: list[int] = []
    forward = model.forward

    def counting_forward(input_ids, **options):
        read.append(input_ids.shape[1])
        return forward(input_ids, **options)

    model.forward = counting_forward
    prompt = torch.tensor([prompt_ids(tokenizer, "the story was quite")])
    model.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert read == ([2] * 6 if family == "ngram" else [prompt.shape[1]] + [1] * 5)


def test_sampling_options_reach_generate(tokenizer):
    """top-k 1 samples the most probable token: the greedy text, whatever the seed and temperature."""
    model = tiny_model("gpt2", len(tokenizer))
    greedy = next(generate_samples(model, tokenizer, "the film", Sampling(max_new_tokens=12, greedy=True)))
    top_one = generate_samples(
        model, tokenizer, "the film", Sampling(max_new_tokens=12, top_k=1, temperature=3.0), count=2, seed=5
    )
    assert [sample.text for sample in top_one] == [greedy.text] * 2
    wide = generate_samples(model, tokenizer, "the film", Sampling(max_new_tokens=12, temperature=3.0), count=2, seed=5)
    assert greedy.text not in [sample.text for sample in wide]


def test_no_cache_reads_the_whole_sequence_at_every_step(tokenizer):
    model = tiny_model("transformer-xl", len(tokenizer))
    prompt = torch.tensor([prompt_ids(tokenizer, "the cast")])
    options = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(model.generate(prompt, use_cache=False, **options), model.generate(prompt, **options))


@pytest.mark.parametrize("family", ["awd_lstm", "transformer-xl"])
def test_padding_and_beam_search_are_refused(family, tokenizer):
    model = tiny_model(family, len(tokenizer))
    prompts = torch.tensor([[5, 6, 7], [0, 6, 7]])
    with pytest.raises(ValueError, match="reads no padding"):
        model.generate(prompts, attention_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="only supports"):
        model.generate(prompts[:1], num_beams=2, max_new_tokens=2)


def test_ngram_samples_follow_its_probabilities():
    """Toy corpus over 5 ids (4 never follows 1 2; 3 never occurs): next-token samples after the context 1 2, and
    at temperature 0.5, against the model's own probabilities read as targets (chi-square, 3000 samples each)."""
    stream = [0, 1, 2, 0, 1, 2, 1, 0, 2, 2, 1, 2, 0, 0, 1, 4, 2, 1, 2, 2] * 3
    model = NGramForCausalLM.count(stream, 5, order=3)
    context = torch.tensor([[1, 2]])
    probabilities = model.target_log_probabilities(torch.tensor([[1, 2, word] for word in range(5)]))[:, -1].exp()
    assert probabilities.sum().item() == pytest.approx(1.0, abs=1e-6)
    for temperature in (1.0, 0.5):
        expected = probabilities ** (1 / temperature)
        expected = (expected / expected.sum()).double().numpy()
        torch.manual_seed(0)
        samples = model.generate(
            context,
            do_sample=True,
            top_k=0,
            temperature=temperature,
            max_new_tokens=1,
            num_return_sequences=3000,
            eos_token_id=None,
            pad_token_id=0,
        )[:, -1]
        counts = torch.bincount(samples, minlength=5).double().numpy()
        assert chisquare(counts, expected * len(samples)).pvalue > 1e-3
        uniform = [len(samples) / 5] * 5  # the test can fail: samples are far from uniform
        assert chisquare(counts, uniform).pvalue < 1e-6


def test_ngram_scores_a_python_list(ngram, tokenizer):
    ids = prompt_ids(tokenizer, "the music was lovely .")
    assert ngram.nats_per_token(ids) == pytest.approx(ngram.nats_per_token(torch.tensor(ids)))


# ---------------------------------------------------------------------------------------------
# Prompts and streamed text
# ---------------------------------------------------------------------------------------------


def test_the_prompt_is_read_as_pretraining_reads_text(tokenizer):
    """Each non-empty line a document (stripped), each after <|endoftext|>; the last one left open."""
    end = tokenizer.eos_token_id
    first, second = encode(tokenizer, ["the film was", "the plot"])
    assert prompt_ids(tokenizer, "  the film was \n\n the plot  ") == [end, *first, end, *second]
    assert prompt_ids(tokenizer, "") == [end]


def test_streamed_text_never_breaks_a_character(tokenizer):
    """Characters the corpus never had are byte tokens (several per character): fed one token at a time, the
    streamer hands on whole characters only, and all of it is the text decoded at once."""
    text = " café 日本 ünïcode ok"
    ids = encode(tokenizer, [text])[0]
    assert len(ids) > len(text.split())  # split into pieces
    pieces: list[str] = []
    streamer = _CallbackStreamer(tokenizer, pieces.append, skip_special_tokens=True)
    streamer.put(torch.tensor([[tokenizer.eos_token_id]]))  # the prompt, skipped
    for token in ids:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces) and len(pieces) > 1


def test_help_says_generation_stops_at_the_end_of_text():
    result = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "End a sample at <|endoftext|>" in result.output and "--no-stop-at-eos" in result.output


def test_generate_command_streams_the_greedy_continuation(checkpoints):
    folder = checkpoints["awd_lstm"]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    expected = tokenizer.decode(argmax_loop(model, prompt_ids(tokenizer, "the film was"), 12))
    result = runner.invoke(
        app,
        ["generate", str(folder), "--prompt", "the film was", "--greedy", "--max-new-tokens", "12", "--no-stop-at-eos"],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "the film was" + expected + "\n"


def test_stdin_prompt_json_output_and_seeds(checkpoints, tmp_path):
    folder = str(checkpoints["gpt2"])

    def sampled(*options, prompt="the acting was\n"):
        result = runner.invoke(app, ["generate", folder, "--max-new-tokens", "8", "-n", "2", *options], input=prompt)
        assert result.exit_code == 0, result.output
        return result.stdout

    streamed = sampled("--seed", "3", "--output", str(tmp_path / "samples.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [row["sample"] for row in rows] == [0, 1] and all(row["prompt"] == "the acting was" for row in rows)
    # The terminal shows each sample after the prompt, a blank line between them: the JSON's text, as streamed.
    assert streamed == "\n\n".join("the acting was" + row["text"] for row in rows) + "\n"
    assert [json.loads(line) for line in sampled("--seed", "3", "--output", "-").splitlines()] == rows
    assert sampled("--seed", "4", "--output", "-") != sampled("--seed", "3", "--output", "-")


def test_generation_stops_at_the_end_of_the_document_unless_told_not_to(checkpoints):
    """The n-gram counted on one-sentence documents ends its sentence with <|endoftext|>: a sample stops there, and
    with --no-stop-at-eos writes on into the next document, the separator shown."""
    folder = str(checkpoints["ngram"])
    arguments = ["generate", folder, "-p", "the film was", "--greedy", "--max-new-tokens", "30", "-o", "-"]
    [stopped] = [json.loads(line) for line in runner.invoke(app, arguments).stdout.splitlines()]
    assert stopped["stop"] == "end_of_text" and stopped["new_tokens"] < 30
    assert stopped["text"].endswith(".") and "<|endoftext|>" not in stopped["text"]
    [going_on] = [json.loads(line) for line in runner.invoke(app, arguments + ["--no-stop-at-eos"]).stdout.splitlines()]
    assert going_on["stop"] == "max_new_tokens" and going_on["new_tokens"] == 30
    assert going_on["text"].startswith(stopped["text"] + "<|endoftext|>")


# ---------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------


def text_stream(tokenizer, path: Path) -> list[int]:
    """The text as score reads it: <|endoftext|>, then every document followed by <|endoftext|>."""
    end = tokenizer.eos_token_id
    return [end] + [token for ids in encode(tokenizer, read_documents([path])) for token in ids + [end]]


def test_score_is_the_mean_next_token_loss_of_the_whole_text(checkpoints, tokenizer, tmp_path):
    text = write_corpus(tmp_path / "text", lines=12)
    stream = torch.tensor([text_stream(tokenizer, text)])
    ngram = NGramForCausalLM.from_pretrained(checkpoints["ngram"])
    assert score_text(checkpoints["ngram"], [text], segment_length=4096)["nats_per_token"] == pytest.approx(
        ngram.nats_per_token(stream), rel=1e-6
    )
    # The AWD-LSTM carries its state from segment to segment: any length reads the text as one forward does.
    lstm = AutoModelForCausalLM.from_pretrained(checkpoints["awd_lstm"]).eval()
    with torch.no_grad():
        whole = F.cross_entropy(lstm(stream).logits[0, :-1], stream[0, 1:]).item()
    for length in (7, 1024):
        result = score_text(checkpoints["awd_lstm"], [text], segment_length=length)
        assert result["nats_per_token"] == pytest.approx(whole, rel=1e-5)
        assert result["tokens"] == stream.shape[1] - 1 and result["perplexity"] == pytest.approx(math.exp(whole), 1e-5)
    # GPT-2 reads each segment of its 64 positions (its default) on its own.
    gpt2 = AutoModelForCausalLM.from_pretrained(checkpoints["gpt2"]).eval()
    losses = []
    with torch.no_grad():
        for start in range(0, stream.shape[1] - 1, 64):
            segment = stream[:, start : start + 65]
            losses.append(F.cross_entropy(gpt2(segment[:, :-1]).logits[0], segment[0, 1:], reduction="sum"))
    result = score_text(checkpoints["gpt2"], [text])
    assert result["segment_length"] == 64
    assert result["nats_per_token"] == pytest.approx(sum(losses).item() / (stream.shape[1] - 1), rel=1e-5)


def test_score_command_prints_the_line_or_json(checkpoints, tmp_path):
    text = write_corpus(tmp_path / "text", lines=6)
    result = runner.invoke(app, ["score", str(checkpoints["transformer-xl"]), str(text), "--json"])
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    assert scored["files"] == [str(text)] and 0 < scored["nats_per_token"] < 20
    assert scored["perplexity"] == pytest.approx(math.exp(scored["nats_per_token"]), rel=1e-6)
    line = runner.invoke(app, ["score", str(checkpoints["transformer-xl"]), str(text)]).stdout.strip()
    assert line == (
        f"{scored['tokens']:,} tokens: {scored['nats_per_token']:.4f} nats per token, perplexity "
        f"{scored['perplexity']:.2f}, next-token accuracy {scored['next_token_accuracy']:.4f}"
    )


# ---------------------------------------------------------------------------------------------
# Refusals: one line, exit code 2
# ---------------------------------------------------------------------------------------------


def one_line_error(arguments: list[str]) -> str:
    result = runner.invoke(app, arguments)
    output = result.output.strip()
    assert result.exit_code == 2 and output.startswith("error: ") and "\n" not in output, result.output
    return output


def test_masked_models_and_classifiers_are_refused_naming_their_type(tmp_path, checkpoints):
    masked = str(save_tiny_masked_lm(tmp_path / "bert"))
    classifier = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, pad_token_id=0)
    )
    classifier.save_pretrained(tmp_path / "classifier")
    text = write_corpus(tmp_path / "text", lines=3)
    for command in (["generate"], ["score"]):
        extra = [str(text)] if command == ["score"] else []
        assert "is a 'bert' model; `finetune " + command[0] in one_line_error(command + [masked] + extra)
        assert "is a 'gpt2' classifier (GPT2ForSequenceClassification)" in one_line_error(
            command + [str(tmp_path / "classifier")] + extra
        )


@pytest.mark.parametrize(
    "options, named",
    [
        (["--temperature", "0"], "--temperature"),
        (["--top-p", "1.5"], "--top-p"),
        (["--max-new-tokens", "80"], "exceed the model's 64 positions"),
        (["--output", "no/such/folder/samples.jsonl"], "--output: no such folder"),
    ],
)
def test_bad_generate_options_are_one_line(options, named, checkpoints):
    assert named in one_line_error(["generate", str(checkpoints["gpt2"]), "-p", "the film", *options])


def test_bad_score_arguments_are_one_line(checkpoints, tmp_path):
    text = write_corpus(tmp_path / "text", lines=3)
    assert "no such file" in one_line_error(["score", str(checkpoints["gpt2"]), str(tmp_path / "missing.txt")])
    assert "exceeds the 64 positions" in one_line_error(
        ["score", str(checkpoints["gpt2"]), str(text), "--segment-length", "100"]
    )
    assert "stride 4 must divide it" in one_line_error(
        ["score", str(checkpoints["strided"]), str(text), "--segment-length", "10"]
    )


def test_prompt_and_score_follow_what_a_document_was_in_pretraining(checkpoints, tokenizer, tmp_path):
    """A model pretrained with corpus.document: file reads a prompt and a scored text whole, line breaks kept; the
    kind comes from the checkpoint's saved recipe, and --document overrides it."""
    end, newline = tokenizer.eos_token_id, encode(tokenizer, ["a\nb"])[0][1]
    assert prompt_ids(tokenizer, "the film\nthe plot", "line").count(end) == 2
    whole = prompt_ids(tokenizer, "the film\n\n  the plot", "file")
    assert whole.count(end) == 1 and whole.count(newline) == 2  # one document, its blank line kept
    assert prompt_ids(tokenizer, "the film\nthe plot\n\nthe cast", "paragraph").count(end) == 2
    with pytest.raises(UserError, match="--document: expected one of line, paragraph, file"):
        prompt_ids(tokenizer, "x", "page")

    checkpoint = tmp_path / "file-model"
    shutil.copytree(checkpoints["ngram"], checkpoint)
    text = tmp_path / "play.txt"
    text.write_text("the film was great .\nthe plot was dull .\n\nthe cast was lovely .\n", encoding="utf-8")
    by_line = score_text(checkpoint, [text])  # no saved recipe: line, as older checkpoints read text
    (checkpoint / "finetune_recipe.yaml").write_text("stage: pretrain\ncorpus: {document: file}\n", encoding="utf-8")
    by_file = score_text(checkpoint, [text])
    assert by_file == score_text(checkpoint, [text], document="file") != by_line
    # Line by line: a separator after each of the 3 lines; whole: 3 line-break tokens inside, one separator at the end.
    assert by_file["tokens"] == by_line["tokens"] + 1


# ---------------------------------------------------------------------------------------------
# A sample that ends at once says why (issue 44)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ends_at_once(tmp_path_factory, tokenizer) -> Path:
    """A gpt2 checkpoint whose most probable next token is always <|endoftext|>: its final norm outputs one vector
    at every position, and <|endoftext|>'s (tied) embedding row is that vector, scaled up."""
    model = tiny_model("gpt2", len(tokenizer))
    with torch.no_grad():
        direction = torch.zeros(model.config.n_embd)
        direction[0] = 1.0
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(direction)
        model.transformer.wte.weight[tokenizer.eos_token_id] = 50 * direction
    folder = tmp_path_factory.mktemp("ends-at-once")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_sample_that_ends_at_once_says_so_and_how_to_go_on(ends_at_once):
    result = runner.invoke(app, ["generate", str(ends_at_once), "-p", "ROMEO:", "--greedy", "--max-new-tokens", "20"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "ROMEO:\n"  # the prompt alone, as before: what the model wrote
    note = result.stderr.strip()
    assert note.startswith("generation stopped at the end-of-document token <|endoftext|> after 1 new token(s)")
    assert "before any text" in note and "--min-new-tokens" in note and "--no-stop-at-eos" in note
    assert len(note.splitlines()) == 1


def test_min_new_tokens_writes_that_many_before_the_end_of_the_document(ends_at_once):
    arguments = [
        "generate",
        str(ends_at_once),
        "-p",
        "ROMEO:",
        "--greedy",
        "--max-new-tokens",
        "20",
        "--min-new-tokens",
        "5",
    ]
    [row] = [json.loads(line) for line in runner.invoke(app, [*arguments, "-o", "-"]).stdout.splitlines()]
    assert row["new_tokens"] == 6 and row["stop"] == "end_of_text" and row["text"].strip()  # 5, then <|endoftext|>
    streamed = runner.invoke(app, arguments)
    assert streamed.stdout == "ROMEO:" + row["text"] + "\n"
    assert "after 6 new token(s):" in streamed.stderr and "before any text" not in streamed.stderr


def test_min_new_tokens_beyond_max_new_tokens_is_one_line(ends_at_once):
    result = runner.invoke(app, ["generate", str(ends_at_once), "--max-new-tokens", "4", "--min-new-tokens", "5"])
    assert result.exit_code == 2 and result.output.strip().startswith("error: --min-new-tokens: from 0 to")
