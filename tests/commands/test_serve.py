"""`finetune serve`: a real server (the CLI in a subprocess on a free port; for a pair task, the same app on uvicorn
in a thread of the test) asked over HTTP with httpx.

Its predictions equal `finetune predict`'s, concurrent requests are answered each with its own predictions and
batched together, every bad request is one 4xx JSON error naming the field and the server answers the next good one,
and Ctrl-C stops it cleanly. No timing is asserted: batching is read from the server's own counters (GET /health),
with a wait long enough (--max-wait-ms) that concurrent requests meet in a batch on a loaded machine too.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands import serve as serve_module
from finetune.commands.serve_batching import MicroBatcher
from finetune.errors import UserError
from tests.commands.test_predict import dev_texts
from tests.conftest import (
    REPO_ROOT,
    finetune_recipe,
    make_sentence,
    one_error_line,
    save_tiny_masked_lm,
    write_task,
    write_yaml,
)

pytestmark = pytest.mark.slow  # a live server in a process of its own (make test-slow; CI runs it too)

httpx = pytest.importorskip("httpx", reason="the dev extra (httpx) is not installed")
pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

runner = CliRunner()
STARTUP_SECONDS = 120  # to load torch and the model on a loaded machine; a server up sooner is asked at once


@dataclass
class Server:
    """A running server's URL, and its `finetune serve` process (None: a server in this process's thread)."""

    url: str
    process: subprocess.Popen | None = None
    errors: IO[str] | None = None  # the process's error output

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()

    def predict(self, body, timeout: float = 60) -> httpx.Response:
        """POST /predict with `body`: a JSON value, or bytes sent as they are."""
        if isinstance(body, bytes):
            return httpx.post(f"{self.url}/predict", content=body, timeout=timeout)
        return httpx.post(f"{self.url}/predict", json=body, timeout=timeout)


def start_server(checkpoint: Path, *options: str) -> Server:
    """`finetune serve CHECKPOINT --port 0 OPTIONS` in a fresh interpreter, once its /health answers."""
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    errors = tempfile.TemporaryFile("w+")  # noqa: SIM115  (the server outlives this function: stop_server closes it)
    process = subprocess.Popen(
        [sys.executable, "-m", "finetune", "serve", str(checkpoint), "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=errors,  # a file, not a pipe: a server that logs much never blocks on a full pipe
        text=True,
        env=environment,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # the URL, once the socket is bound (or nothing: it failed)
    if not line.startswith("serving "):
        raise AssertionError(f"the server did not start: {line}{logged(process, errors)}")
    url = line.split(" on ", 1)[1].split(": ", 1)[0]
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
            return Server(url, process, errors)
        except httpx.TransportError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(f"no answer from {url}: {logged(process, errors)}") from None
            time.sleep(0.1)


def logged(process: subprocess.Popen, errors) -> str:
    """A failed server's error output (it is stopped first)."""
    process.kill()
    process.wait()
    errors.seek(0)
    return errors.read()[-3000:]


def stop_server(server: Server) -> tuple[int, str]:
    """Ctrl-C (SIGINT) the server; its exit code and the rest of its standard output."""
    assert server.process is not None
    server.process.send_signal(signal.SIGINT)
    try:
        output, _ = server.process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise
    finally:
        if server.errors is not None:
            server.errors.close()
    return server.process.returncode, output


@contextmanager
def serving_here(checkpoint: Path) -> Iterator[Server]:
    """The service of `checkpoint` (build_app, as `finetune serve` builds it) on uvicorn in a thread of this process,
    on a free port: a real server over real sockets, without a second interpreter loading torch."""
    import uvicorn

    app = serve_module.build_app(str(checkpoint), serve_module.ServeSettings())
    sock = serve_module.bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        deadline = time.monotonic() + STARTUP_SECONDS
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started, "the server did not start"
        yield Server(url)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A tiny sentiment classifier (labels "0"/"1"); its texts' probabilities differ (a mix-up of rows would show)."""
    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune

    folder = tmp_path_factory.mktemp("classifier")
    data = finetune_recipe(save_tiny_masked_lm(folder / "lm"), write_task(folder / "task"), folder / "run")
    data.update(unfreezing={"mode": "none"}, discriminative={"factor": 1.0})
    data["training"].update(epochs=1, lr=1e-2)
    return run_finetune(load_recipe(write_yaml(folder / "recipe.yaml", data), expected_stage="finetune"))


@pytest.fixture(scope="module")
def server(classifier: Path) -> Iterator[Server]:
    """One server for the module: small limits to test them, a wait long enough to batch concurrent requests."""
    options = ["--max-wait-ms", "300", "--max-texts", "64", "--max-chars", "2000", "--max-body-bytes", "100000"]
    started = start_server(classifier, *options)
    yield started
    code, output = stop_server(started)
    assert code == 0 and "stopped: " in output, output  # Ctrl-C is how a server ends: a clean exit


def test_predictions_equal_finetune_predicts(server, classifier):
    texts = dev_texts(classifier)
    result = runner.invoke(app, ["predict", str(classifier)], input="\n".join(texts) + "\n")
    assert result.exit_code == 0, result.output
    expected = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    response = server.predict({"texts": texts})
    assert response.status_code == 200, response.text
    got = response.json()["predictions"]
    assert len(got) == len(expected) == len(texts)
    for text, row, prediction in zip(texts, expected, got):
        assert row.pop("sentence") == text  # predict echoes the text column: the rest is the server's answer
        assert prediction["label"] == row["label"] and prediction.keys() == row.keys()
        assert prediction["probabilities"] == pytest.approx(row["probabilities"], abs=1e-6)
    health = server.health()
    assert health["status"] == "ok" and health["kind"] == "classification" and health["labels"] == ["0", "1"]
    assert health["checkpoint"] == str(classifier) and health["task"] == "tiny-sentiment"


def test_concurrent_requests_are_answered_each_and_batched_together(server, classifier):
    texts = dev_texts(classifier)[:20]
    alone = server.predict({"texts": texts}).json()["predictions"]
    before = server.health()["served"]

    async def ask_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/predict", json={"texts": [text]}) for text in texts))

    responses = asyncio.run(ask_all())
    assert [response.status_code for response in responses] == [200] * len(texts)
    for response, expected in zip(responses, alone):
        (prediction,) = response.json()["predictions"]
        assert prediction["label"] == expected["label"]
        assert prediction["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-6)
    after = server.health()["served"]
    assert after["requests"] - before["requests"] == len(texts)
    assert after["model_calls"] - before["model_calls"] < len(texts)  # some requests shared a call of the model


# body -> (status, the error's field, a fragment of its message); the server's limits: 64 texts, 2,000 characters
# per text, 100,000 bytes per body (the module's server)
BAD_REQUESTS = {
    "malformed JSON": (b'{"texts": ["a text"', 422, "body", "not valid JSON"),
    "not an object": ([["a text"]], 422, "body", "expected a JSON object"),
    "a misspelt field": ({"text": ["a text"]}, 422, "texts", "missing (the body has text)"),
    "missing texts": ({}, 422, "texts", "missing"),
    "texts not a list": ({"texts": "a text"}, 422, "texts", "expected a list"),
    "a number for a text": ({"texts": ["a text", 3]}, 422, "texts[1]", "expected a string, got a number"),
    "a pair for a one-text task": ({"texts": [["a", "b"]]}, 422, "texts[0]", "expected a string, got a list"),
    "empty list": ({"texts": []}, 422, "texts", "empty"),
    "too many texts": ({"texts": ["a"] * 1000}, 422, "texts", "1,000 texts, at most 64 per request"),
    "a text too long": ({"texts": ["a" * 5000]}, 422, "texts[0]", "5,000 characters, at most 2,000 per text"),
    "a text of 10 MB": ({"texts": ["a" * 10_000_000]}, 413, "body", "at most 100,000 per request"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_a_bad_request_is_one_json_error_naming_the_field_and_the_server_goes_on(server, case):
    body, status, field, fragment = BAD_REQUESTS[case]
    response = server.predict(body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field and error["error"].startswith(f"{field}: ") and fragment in error["error"], error
    good = server.predict({"texts": ["the film was great ."]})
    assert good.status_code == 200 and len(good.json()["predictions"]) == 1


def test_a_body_streamed_past_the_limit_is_refused_before_it_is_read_whole(server):
    def chunks():  # no Content-Length: the server counts what arrives
        yield b'{"texts": ["'
        for _ in range(40):
            yield b"a" * 10_000
        yield b'"]}'

    response = httpx.post(f"{server.url}/predict", content=chunks(), timeout=60)
    assert response.status_code == 413 and response.json()["field"] == "body"
    assert server.predict({"texts": ["a text"]}).status_code == 200


def test_unknown_paths_and_methods_are_json_errors(server):
    for response in (httpx.get(f"{server.url}/nothing"), httpx.get(f"{server.url}/predict")):
        assert response.status_code in (404, 405) and "POST /predict" in response.json()["error"]


@pytest.fixture(scope="module")
def pair_classifier(tmp_path_factory) -> Path:
    """A tiny classifier of sentence pairs (columns first, second; label 1 when the first is positive)."""
    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune

    folder = tmp_path_factory.mktemp("pairs")
    rng = random.Random(4)
    (folder / "task").mkdir()
    for split, count in (("train", 24), ("dev", 8)):
        rows = ["first\tsecond\tlabel"]
        for index in range(count):
            rows.append(f"{make_sentence(rng, index % 2 == 0)}\t{make_sentence(rng, True)}\t{int(index % 2 == 0)}")
        (folder / "task" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    data = finetune_recipe(save_tiny_masked_lm(folder / "lm"), folder / "task", folder / "run")
    data["task"].update(name="pairs", text_columns=["first", "second"], max_length=24)
    data["training"]["epochs"] = 1
    return run_finetune(load_recipe(write_yaml(folder / "recipe.yaml", data), expected_stage="finetune"))


def test_a_pair_task_takes_pairs_and_answers_as_predict_does(pair_classifier):
    from finetune.commands.predict import load_predictor

    pairs = [["the film was great .", "the plot was dull ."], ["the cast was so lovely .", "the music was boring ."]]
    expected = load_predictor(str(pair_classifier)).predict([tuple(pair) for pair in pairs])
    with serving_here(pair_classifier) as server:
        response = server.predict({"texts": pairs})
        assert response.status_code == 200, response.text
        for prediction, row in zip(response.json()["predictions"], expected):
            assert prediction["label"] == row["label"]
            assert prediction["probabilities"] == pytest.approx(row["probabilities"], abs=1e-6)
        refused = server.predict({"texts": [["only one"]]})
        assert refused.status_code == 422 and refused.json()["field"] == "texts[0]"
        assert "a list of 2 strings [first, second], got a list of 1" in refused.json()["error"]
        refused = server.predict({"texts": ["a string"]})
        assert refused.status_code == 422 and "got a string" in refused.json()["error"]
        assert server.predict({"texts": pairs[:1]}).status_code == 200


def test_a_folder_that_is_no_checkpoint_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert "finetune_recipe.yaml" in one_error_line(runner.invoke(app, ["serve", str(tmp_path)]))
    assert "no such model folder" in one_error_line(runner.invoke(app, ["serve", str(tmp_path / "nowhere")]))


def test_a_port_in_use_is_refused_in_one_line(classifier):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(runner.invoke(app, ["serve", str(classifier), "--port", str(port)]))
    assert f"--port: 127.0.0.1:{port} is in use" in line


def test_without_the_serve_extra_the_command_says_how_to_install_it(classifier, monkeypatch):
    monkeypatch.setattr(serve_module, "missing_packages", lambda: ["fastapi"])
    assert "pip install 'finetune[serve]'" in one_error_line(runner.invoke(app, ["serve", str(classifier)]))


def test_a_kind_that_reads_no_texts_is_refused(classifier):
    from finetune.commands.predict import load_predictor
    from finetune.kinds.predictor import TaskPredictor

    class Questions(TaskPredictor):  # a predictor of its own layout, as multiple choice's
        spec = load_predictor(str(classifier)).spec

        def predict(self, inputs):
            return []

        def predict_source(self, source, stdin):
            return []

    with pytest.raises(UserError, match="reads its own input layout"):
        serve_module.input_shape(Questions())


def test_the_cli_does_not_import_the_serve_extra():
    """`finetune` runs without fastapi and uvicorn: serve imports them when it runs."""
    code = "import sys, finetune.cli; print(sorted({'fastapi', 'uvicorn'} & set(sys.modules)))"
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=True)
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# The micro-batcher alone (no model, no server)
# ---------------------------------------------------------------------------------------------


def test_the_batcher_gathers_requests_up_to_max_batch_and_isolates_a_failing_one():
    calls: list[list[str]] = []

    def predict(inputs: list[str]) -> list[dict]:
        calls.append(inputs)
        if "bad" in inputs:
            raise ValueError("bad input")
        return [{"echo": text} for text in inputs]

    async def scenario():
        batcher = MicroBatcher(predict, max_batch=4, max_wait=10.0)  # full batches go at once, not after the wait
        await batcher.start()
        requests = [["a"], ["b", "c"], ["d"], ["e"], ["bad"], ["f"], ["g", "h", "i", "j"]]
        results = await asyncio.gather(*(batcher.predict(texts) for texts in requests), return_exceptions=True)
        await batcher.stop()
        return requests, results, batcher.stats

    requests, results, stats = asyncio.run(scenario())
    for texts, result in zip(requests, results):
        if texts == ["bad"]:
            assert isinstance(result, ValueError)
        else:
            assert result == [{"echo": text} for text in texts]
    assert calls[:2] == [["a", "b", "c", "d"], ["e", "bad", "f"]]  # "g h i j" would overfill the second batch
    assert calls[2:5] == [["e"], ["bad"], ["f"]]  # the failed batch, one request at a time
    assert calls[5:] == [["g", "h", "i", "j"]]
    assert stats.requests == 6 and stats.model_calls == 4 and stats.largest_batch == 4


def test_the_socket_says_it_is_tcp_so_that_answers_are_not_held_by_nagles_algorithm():
    """asyncio turns TCP_NODELAY on only for connections of a socket whose protocol is IPPROTO_TCP; without it a
    kept-alive client waited ~40 ms for each answer (a timing not asserted here: the option that prevents it is)."""
    with serve_module.bind("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
