"""KVBOOST_RAG_<OPTION> variables reach KVBoostLLM as they reach `kvboost-rag serve`.

No model loads: `KVBoostRAG.from_pretrained` is replaced by a recorder, and every store named is
a temporary directory, so nothing is written to the user cache's store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llama_index.llms.kvboost import KVBoostLLM

from kvboost_rag import KVBoostRAG
from kvboost_rag.testing.fakes import record_engines


@pytest.fixture()
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each engine built (the model is never loaded)."""
    return record_engines(monkeypatch)


def test_the_store_and_model_come_from_the_environment(
    built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVBOOST_RAG_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("KVBOOST_RAG_MODEL", "/models/served")
    monkeypatch.setenv("KVBOOST_RAG_DISK_BUDGET_BYTES", "500MB")
    llm = KVBoostLLM(context_window=2048)
    assert llm.metadata.model_name == "/models/served" and not built  # metadata loads nothing
    llm.get_engine()
    assert built[-1]["store"] == str(tmp_path / "store") and built[-1]["model"] == "/models/served"
    assert built[-1]["disk_budget_bytes"] == 500 * 10**6


def test_an_argument_wins_and_a_shared_engine_ignores_the_environment(
    built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVBOOST_RAG_STORE", str(tmp_path / "from-env"))
    KVBoostLLM(store="memory").get_engine()
    assert built[-1]["store"] == "memory"
    engine = object.__new__(KVBoostRAG)
    assert KVBoostLLM(engine=engine).get_engine() is engine and len(built) == 1


def test_a_bad_variable_fails_at_construction_naming_it(
    built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVBOOST_RAG_MEMORY_BUDGET_BYTES", "lots")
    with pytest.raises(ValueError, match="KVBOOST_RAG_MEMORY_BUDGET_BYTES: not a size"):
        KVBoostLLM()
    assert not built
