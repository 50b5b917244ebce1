"""`finetune serve` under load: throughput with micro-batching against one request per model call, and the latency
the server adds to a single client against calling the predictor in Python.

    .venv/bin/python bench/serve_load.py                       # 50 clients x 10,000 requests per arm; the first
                                                               # run also makes the quickstart checkpoint
    .venv/bin/python bench/serve_load.py --checkpoint runs/bench-predict/checkpoints/sst2-320-rows/checkpoint
    .venv/bin/python bench/serve_load.py --clients 20 --requests 2000 --max-batch 64 --threads 1
    .venv/bin/python bench/serve_load.py --pin-clients         # the clients on a core of their own
    .venv/bin/python bench/serve_load.py --smoke               # a 2-step checkpoint, 4 clients, 40 requests

The checkpoint: --checkpoint, or the quickstart's classifier (recipes/quickstart, data/quickstart), made once in
the work folder by `finetune pretrain` and `finetune finetune` as `make quickstart` makes it. That model answers in
about 2 ms, less than the HTTP handling of a request, so batching gains little on it: give a model of a size you
would serve (the MiniLM classifier bench/predict_speed.py makes, above) for the figure that matters. The texts: the dev
split of the checkpoint's task (its finetune_recipe.yaml's task), one text per request, in turn.

Arms, each a fresh `finetune serve CHECKPOINT --port 0` on 127.0.0.1 (the model loaded before the clock starts),
stopped with Ctrl-C after it:
- batched: --clients concurrent clients (httpx, asyncio) send --requests requests between them, the server with
  --max-batch and --max-wait-ms (micro-batching, the defaults of `finetune serve`);
- unbatched: the same load, the server with --max-batch 1 (one request per model call);
- one client: one client sends --latency-requests requests one after another, the server with --max-batch 1;
- predictor: the same texts through `load_predictor(CHECKPOINT).predict([text])` in this process, no server.
Every arm reports its errors (a request not answered 200 with one prediction: must be 0), requests per second,
the median and 95th percentile latency (ms), the server's model calls (GET /health) and mean batch, and the CPU
seconds the server and the clients spent (the clients' share is what a load generator on the same cores takes
from the server; --pin-clients puts the clients on the last core and the server, with a torch thread per core
left, and the predictor arm on the others). The table
gives batched / unbatched throughput and the one-client latency over the predictor's. An arm stops sending after
--time-limit seconds (the record says how many requests it sent).

Prints the machine, the command and the table; a record per arm goes to WORK/runs.jsonl (--work, default
runs/bench-serve-load, which keeps the checkpoint made here), and with --update-results to
bench/results/serve_load.jsonl. Figures need a quiet machine: the clients share its cores with the server.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _harness as harness
from _common import ROOT, describe_machine, finetune_cli, require

sys.path.insert(0, str(ROOT))  # this repository's finetune (not the one another checkout installed)

HOST = "127.0.0.1"  # the benchmark never serves beyond this machine
STARTUP_SECONDS = 300


def quickstart_checkpoint(work: Path, smoke: bool) -> Path:
    """The quickstart's classifier, made once in the work folder (2 steps per stage for a smoke run)."""
    checkpoint = work / "finetune" / "checkpoint"
    if (checkpoint / "finetune_recipe.yaml").is_file():
        return checkpoint
    budget = ["training.max_steps=2"] if smoke else []
    pretrain = work / "pretrain"
    finetune_cli("pretrain", "recipes/quickstart/pretrain.yaml", f"run_dir={pretrain}", *budget, echo=True)
    finetune_cli(
        "finetune", "recipes/quickstart/finetune.yaml", f"run_dir={work / 'finetune'}",
        f"model.checkpoint={pretrain / 'checkpoint'}", *budget, echo=True,
    )  # fmt: skip
    return checkpoint


def task_texts(checkpoint: Path) -> list:
    """The dev split's texts of the checkpoint's task: strings, or lists of a pair task's texts."""
    from finetune.data.task_files import read_task_split
    from finetune.errors import UserError
    from finetune.recipes import load_recipe
    from finetune.tasks.specs import task_spec

    recipe = load_recipe(checkpoint / "finetune_recipe.yaml", expected_stage="finetune", check_paths=False)
    try:
        texts = read_task_split(task_spec(recipe.task), recipe.task.data_dir, "dev").texts
    except UserError as error:
        sys.exit(f"bench: the texts of {checkpoint}'s task (its dev split): {error}")
    return [text[0] if len(text) == 1 else list(text) for text in texts]


class Server:
    """`finetune serve CHECKPOINT --port 0 OPTIONS` in a subprocess, from start (its /health answers) to Ctrl-C."""

    def __init__(self, checkpoint: Path, options: list[str], threads: int | None, cpus: set[int] | None = None):
        command = [sys.executable, "-m", "finetune", "serve", str(checkpoint), "--host", HOST, "--port", "0"]
        print("$ finetune " + shlex.join(command[3:] + options), file=sys.stderr, flush=True)
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
        if threads:
            environment["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op threads in the server
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None  # before exec: every thread inherits it
        self.process = subprocess.Popen(
            command + options, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=environment, preexec_fn=pin
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("serving "):
            self.process.kill()
            sys.exit(f"bench: finetune serve did not start: {line}")
        self.url = line.split(" on ", 1)[1].split(": ", 1)[0]
        self._wait_for_health()

    def _wait_for_health(self) -> None:
        import httpx

        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                httpx.get(f"{self.url}/health", timeout=5).raise_for_status()
                return
            except httpx.TransportError:
                time.sleep(0.2)
        self.process.kill()
        sys.exit(f"bench: no answer from {self.url}")

    def served(self) -> dict:
        import httpx

        return httpx.get(f"{self.url}/health", timeout=30).json()["served"]

    def cpu_seconds(self) -> float:
        """The server's CPU time so far (user + system, all its threads)."""
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()


async def load(url: str, texts: list, clients: int, requests: int, time_limit: float) -> dict:
    """`clients` concurrent clients send `requests` one-text requests between them (fewer if `time_limit` seconds
    pass); the figures of what came back."""
    import httpx

    latencies: list[float] = []
    errors, sent = 0, 0
    stop_at = time.perf_counter() + time_limit

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors, sent
        while sent < requests and time.perf_counter() < stop_at:
            text = texts[sent % len(texts)]
            sent += 1
            started = time.perf_counter()
            try:
                response = await http.post("/predict", json={"texts": [text]})
                ok = response.status_code == 200 and len(response.json()["predictions"]) == 1
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - started)
            errors += not ok

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - started
    return {"requests": sent, "errors": errors, "seconds": round(seconds, 3), **rates(latencies, seconds)}


def rates(latencies: list[float], seconds: float) -> dict:
    """Requests per second, and the median and 95th percentile latency in milliseconds."""
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] if ordered else None
    return {
        "requests_per_s": round(len(ordered) / seconds, 2) if seconds else None,
        "median_ms": round(1000 * statistics.median(ordered), 3) if ordered else None,
        "p95_ms": round(1000 * p95, 3) if p95 is not None else None,
    }


def served_arm(arm: str, checkpoint: Path, texts: list, options: list[str], clients: int, requests: int, args) -> dict:
    """One arm on a fresh server: the load's figures and the server's model calls."""
    server = Server(checkpoint, options, args.threads, args.server_cpus)
    try:
        before, server_cpu, client_cpu = server.served(), server.cpu_seconds(), time.process_time()
        figures = asyncio.run(load(server.url, texts, clients, requests, args.time_limit))
        client_cpu, server_cpu = time.process_time() - client_cpu, server.cpu_seconds() - server_cpu
        after = server.served()
    finally:
        server.stop()
    calls = after["model_calls"] - before["model_calls"]
    answered = after["requests"] - before["requests"]
    return {"arm": arm, "clients": clients, "server_options": options, **figures, "model_calls": calls,
            "mean_batch": round(answered / calls, 2) if calls else None, "server_cpu_s": round(server_cpu, 1),
            "clients_cpu_s": round(client_cpu, 1)}  # fmt: skip


def pin_clients() -> set[int]:
    """--pin-clients: this process (the clients) on the last core; the cores left to the server and the predictor."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("bench: --pin-clients needs 2 cores or more (one for the clients, the rest for the server)")
    os.sched_setaffinity(0, {cores[-1]})
    return set(cores[:-1])


def predictor_arm(checkpoint: Path, texts: list, requests: int, threads: int | None, cpus: set[int] | None) -> dict:
    """The same one-text predictions through the predictor in this process: the latency without a server."""
    import torch

    from finetune.commands.predict import load_predictor
    from finetune.console import quiet_library_chatter

    if threads:
        torch.set_num_threads(threads)
    if cpus:
        os.sched_setaffinity(0, cpus)  # the predictor on the server's cores, as the server's model ran
    quiet_library_chatter()
    predictor = load_predictor(str(checkpoint))
    predictor.predict([texts[0] if isinstance(texts[0], str) else tuple(texts[0])])  # warm-up, as the server's first
    latencies = []
    started = time.perf_counter()
    for index in range(requests):
        text = texts[index % len(texts)]
        begun = time.perf_counter()
        predictor.predict([text if isinstance(text, str) else tuple(text)])
        latencies.append(time.perf_counter() - begun)
    seconds = time.perf_counter() - started
    return {"arm": "predictor", "clients": 1, "requests": requests, "errors": 0, "seconds": round(seconds, 3),
            **rates(latencies, seconds)}  # fmt: skip


def main() -> None:
    parser = harness.benchmark_parser(__doc__, "serve-load", smoke="a 2-step checkpoint, 4 clients, 40 requests")
    add = parser.add_argument
    add("--checkpoint", type=Path, help="a fine-tuned checkpoint (default: the quickstart's, made in the work folder)")
    add("--clients", type=int, default=50, help="concurrent clients of the two load arms")
    add("--requests", type=int, default=10_000, help="one-text requests per load arm")
    add("--latency-requests", type=int, default=500, help="requests of the one-client and predictor arms")
    add("--max-batch", type=int, default=32, help="the batched arm's --max-batch")
    add("--max-wait-ms", type=float, default=5.0, help="the batched arm's --max-wait-ms")
    add("--time-limit", type=float, default=600.0, help="seconds an arm sends requests, at most")
    add("--threads", type=int, help="torch threads of the servers and the predictor arm (default: torch's)")
    add("--pin-clients", action="store_true",
        help="the clients on the last core, the server and the predictor on the others (Linux)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.requests, args.latency_requests, args.time_limit = 4, 40, 10, 60.0
    args.server_cpus = pin_clients() if args.pin_clients else None
    if args.server_cpus:
        args.threads = args.threads or len(args.server_cpus)
    work = harness.work_folder(args, "serve-load")
    machine = describe_machine()  # the figures below belong to this machine
    if args.checkpoint is not None:
        require(args.checkpoint / "finetune_recipe.yaml", "the --checkpoint", "give a fine-tuned checkpoint folder")
    checkpoint = args.checkpoint or quickstart_checkpoint(work, args.smoke)
    texts = task_texts(checkpoint)
    batching = ["--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]
    common = {"command": shlex.join(sys.argv), "checkpoint": str(checkpoint), "threads": args.threads,
              "pinned": args.pin_clients}  # fmt: skip
    records = [
        served_arm("batched", checkpoint, texts, batching, args.clients, args.requests, args),
        served_arm("unbatched", checkpoint, texts, ["--max-batch", "1"], args.clients, args.requests, args),
        served_arm("one client", checkpoint, texts, ["--max-batch", "1"], 1, args.latency_requests, args),
        predictor_arm(checkpoint, texts, args.latency_requests, args.threads, args.server_cpus),
    ]
    records = [common | record for record in records]
    print(f"$ python {shlex.join(sys.argv)}\n")
    columns = {"arm": "arm", "clients": "clients", "requests": "requests", "errors": "errors",
               "requests/s": "requests_per_s", "median ms": "median_ms", "p95 ms": "p95_ms",
               "model calls": "model_calls", "mean batch": "mean_batch", "server CPU s": "server_cpu_s",
               "clients CPU s": "clients_cpu_s"}  # fmt: skip
    print(harness.markdown_table(records, columns))
    by_arm = {record["arm"]: record for record in records}
    speedup = by_arm["batched"]["requests_per_s"] / by_arm["unbatched"]["requests_per_s"]
    overhead = by_arm["one client"]["median_ms"] - by_arm["predictor"]["median_ms"]
    ratio = by_arm["one client"]["median_ms"] / by_arm["predictor"]["median_ms"]
    print(f"\nbatched / unbatched throughput: {speedup:.2f}x; one client's median latency over the predictor's: "
          f"{overhead:+.2f} ms ({ratio:.2f}x); errors: {sum(record['errors'] for record in records)}")  # fmt: skip
    for record in records:
        harness.record_run(work, record, "serve_load" if args.update_results else None, machine)
    if any(record["errors"] for record in records):
        sys.exit("bench: some requests were not answered with a prediction")


if __name__ == "__main__":
    main()
