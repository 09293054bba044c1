"""`kvboost-rag serve` as a user starts it: the port bound before the model loads, the engine's
settings by the command line's names and formats, and a log line for every request."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kvboost_lab.http_server import free_port
from kvboost_rag import options as option_table
from kvboost_rag.cli import app
from kvboost_rag.config import ExactnessConfig, RepairConfig
from kvboost_rag.engine.compute import Compute
from kvboost_rag.server import listen

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_a_taken_port_fails_at_once_before_the_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(option_table, "build_engine", lambda options: pytest.fail("the model loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(port), "--store", "memory"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use: another server is listening there; "
        "pick another --port"
    ]
    assert isinstance(result.exception, SystemExit), "a usage error, no traceback"


def test_serve_takes_the_engines_settings_by_the_command_lines_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--repair cacheblend:0.05`, the exactness flags; the port is bound when the model loads."""
    port, seen = free_port(), {}

    def build_engine(options: dict[str, Any]) -> Any:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # serve holds it already
        seen["options"] = options
        return SimpleNamespace(
            name="fake",
            store=SimpleNamespace(tiers=[]),
            batcher=SimpleNamespace(listeners=[], max_running=options.get("max_running", 8)),
        )

    def run(server: listen.AnnouncingServer, sockets: list[socket.socket]) -> None:
        seen.update(config=server.config, port=sockets[0].getsockname()[1])

    monkeypatch.setattr(option_table, "build_engine", build_engine)
    monkeypatch.setattr(listen.AnnouncingServer, "run", run)
    monkeypatch.setattr(Compute, "dedicate", lambda self: seen.update(dedicated=True))  # not this test process
    given = ["serve", "--port", str(port), "--store", "memory", "--repair", "cacheblend:0.05", "--verify-margin"]
    given += ["0.1", "--refresh", "--log-level", "warning", "--temperature", "0", "--max-running", "3"]
    result = CliRunner().invoke(app, given)
    assert result.exit_code == 0, result.output
    options = seen["options"]
    assert options["repair"] == RepairConfig("cacheblend", rho=0.05, rho_after_neighbours=None)
    assert options["exactness"] == ExactnessConfig(verify_margin=0.1, refresh=True)
    assert options["max_running"] == 3  # the batch's one bound, the engine's option
    assert seen["port"] == port and seen["config"].log_level == "warning" and seen["dedicated"]
    assert "serving" not in result.output, "said only once the server listens"

    result = CliRunner().invoke(app, [*given[:6], "boundary:8", "--verify-tokens", "0"])
    assert result.exit_code == 0, result.output
    assert seen["options"]["repair"] == RepairConfig("boundary", boundary_tokens=8)
    assert seen["options"]["exactness"] == ExactnessConfig(verify_tokens=0)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--repair", "cacheblend:lots"], "could not convert string to float: 'lots'"),
        (["--repair", "cacheblend:2"], "rho must be in [0, 1]"),
        (["--repair", "none:1"], "'none' takes no amount"),
        (["--repair", "blend"], "repair strategy must be one of none, boundary, cacheblend"),
        (["--verify-margin", "2"], "verify_margin must be in [0, 1]"),
        (["--temperature", "-1"], "temperature must be finite and >= 0"),
        (["--log-level", "loud"], "loud"),
        (["--tenant", "team a=k1"], "namespace 'team a' is not a name"),
        (["--tenant", "team-a=k1", "--api-key", "k1"], "a key is given twice"),
        (["--tenant", "team-a"], "--tenant takes NAME=KEY"),
        (["--tenants-file", "/no/such/tenants.json"], "tenants file /no/such/tenants.json"),
    ],
)
def test_bad_settings_are_usage_errors_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], says: str
) -> None:
    monkeypatch.setattr(option_table, "build_engine", lambda options: pytest.fail("the model loaded"))
    result = CliRunner().invoke(app, ["serve", "--port", str(free_port()), "--store", "memory", *flags])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_serving_is_said_once_it_listens_and_every_request_is_logged(tiny_model_dir: Path) -> None:
    port, key = free_port(), "secret"
    command = [sys.executable, "-m", "kvboost_rag.cli", "serve", "--model", str(tiny_model_dir), "--dtype", "float32"]
    command += ["--store", "memory", "--port", str(port), "--api-key", key, "--neighbours", "0"]
    command += ["--allowed-origins", "http://a.example,http://b.example", "--allowed-origins", "http://c.example"]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    said = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("serving "):
                said.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    root = f"http://127.0.0.1:{port}"
    try:
        assert said.wait(180), "".join(lines)
        assert httpx.get(root + "/health", timeout=5).status_code == 200, "serving: it listens"
        assert f"on http://127.0.0.1:{port}/v1" in "".join(lines)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/x-www-form-urlencoded"}
        body = '{"documents": ["Paris\\nParis is the capital of France."], "pin": true}'  # the README's curl
        assert httpx.post(root + "/kvboost/warm", content=body, headers=headers, timeout=60).status_code == 200
        assert httpx.get(root + "/v1/models").status_code == 401
        assert httpx.post(root + "/kvboost/warm", content="{", headers=headers).status_code == 400
        for origin in ("http://b.example", "http://c.example"):
            response = httpx.get(root + "/health", headers={"Origin": origin})
            assert response.headers.get("access-control-allow-origin") == origin
        assert "access-control-allow-origin" not in httpx.get(root + "/health", headers={"Origin": "http://x"}).headers
    finally:
        process.terminate()
        process.wait(timeout=30)
        reader.join(timeout=10)
    log = "".join(lines)
    for request, status in (("POST /kvboost/warm", 200), ("GET /v1/models", 401), ("POST /kvboost/warm", 400)):
        assert f'"{request} HTTP/1.1" {status}' in log, log
    assert "Traceback" not in log, log
