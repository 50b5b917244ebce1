"""Generation speed: `finetune generate`'s path against transformers' own `generate` on the same GPT-2 checkpoint, and
the cost of each new token against the length of the text before it (the AWD-LSTM's must stay flat).

    .venv/bin/python bench/generate_speed.py                    # ~2 minutes on 2 CPU cores (estimate), the first
                                                                # run ~1 minute more (tokenizer, checkpoints)
    .venv/bin/python bench/generate_speed.py --repeats 7 --threads 1
    .venv/bin/python bench/generate_speed.py --checkpoint runs/bench-clm/ours/checkpoint   # a trained GPT-2 instead
    .venv/bin/python bench/generate_speed.py --record           # also appended to bench/results/generate_speed.jsonl

Checkpoints: made once in --work-dir with the toolkit's own builders and saved as `finetune pretrain` saves them
(weights at their initialisation: speed does not depend on what they learnt): a GPT-2 (--layers, --hidden, --heads;
GPT-2-mini's 4 x 256 x 4 by default, 1024 positions) and an AWD-LSTM of ULMFiT's sizes (embedding 400, hidden 1152,
3 layers), both reading the byte-level BPE of 16,000 pieces trained on WikiText-2 train.txt (../shared/data) with the
toolkit's tokenizer code, as bench/lm_families.py does. The prompt: the start of valid.txt's first long paragraph.

1. GPT-2 tokens/s, greedy, batch 1, the key/value cache on, --new-tokens after a --prompt-tokens prompt, end of text
   ignored so every side makes exactly --new-tokens tokens. Sides, on the one loaded model, interleaved --repeats
   times after one warm-up each (medians):
   - peer: `model.generate(input_ids, do_sample=False, max_new_tokens=N)`, transformers' own, on the prompt's ids;
   - ours: `finetune.commands.generate.generate_samples` (what `finetune generate --greedy` runs): the prompt's text in,
     the new text out, so encoding and decoding are inside our figure;
   - ours, streamed: the same with the text streamed (TextStreamer's incremental decoding), as the terminal gets it.
   The new text must be the peer's tokens decoded (checked). Goal: ours / peer >= 1.0.
2. Cost per new token against the prefix: for each family of --families and each --prefixes length, --step-tokens
   greedy tokens after a prefix of that many tokens (valid.txt's text); the clock reads when each token reaches
   the streamer, so the prefix's one forward (prefill) is left out and each figure is the median time of one
   decoding step. The AWD-LSTM carries its state (one token per step): flat, ratio longest / shortest ~1.0;
   GPT-2 (reference) attends over its cache, which grows with the prefix.

Prints the machine (CPU model, threads, torch, fp32 matmul rate measured here), the tables and the command, then one
JSON line with every figure, also written to --work-dir/generate_speed.json; --record appends it to
bench/results/generate_speed.jsonl (dated, with the machine). Speed figures need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from _common import ROOT, WIKITEXT, append_result, cpu_model, describe_machine, require, text_lines

sys.path.insert(0, str(ROOT))  # this repository's finetune (not the one another checkout installed)
from transformers.generation.streamers import BaseStreamer

from finetune.commands.generate import Sampling, generate_samples, prompt_ids
from finetune.console import quiet_library_chatter
from finetune.inference.language_model_validation import load_causal_language_model
from finetune.models.flops import matmul_gflops

VOCABULARY = 16000
FAMILIES = ("awd_lstm", "gpt2")
PEER = "transformers generate (peer)"


class TokenClock(BaseStreamer):
    """When each batch of tokens reaches the streamer: the prompt first, then one new token per decoding step."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def step_seconds(self) -> float:
        """The median time between consecutive new tokens (the first new token comes from the prefill)."""
        steps = [later - earlier for earlier, later in zip(self.times[1:], self.times[2:])]
        return statistics.median(steps)


def tokenizer_folder(work_dir: Path) -> Path:
    """The shared byte-level BPE (bench/lm_families.py's), trained once per work folder."""
    folder = work_dir / "tokenizer"
    if not (folder / "tokenizer.json").is_file():
        from awd_lstm_vs_fastai import shared_tokenizer

        require(WIKITEXT / "train.txt", "WikiText-2 train.txt")
        print("training the tokenizer on WikiText-2 train.txt (once)", file=sys.stderr, flush=True)
        shared_tokenizer(work_dir, VOCABULARY)
    return folder


def make_checkpoint(family: str, args, work_dir: Path) -> Path:
    """A freshly initialised checkpoint of `family`, saved as pretraining saves one, made once per work folder."""
    from transformers import AutoTokenizer

    from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
    from finetune.models.causal_lm import build_causal_lm
    from finetune.recipes import CausalLMModelConfig
    from finetune.training.checkpoints import save_checkpoint

    name = f"gpt2-{args.layers}x{args.hidden}" if family == "gpt2" else "awd_lstm-ulmfit"
    folder = work_dir / "checkpoints" / name
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(work_dir))
    torch.manual_seed(0)
    if family == "gpt2":
        sizes = CausalLMModelConfig(family="gpt2", layers=args.layers, hidden=args.hidden, heads=args.heads)
        model = build_causal_lm(sizes, len(tokenizer), 1024, tokenizer)
    else:  # ULMFiT's sizes: AWDLSTMConfig's defaults
        model = AWDLSTMForCausalLM._from_config(
            AWDLSTMConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
        )
    return save_checkpoint(model, tokenizer, folder)


def text_of_tokens(tokenizer, count: int) -> str:
    """Whole lines of valid.txt from its first paragraph on, cut to about `count` tokens (one document: no newline)."""
    require(WIKITEXT / "valid.txt", "WikiText-2 valid.txt")
    words = " ".join(text_lines(WIKITEXT / "valid.txt"))
    ids = tokenizer(words[: 20 * count], add_special_tokens=False)["input_ids"][:count]
    return tokenizer.decode(ids).strip()


def tokens_per_second(args, checkpoint: Path) -> dict:
    """Part 1: the three sides on one loaded GPT-2, interleaved; medians and the identity check."""
    model, tokenizer = load_causal_language_model(checkpoint, "generate", "--checkpoint")
    prompt = text_of_tokens(tokenizer, args.prompt_tokens)
    ids = torch.tensor([prompt_ids(tokenizer, prompt)])
    sampling = Sampling(max_new_tokens=args.new_tokens, greedy=True, stop_at_end_of_text=False)
    streamed: list[str] = []

    def peer() -> torch.Tensor:
        return model.generate(
            ids, do_sample=False, max_new_tokens=args.new_tokens, eos_token_id=None, pad_token_id=tokenizer.pad_token_id
        )

    def ours() -> str:
        return next(generate_samples(model, tokenizer, prompt, sampling)).text

    def ours_streamed() -> str:
        streamed.clear()
        return next(generate_samples(model, tokenizer, prompt, sampling, on_text=streamed.append)).text

    sides = {PEER: peer, "finetune generate": ours, "finetune generate, streamed": ours_streamed}
    outputs = {name: side() for name, side in sides.items()}  # also the warm-up
    # The peer's figure is generate alone (ids in, ids out); its text, for the check, is decoded here.
    outputs[PEER] = tokenizer.decode(outputs[PEER][0, ids.shape[1] :], skip_special_tokens=False)
    seconds = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, side in sides.items():
            start = time.perf_counter()
            side()
            seconds[name].append(time.perf_counter() - start)
    rates = {name: args.new_tokens / statistics.median(times) for name, times in seconds.items()}
    peer_rate = rates[PEER]
    return {
        "checkpoint": str(checkpoint),
        "prompt_tokens": ids.shape[1],
        "new_tokens": args.new_tokens,
        "seconds": seconds,
        "tokens_per_s": {name: round(rate, 1) for name, rate in rates.items()},
        "vs_peer": {name: round(rate / peer_rate, 3) for name, rate in rates.items()},
        "identical": len(set(outputs.values())) == 1 and "".join(streamed) == outputs["finetune generate"],
    }


def cost_per_token(family: str, args, checkpoint: Path) -> dict:
    """Part 2: the median decoding step after prefixes of each length, greedy, the end of text ignored."""
    model, tokenizer = load_causal_language_model(checkpoint, "generate", "--checkpoint")
    text_ids = prompt_ids(tokenizer, text_of_tokens(tokenizer, max(args.prefixes) + 8))
    if len(text_ids) < max(args.prefixes):
        sys.exit(f"bench: valid.txt gave only {len(text_ids)} tokens for --prefixes up to {max(args.prefixes)}")
    milliseconds = {}
    for length in args.prefixes:
        prefix = torch.tensor([text_ids[:length]])
        runs = []
        for _ in range(args.repeats):
            clock = TokenClock()
            with torch.no_grad():
                model.generate(
                    prefix,
                    do_sample=False,
                    max_new_tokens=args.step_tokens,
                    eos_token_id=None,
                    pad_token_id=tokenizer.pad_token_id,
                    streamer=clock,
                )
            runs.append(clock.step_seconds())
        milliseconds[length] = round(1000 * statistics.median(runs), 3)
    return {
        "checkpoint": str(checkpoint),
        "ms_per_new_token": milliseconds,
        "longest_over_shortest": round(milliseconds[max(args.prefixes)] / milliseconds[min(args.prefixes)], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a GPT-2 checkpoint for part 1 instead of the one made here")
    parser.add_argument("--layers", type=int, default=4, help="the GPT-2 made here")
    parser.add_argument("--hidden", type=int, default=256, help="the GPT-2 made here")
    parser.add_argument("--heads", type=int, default=4, help="the GPT-2 made here")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="part 1's prompt (about; whole tokens)")
    parser.add_argument("--new-tokens", type=int, default=128, help="part 1's generated tokens per run")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES), help="part 2's models")
    parser.add_argument("--prefixes", type=int, nargs="+", default=[16, 256, 960], help="part 2's prefix lengths")
    parser.add_argument("--step-tokens", type=int, default=32, help="part 2's generated tokens per run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side (or prefix), medians")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=ROOT / "runs" / "bench-generate",
        help="the tokenizer and checkpoints made here, kept for later runs, and the result file",
    )
    parser.add_argument("--record", action="store_true", help="also append to bench/results/generate_speed.jsonl")
    parser.add_argument("--overwrite", action="store_true", help="no effect (--record appends; kept for old commands)")
    args = parser.parse_args()
    describe_machine()  # the figures below belong to this machine
    if max(args.prefixes) + args.step_tokens > 1024 and "gpt2" in args.families:
        sys.exit("bench: the GPT-2's 1024 positions hold no longer --prefixes + --step-tokens")
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_library_chatter()  # as the CLI: no loading bars between the figures
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.checkpoint is not None:
        require(args.checkpoint / "config.json", "the --checkpoint", "give a GPT-2 checkpoint folder")
    gpt2 = args.checkpoint or make_checkpoint("gpt2", args, args.work_dir)
    checkpoints = {
        "gpt2": make_checkpoint("gpt2", args, args.work_dir),
        "awd_lstm": make_checkpoint("awd_lstm", args, args.work_dir),
    }

    speed = tokens_per_second(args, gpt2)
    costs = {family: cost_per_token(family, args, checkpoints[family]) for family in args.families}
    machine = {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "matmul_gflops_fp32": round(matmul_gflops(), 1),
    }

    print(
        f"\nmachine: {machine['cpu']}, {machine['threads']} thread(s), torch {machine['torch']}; fp32 matmul "
        f"{machine['matmul_gflops_fp32']:.1f} GFLOP/s"
    )
    print(f"$ python {shlex.join(sys.argv)}")
    print(
        f"\n| GPT-2 ({speed['checkpoint']}), greedy, {speed['prompt_tokens']}-token prompt, "
        f"{speed['new_tokens']} new tokens | tokens/s | vs transformers |\n|---|---:|---:|"
    )
    for name, rate in speed["tokens_per_s"].items():
        print(f"| {name} | {rate:,.1f} | {speed['vs_peer'][name]:.2f}x |")
    print(f"\nsame text on every side: {'yes' if speed['identical'] else 'NO'}")
    print(
        f"\n| cost per new token (ms), {args.step_tokens} greedy tokens after the prefix | "
        + " | ".join(f"prefix {length}" for length in args.prefixes)
        + " | longest / shortest |\n|---|"
        + "---:|" * (len(args.prefixes) + 1)
    )
    for family, cost in costs.items():
        print(
            f"| {family} | "
            + " | ".join(f"{cost['ms_per_new_token'][length]:.2f}" for length in args.prefixes)
            + f" | {cost['longest_over_shortest']:.2f}x |"
        )
    result = {
        "benchmark": "generate_speed",
        "machine": machine,
        "command": shlex.join(sys.argv),
        "repeats": args.repeats,
        "gpt2_tokens_per_s": speed,
        "cost_per_new_token": costs,
    }
    (args.work_dir / "generate_speed.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.record:
        append_result("generate_speed", result, machine=machine)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
