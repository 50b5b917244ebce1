"""Generation speed: `finetune generate`'s path against transformers' own `generate` on the same GPT-2 checkpoint, and
the cost of each new token against the length of the text before it (the AWD-LSTM's must stay flat).

    .venv/bin/python bench/generate_speed.py                    # ~2 minutes on 2 CPU cores (estimate), the first
                                                                # run ~1 minute more (tokenizer, checkpoints)
    .venv/bin/python bench/generate_speed.py --repeats 7 --threads 1
    .venv/bin/python bench/generate_speed.py --checkpoint runs/bench-clm/ours/checkpoint   # a trained GPT-2 instead
    .venv/bin/python bench/generate_speed.py --update-results   # also appended to bench/results/generate_speed.jsonl
    .venv/bin/python bench/generate_speed.py --smoke            # toy sizes, one repeat

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

Prints the machine (CPU model, threads, torch, fp32 matmul rate measured here), the command and the tables; a record
per arm (part 1: each arm; part 2: each family) goes to WORK/runs.jsonl (--work, default runs/bench-generate, which
keeps the tokenizer and checkpoints), and with --update-results to bench/results/generate_speed.jsonl. Speed figures
need a quiet machine. --smoke: a 1-layer GPT-2, a few tokens, one repeat.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import _harness as harness
from _common import ROOT, WIKITEXT, describe_machine, require, text_lines

sys.path.insert(0, str(ROOT))  # this repository's finetune (not the one another checkout installed)
from transformers.generation.streamers import BaseStreamer

from finetune.commands.generate import Sampling, generate_samples, prompt_ids
from finetune.console import quiet_library_chatter
from finetune.inference.language_model_validation import load_causal_language_model

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


def tokens_per_second(args, checkpoint: Path) -> list[dict]:
    """Part 1: the three arms on one loaded GPT-2, interleaved: a record each (median rate, the identity check)."""
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
    identical = len(set(outputs.values())) == 1 and "".join(streamed) == outputs["finetune generate"]
    return [
        {
            "arm": name,
            "part": "tokens_per_s",
            "checkpoint": str(checkpoint),
            "prompt_tokens": ids.shape[1],
            "new_tokens": args.new_tokens,
            "seconds": seconds[name],
            "tokens_per_s": round(rate, 1),
            "vs_peer": round(rate / rates[PEER], 3),
            "identical": identical,
        }
        for name, rate in rates.items()
    ]


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
    ratio = round(milliseconds[max(args.prefixes)] / milliseconds[min(args.prefixes)], 3)
    return {"arm": family, "part": "cost_per_new_token", "checkpoint": str(checkpoint),
            "ms_per_new_token": milliseconds, "longest_over_shortest": ratio}  # fmt: skip


def main() -> None:
    smoke = "a GPT-2 of 1 x 32, a 16-token prompt, 8 new tokens, prefixes 8 and 32, 4 step tokens, 1 repeat"
    parser = harness.benchmark_parser(__doc__, "generate-speed", smoke=smoke)
    add = parser.add_argument
    add("--checkpoint", type=Path, help="a GPT-2 checkpoint for part 1 instead of the one made here")
    add("--layers", type=int, default=4, help="the GPT-2 made here")
    add("--hidden", type=int, default=256, help="the GPT-2 made here")
    add("--heads", type=int, default=4, help="the GPT-2 made here")
    add("--prompt-tokens", type=int, default=32, help="part 1's prompt (about; whole tokens)")
    add("--new-tokens", type=int, default=128, help="part 1's generated tokens per run")
    add("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES), help="part 2's models")
    add("--prefixes", type=int, nargs="+", default=[16, 256, 960], help="part 2's prefix lengths")
    add("--step-tokens", type=int, default=32, help="part 2's generated tokens per run")
    add("--repeats", type=int, default=5, help="timed runs per arm (or prefix), medians")
    add("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.smoke:
        args.layers, args.hidden, args.heads, args.prompt_tokens, args.new_tokens = 1, 32, 2, 16, 8
        args.prefixes, args.step_tokens, args.repeats = [8, 32], 4, 1
    work = harness.work_folder(args, "generate")
    machine = describe_machine()  # the figures below belong to this machine
    if max(args.prefixes) + args.step_tokens > 1024 and "gpt2" in args.families:
        sys.exit("bench: the GPT-2's 1024 positions hold no longer --prefixes + --step-tokens")
    if args.threads:
        torch.set_num_threads(args.threads)
    quiet_library_chatter()  # as the CLI: no loading bars between the figures
    if args.checkpoint is not None:
        require(args.checkpoint / "config.json", "the --checkpoint", "give a GPT-2 checkpoint folder")
    checkpoints = {family: make_checkpoint(family, args, work) for family in FAMILIES}
    common = {"command": shlex.join(sys.argv), "repeats": args.repeats, "threads": torch.get_num_threads(),
              "torch": torch.__version__}  # fmt: skip
    speed = [common | run for run in tokens_per_second(args, args.checkpoint or checkpoints["gpt2"])]
    costs = [common | cost_per_token(family, args, checkpoints[family]) for family in args.families]
    print(f"$ python {shlex.join(sys.argv)}\n")
    title = f"GPT-2 ({speed[0]['checkpoint']}), greedy, {speed[0]['prompt_tokens']}-token prompt, {args.new_tokens} new"
    print(harness.markdown_table(speed, {title: "arm", "tokens/s": "tokens_per_s", "vs transformers": "vs_peer"},
                                 formats={"tokens/s": "{:,.1f}", "vs transformers": "{:.2f}x"}))  # fmt: skip
    print(f"\nsame text on every arm: {'yes' if speed[0]['identical'] else 'NO'}\n")
    columns = {f"cost per new token (ms), {args.step_tokens} greedy tokens after the prefix": "arm"}
    columns |= {f"prefix {n}": (lambda cost, n=n: cost["ms_per_new_token"][n]) for n in args.prefixes}
    formats = dict.fromkeys(columns, "{:.2f}") | {"longest / shortest": "{:.2f}x"}
    print(harness.markdown_table(costs, columns | {"longest / shortest": "longest_over_shortest"}, formats=formats))
    for record in speed + costs:
        harness.record_run(work, record, "generate_speed" if args.update_results else None, machine)


if __name__ == "__main__":
    main()
