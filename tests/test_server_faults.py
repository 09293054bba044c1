"""The server under faults (issue 35): text echoed into errors, a max_tokens past the window,
clients that leave, SIGTERM mid-work, a warm too large or abandoned, a store whose index is
deleted under it. Real processes where it matters: `kvboost-rag serve` as a subprocess, the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from kvboost_lab.http_server import free_port, serving_app
from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.server import ServerSettings, create_app
from kvboost_rag.server.listen import StoppingServer
from kvboost_rag.testing.engines import on_empty_store

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
LONG = [{"role": "user", "content": "Tell me a very long story about the sea."}]


def serving(engine: Any, settings: ServerSettings) -> AbstractContextManager[str]:
    """The app in a uvicorn thread (the server `serve` runs); yields its root URL."""
    app = create_app(engine, settings)
    return serving_app(app, lambda config: StoppingServer(config, app.state.stopping))


@contextmanager
def serve_process(model_dir: Path, *flags: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`kvboost-rag serve` as a user starts it; yields its root URL and the process."""
    port = free_port()
    command = [sys.executable, "-m", "kvboost_rag.cli", "serve", "--model", str(model_dir), "--dtype", "float32"]
    command += ["--port", str(port), "--neighbours", "0", "--log-level", "warning", *flags]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            try:
                if httpx.get(root + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "kvboost-rag serve did not come up"
            time.sleep(0.2)
        yield root, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvboost_rag.cli", *args], capture_output=True, text=True)


def wait_idle(root: str, within_s: float) -> float:
    """Seconds until /health counts no request; fails past `within_s`."""
    started = time.monotonic()
    while httpx.get(root + "/health", timeout=5).json()["active_requests"]:
        assert time.monotonic() - started < within_s, "the abandoned work still runs"
        time.sleep(0.05)
    return time.monotonic() - started


def wait_active(root: str, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while httpx.get(root + "/health", timeout=5).json()["active_requests"] < count:
        assert time.monotonic() < deadline, "the request was not admitted"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")


# model-free: refusals before any engine call ------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"\\ud83d","messages":[{"role":"user","content":"hi"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"\\udc00":1}',
    ],
)
def test_a_lone_surrogate_echoed_into_an_error_is_escaped(body: bytes) -> None:
    fake = SimpleNamespace(
        name="m",
        store=SimpleNamespace(tiers=[]),
        batcher=SimpleNamespace(listeners=[], running=0, waiting=0, max_running=8),
    )
    with serving(fake, ServerSettings()) as root:
        response = httpx.post(root + "/v1/chat/completions", content=body, timeout=30)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if b"ud83d" in body:  # the 404 names the model as sent, escaped
        assert response.status_code == 404 and "\\ud83d" in error["message"]


def test_a_warm_past_the_limits_is_a_413_before_any_work() -> None:
    fake = SimpleNamespace(
        name="m",
        store=SimpleNamespace(tiers=[]),
        batcher=SimpleNamespace(listeners=[], running=0, waiting=0, max_running=8),
    )
    with serving(fake, ServerSettings(max_warm_documents=3, max_warm_bytes=1000)) as root:
        many = httpx.post(root + "/kvboost/warm", json={"documents": ["a"] * 4}, timeout=30)
        large = httpx.post(root + "/kvboost/warm", json={"documents": ["a" * 1001]}, timeout=30)
    assert many.status_code == 413 and "--max-warm-documents" in many.json()["error"]["message"]
    assert large.status_code == 413 and "--max-warm-bytes" in large.json()["error"]["message"]


# generation ---------------------------------------------------------------------------------
def test_max_tokens_past_the_context_window_is_a_400(tiny_engine: KVBoostRAG) -> None:
    with serving(tiny_engine, ServerSettings()) as root:
        body = {"model": tiny_engine.name, "messages": LONG, "max_tokens": 2**63 - 1}
        huge = httpx.post(root + "/v1/chat/completions", json=body, timeout=30)
        assert huge.status_code == 400 and huge.json()["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 2048 tokens" in huge.json()["error"]["message"]
        completion = {"model": tiny_engine.name, "prompt": "Once upon", "max_tokens": 2048}
        assert httpx.post(root + "/v1/completions", json=completion, timeout=30).status_code == 400
        fits = httpx.post(root + "/v1/completions", json={**completion, "max_tokens": 2}, timeout=30)
        assert fits.status_code == 200


def test_a_non_streaming_request_stops_when_its_client_leaves(tiny_engine: KVBoostRAG) -> None:
    with serving(
        on_empty_store(tiny_engine, EngineConfig(store="memory", max_running=1)), ServerSettings(max_waiting=1)
    ) as root:
        body = {"model": tiny_engine.name, "messages": LONG, "max_tokens": 1900, "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(root + "/v1/chat/completions", json=body, timeout=1.0)
        idle_after = wait_idle(root, within_s=5)
        started = time.monotonic()
        short = httpx.post(root + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30)
        assert short.status_code == 200 and time.monotonic() - started < 5
    print(f"\nthe abandoned request left its place {idle_after:.2f} s after its client")


def test_an_abandoned_warm_is_counted_and_stops_between_documents(tiny_engine: KVBoostRAG) -> None:
    documents = [f"Document {i}: " + " ".join(f"word{i}x{j}" for j in range(60)) for i in range(1000)]
    settings = ServerSettings(max_waiting=0, max_warm_documents=5000, max_warm_bytes=2**26)
    served = on_empty_store(tiny_engine, EngineConfig(store="memory", max_running=1))
    with serving(served, settings) as root:
        seen: dict[str, int] = {}

        def watch() -> None:
            wait_active(root)
            seen["active"] = 1
            busy = httpx.post(root + "/v1/completions", json={"model": tiny_engine.name, "prompt": "x"}, timeout=30)
            seen["busy"] = busy.status_code

        watcher = threading.Thread(target=watch)
        watcher.start()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(root + "/kvboost/warm", json={"documents": documents, "neighbours": 0}, timeout=1.5)
        watcher.join(timeout=30)
        assert seen == {"active": 1, "busy": 429}, "the warm holds a place, as a generation does"
        wait_idle(root, within_s=5)
        warmed = served.store.stats().documents
        assert 0 < warmed < len(documents), f"{warmed} documents warmed: the rest were stopped"


def test_sigterm_stops_a_running_generation_and_a_warm_within_seconds(tiny_model_dir: Path) -> None:
    flags = ["--store", "memory", "--max-running", "2", "--max-warm-documents", "5000", "--max-warm-bytes", "64MiB"]
    with serve_process(tiny_model_dir, *flags) as (root, process):
        chat = {"model": "x", "messages": LONG, "max_tokens": 1900, "temperature": 0}
        name = httpx.get(root + "/v1/models").json()["data"][0]["id"]
        documents = [f"Document {i}: " + " ".join(f"w{i}x{j}" for j in range(60)) for i in range(1000)]
        answers: dict[str, int] = {}

        def post(kind: str, path: str, body: dict) -> None:
            try:
                answers[kind] = httpx.post(root + path, json=body, timeout=120).status_code
            except httpx.TransportError as error:
                answers[kind] = -1 if "closed" in str(error).lower() else -2

        threads = [
            threading.Thread(target=post, args=("chat", "/v1/chat/completions", {**chat, "model": name})),
            threading.Thread(target=post, args=("warm", "/kvboost/warm", {"documents": documents})),
        ]
        for thread in threads:
            thread.start()
        wait_active(root, 2)
        time.sleep(0.5)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        stopped_s = time.monotonic() - started
        for thread in threads:
            thread.join(timeout=10)
    log = process.stdout.read() if process.stdout else ""
    assert stopped_s < 10, f"SIGTERM took {stopped_s:.1f} s\n{log}"
    assert answers.get("chat") in (503, -1, -2) and answers.get("warm") in (503, -1, -2), answers
    assert "Traceback" not in log, log
    print(f"\nSIGTERM with a generation and a warm running: the server exited in {stopped_s:.2f} s")


# the store under a running server --------------------------------------------------------------
def test_a_store_index_deleted_under_the_server_loses_nothing_and_a_rebuild_keeps_pins(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    with serve_process(tiny_model_dir, "--store", str(store)) as (root, process):
        first = httpx.post(root + "/kvboost/warm", json={"documents": passages[:1], "pin": True}, timeout=60)
        assert first.status_code == 200
        assert httpx.post(root + "/kvboost/warm", json={"documents": passages[1:3]}, timeout=60).status_code == 200
        for suffix in ("", "-wal", "-shm"):
            (store / f"index.sqlite{suffix}").unlink(missing_ok=True)
        later = httpx.post(root + "/kvboost/warm", json={"documents": passages[3:5]}, timeout=60).json()
        assert later["store_errors"] == 0 and later["chunks_stored"] > 0
        verify = cli("cache", "verify", "--store", str(store))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        again = httpx.post(root + "/kvboost/warm", json={"documents": passages[5:6]}, timeout=60).json()
        assert again["store_errors"] == 0
        second = cli("cache", "verify", "--store", str(store))
        assert "0 stray files removed" in second.stdout, second.stdout
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    stats = cli("cache", "stats", "--store", str(store))
    row = stats.stdout.strip().splitlines()[2].split()  # the path, the header, the model's row
    assert row[-4] == "6", stats.stdout  # documents: all six, none lost to the deleted index
    for suffix in ("", "-wal", "-shm"):
        (store / f"index.sqlite{suffix}").unlink(missing_ok=True)
    assert "rebuilt" in cli("cache", "verify", "--store", str(store)).stdout
    assert cli("cache", "prune", "--store", str(store), "--budget", "0").returncode == 0
    stats = cli("cache", "stats", "--store", str(store))
    row = stats.stdout.strip().splitlines()[2].split()
    documents, pinned = row[-4], row[-1]
    assert documents == "1" and int(pinned) > 0, stats.stdout  # the pinned one, and only whole documents


def test_a_body_past_the_limit_is_a_413_before_it_is_read(tiny_engine: KVBoostRAG) -> None:
    """Declared or sent in chunks, a body past --max-body-bytes is refused in OpenAI's shape and
    nothing is tokenized; a warm request has its own, larger bound; what fits is served."""
    tokenized: list[int] = []
    served = on_empty_store(tiny_engine, EngineConfig(store="memory"))
    tokenize = served.tokenize_prompt
    served.tokenize_prompt = lambda prompt: tokenized.append(1) or tokenize(prompt)  # type: ignore[method-assign]
    settings = ServerSettings(max_body_bytes=64 * 1024, max_warm_bytes=256 * 1024)
    huge = "word " * (2 * 1024 * 1024)  # 10 MB of text in one message
    with serving(served, settings) as root:
        body = {"model": served.name, "messages": [{"role": "user", "content": huge}], "max_tokens": 2}
        declared = httpx.post(root + "/v1/chat/completions", json=body, timeout=30)
        assert declared.status_code == 413, declared.text
        assert declared.json()["error"] | {"message": ""} == {
            "message": "",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
        assert "65536 bytes" in declared.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
            text = json.dumps(body).encode()
            for start in range(0, len(text), 1 << 16):
                yield text[start : start + (1 << 16)]

        chunked = httpx.post(root + "/v1/chat/completions", content=chunks(), timeout=30)
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        assert tokenized == [], "nothing of a refused body was tokenized"
        documents = [f"{i} " + "x " * 1200 for i in range(30)]  # ~72 KB: past the body limit, within the warm bound
        warmed = httpx.post(root + "/kvboost/warm", json={"documents": documents, "neighbours": 0}, timeout=120)
        assert warmed.status_code == 200, warmed.text
        small = httpx.post(root + "/v1/chat/completions", json={**body, "messages": LONG}, timeout=60)
        assert small.status_code == 200 and tokenized
        metrics = httpx.get(root + "/metrics").text
        assert 'status="413"' in metrics, "refusals are counted"


def test_a_prompt_is_tokenized_off_the_event_loop(tiny_engine: KVBoostRAG) -> None:
    """While one request's prompt is tokenized and templated, the server answers the others."""
    served = on_empty_store(tiny_engine, EngineConfig(store="memory"))
    tokenize, started = served.tokenize_prompt, threading.Event()

    def slow(prompt: Any) -> Any:
        started.set()
        time.sleep(1.5)  # a long prompt's templating and tokenization
        return tokenize(prompt)

    served.tokenize_prompt = slow  # type: ignore[method-assign]
    order: list[str] = []
    with serving(served, ServerSettings()) as root:
        body = {"model": served.name, "messages": LONG, "max_tokens": 2}

        def chat() -> None:
            httpx.post(root + "/v1/chat/completions", json=body, timeout=60)
            order.append("chat")

        thread = threading.Thread(target=chat)
        thread.start()
        assert started.wait(30)
        assert httpx.get(root + "/health", timeout=30).status_code == 200
        order.append("health")
        thread.join(60)
    assert order == ["health", "chat"], "/health was answered while the prompt was tokenized"
