"""Every code block of the user documentation runs as written: Python blocks are executed, shell
blocks' commands are run (`kvboost-rag ...` as a user runs it, a server started and queried).

What differs from a user's machine, and only that: models load on a memory store (nothing is
written to the user cache's store), the session's model stands in for `from_pretrained()` with no
arguments, port 8000 is a free port, `redis://cache.internal:6379/0` is a throwaway local
redis-server, the files a command names (docs/, faq.md, corpus.jsonl...) are made in an empty
folder, and `make` targets are dry-run (`make test` is this suite). The README's pip block is
run by `make test-packages`, in a fresh virtualenv.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import kvboost_rag.environment as environment
from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.testing.engines import on_empty_store
from kvboost_rag.testing.redis_server import free_port, local_redis

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    "README.md",
    "integrations/README.md",
    "integrations/langchain-kvboost/README.md",
    "integrations/llama-index-llms-kvboost/README.md",
    "docs/usage.md",
    "docs/scale-out.md",
    "docs/sparse-decode.md",
]
EXAMPLE_REDIS = "redis://cache.internal:6379/0"
PIP_BLOCK = "<!-- pip-install:begin -->"
PASSAGES = {
    "docs/paris.md": "Paris\nParis is the capital and largest city of France, on the Seine.",
    "docs/berlin.txt": "Berlin\nBerlin is the capital and largest city of Germany, on the Spree.",
    "faq.md": "FAQ\nThe store keeps each warmed document chunk by chunk.",
}
RECORDS = [{"text": "Rome\nRome is the capital of Italy."}, {"text": "Madrid\nMadrid is the capital of Spain."}]


@dataclass(frozen=True, slots=True)
class Block:
    language: str
    code: str
    after_pip_marker: bool


def code_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        before = text[: match.start()].rstrip()
        found.append(Block(match.group(1), match.group(2), before.endswith(PIP_BLOCK)))
    return found


def commands(code: str) -> list[str]:
    """A shell block's commands: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = [shlex.split(line, comments=True) for line in joined.splitlines()]
    return [shlex.join(words) for words in lines if words]


@dataclass
class Machine:
    """A user's machine for the documents' commands: a folder with their files, the store, the
    local redis-server where one is named, the servers started (stopped at the end)."""

    folder: Path
    port: int = field(default_factory=free_port)
    redis_url: str | None = None
    servers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        variables = {k: v for k, v in os.environ.items() if not k.startswith("KVBOOST_RAG_")}
        # A serve command without --port binds the free port too (serve reads KVBOOST_RAG_PORT).
        return {**variables, "KVBOOST_RAG_STORE": str(self.folder / "store"), "KVBOOST_RAG_PORT": str(self.port)}

    def adapt(self, text: str) -> str:
        text = text.replace("8000", str(self.port))
        return text.replace(EXAMPLE_REDIS, self.redis_url) if self.redis_url else text

    def run(self, command: str) -> None:
        command = self.adapt(command)
        words = shlex.split(command)
        if words[0] == "make":
            done = subprocess.run(["make", "-n", "-C", str(ROOT), *words[1:]], capture_output=True, text=True)
            assert done.returncode == 0, f"{command}: {done.stderr}"
            return
        if words[:2] == ["kvboost-rag", "serve"]:
            self.serve(words)
            return
        binary = str(Path(sys.executable).parent / words[0]) if words[0] == "kvboost-rag" else words[0]
        done = subprocess.run(
            [binary, *words[1:]], cwd=self.folder, env=self.env(), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        if words[0] == "curl":
            assert '"error"' not in done.stdout, f"{command}: {done.stdout}"

    def serve(self, words: list[str]) -> None:
        """The server in the background until the document's last block has run (a document that
        shows the same command twice, in two sections, gets the one already running)."""
        if shlex.join(words) in self.servers:
            return
        binary = str(Path(sys.executable).parent / "kvboost-rag")
        log = self.folder / f"server-{len(self.servers)}.log"
        with log.open("wb") as output:
            server = subprocess.Popen(
                [binary, *words[1:]], cwd=self.folder, env=self.env(), stdout=output, stderr=subprocess.STDOUT
            )
        self.servers[shlex.join(words)] = server
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert server.poll() is None, f"{shlex.join(words)} exited: {log.read_text()[-2000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{shlex.join(words)} did not answer /health in 180 s")

    def stop(self) -> None:
        for server in self.servers.values():
            server.terminate()
            server.wait(timeout=30)


@pytest.fixture()
def machine(tmp_path: Path) -> Iterator[Machine]:
    folder = tmp_path / "user"
    for name, text in PASSAGES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    lines = "".join(json.dumps(record) + "\n" for record in RECORDS)
    (folder / "corpus.jsonl").write_text(lines)
    (folder / "corpus.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    machine = Machine(folder)
    try:
        yield machine
    finally:
        machine.stop()


@pytest.fixture()
def session_models(fresh_engine: KVBoostRAG, monkeypatch: pytest.MonkeyPatch) -> None:
    """`from_pretrained()` of the default model gives the session's model; every load is on a
    memory store unless it names one; no KVBOOST_RAG_* variable of this machine leaks in."""
    load = KVBoostRAG.from_pretrained

    def from_pretrained(cls: type, model: str | None = None, **options: Any) -> KVBoostRAG:
        options = {**options, "store": options.get("store") or "memory"}
        if model is None and not any(options.get(k) for k in ("dtype", "weights", "device", "allow_unsupported")):
            fields = EngineConfig.__dataclass_fields__
            config = EngineConfig.from_options(**{k: v for k, v in options.items() if k in fields and v is not None})
            return on_empty_store(fresh_engine, config)
        return load(model, **options)

    monkeypatch.setattr(KVBoostRAG, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setattr(environment, "_DEFAULT_ENGINES", {})
    for name in [n for n in os.environ if n.startswith("KVBOOST_RAG_")]:
        monkeypatch.delenv(name)


def run_python(code: str, machine: Machine, name: str) -> None:
    from llama_index.core import Settings
    from llama_index.core.instrumentation import get_dispatcher

    handlers = list(get_dispatcher().event_handlers)
    try:
        exec(compile(machine.adapt(code), name, "exec"), {"__name__": "__doc_example__"})
    finally:
        get_dispatcher().event_handlers[:] = handlers  # what a block attached stays with it
        Settings._embed_model = None


def reused_tokens(printed: str) -> int:
    """The README's streamed answer ends with the tokens it reused."""
    last = printed.strip().splitlines()[-1]
    assert last.startswith("reused tokens: "), printed
    return int(last.split()[-1])


def cache_read(printed: str) -> int:
    """A LangChain example prints the answer's input token details."""
    found = re.search(r"'cache_read': (\d+)", printed) or re.search(r"(\d+)\s*$", printed.strip())
    assert found, printed
    return int(found.group(1))


# What a Python block's output must show, beyond running: (document, its n-th Python block).
CHECKS = {
    ("README.md", 0): lambda out: reused_tokens(out) > 0,  # the streamed answer reused the warmed documents
    ("README.md", 1): lambda out: "Paris" in out,  # the server answers, greedy, through the openai client
    ("integrations/README.md", 0): lambda out: cache_read(out) > 20,  # the chain reused the warmed documents
    ("integrations/README.md", 1): lambda out: bool(out.strip()),
    ("integrations/langchain-kvboost/README.md", 0): lambda out: cache_read(out) > 10,
    ("integrations/llama-index-llms-kvboost/README.md", 0): lambda out: bool(out.strip()),
}


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_code_block_runs_as_written(
    document: str, machine: Machine, session_models: None, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = code_blocks(ROOT / document)
    assert all(b.language in ("python", "bash") for b in blocks), f"{document}: a block of another language"
    python_blocks = 0
    with local_redis() if any(EXAMPLE_REDIS in b.code for b in blocks) else nullcontext() as redis:
        machine.redis_url = redis.url if redis is not None else None
        for i, block in enumerate(blocks):
            if block.after_pip_marker:
                assert PIP_BLOCK in (ROOT / "Makefile").read_text(), "make test-packages runs it"
            elif block.language == "python":
                capsys.readouterr()
                run_python(block.code, machine, f"{document}: block {i + 1}")
                check = CHECKS.get((document, python_blocks))
                out = capsys.readouterr().out
                assert check is None or check(out), f"{document}, Python block {python_blocks + 1} printed:\n{out}"
                python_blocks += 1
            else:
                for command in commands(block.code):
                    machine.run(command)
    assert {n for d, n in CHECKS if d == document} <= set(range(python_blocks)), "a check for a block gone"
