"""Real engines for tests: one model a session, and the CLI's warming in another process."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from .. import environment
from ..config import EngineConfig
from ..engine import KVBoostRAG
from ..eval.data import QAExample, load_qa

# What reuse is checked against: warmed KV as computed (int8 at rest, the default, is approximate
# wherever it stands; its own tests build engines with the default settings).
AS_COMPUTED = EngineConfig(store="memory", kv_quantization="dense")


@cache
def shared_test_engine() -> KVBoostRAG:
    """The embedded default model in float32 (the same tokens on every host kind), loaded once per
    test session: suites build many model objects, each around it."""
    return KVBoostRAG.from_pretrained(dtype="float32", store="memory", kv_quantization="dense")


def on_empty_store(engine: KVBoostRAG, config: EngineConfig | None = None) -> KVBoostRAG:
    """`engine`'s model (loaded once) with `config` (default: an empty memory store keeping warmed
    KV as computed), so a test sees no other test's chunks."""
    return KVBoostRAG(engine.model, engine.tokenizer, config or AS_COMPUTED, name=engine.name)


def fresh_engine() -> KVBoostRAG:
    """The session's model with an empty memory store."""
    return on_empty_store(shared_test_engine())


def warm_in_another_process(passages: list[str], root: Path, store: str | None = None) -> str:
    """Each passage as a .txt file, warmed by `kvboost-rag warm` (a subprocess, as a user runs it)
    into `store` (a directory, a Redis URL or both; default: a fresh directory under `root`);
    the store's location."""
    documents, store = root / "documents", store or str(root / "store")
    documents.mkdir()
    for i, passage in enumerate(passages):
        (documents / f"{i}.txt").write_text(passage, encoding="utf-8")
    command = [sys.executable, "-m", "kvboost_rag.cli", "warm", str(documents), "--store", store]
    done = subprocess.run([*command, "--dtype", "float32"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or f"{len(passages)} warmed" not in done.stdout:
        raise AssertionError(f"kvboost-rag warm failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return store


def default_engine_in_memory(monkeypatch: Any) -> None:
    """The default engine (what `ChatKVBoost()` / `KVBoostLLM()` with no options and a warming
    helper given None load) built anew in float32 on a memory store: the user cache's store is
    never touched. `monkeypatch`: pytest's, which undoes it after the test."""
    monkeypatch.setattr(environment, "_DEFAULT_ENGINES", {})
    monkeypatch.setenv("KVBOOST_RAG_STORE", "memory")
    monkeypatch.setenv("KVBOOST_RAG_DTYPE", "float32")


def nq_examples(limit: int) -> list[QAExample]:
    """NQ-Open's first `limit` examples (shipped inside kvboost-rag, or KVBOOST_RAG_NQ's file); a
    test that needs them skips, saying why, where the file cannot be read."""
    try:
        return load_qa(limit=limit)
    except (FileNotFoundError, ValueError) as error:
        import pytest

        pytest.skip(f"NQ-Open cannot be read: {error}")
