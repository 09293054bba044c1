"""KVBOOST_RAG_<OPTION> variables reach ChatKVBoost and KVBoostLLM as they reach `kvboost-rag serve`.

No model loads: `KVBoostRAG.from_pretrained` is replaced by a recorder, and every store named is
a temporary directory, so nothing is written to the user cache's store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_kvboost import ChatKVBoost, KVBoostLLM

from kvboost_rag import KVBoostRAG, RepairConfig
from kvboost_rag.testing.fakes import record_engines

CLASSES = [ChatKVBoost, KVBoostLLM]


@pytest.fixture()
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each engine built (the model is never loaded)."""
    return record_engines(monkeypatch)


@pytest.mark.parametrize("cls", CLASSES)
def test_the_store_comes_from_the_environment_as_the_servers_does(
    cls: type, built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVBOOST_RAG_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("KVBOOST_RAG_MEMORY_BUDGET_BYTES", "2GiB")  # sizes as the flags take them
    monkeypatch.setenv("KVBOOST_RAG_ALLOW_UNSUPPORTED", "true")
    monkeypatch.setenv("KVBOOST_RAG_REPAIR", "cacheblend:0.05")  # as `--repair` takes it
    cls().get_engine()
    assert built[-1]["store"] == str(tmp_path / "store")
    assert built[-1]["memory_budget_bytes"] == 2 * 2**30 and built[-1]["allow_unsupported"] is True
    assert built[-1]["repair"] == RepairConfig("cacheblend", rho=0.05, rho_after_neighbours=None)


@pytest.mark.parametrize("cls", CLASSES)
def test_an_argument_wins_over_the_environment(
    cls: type, built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVBOOST_RAG_STORE", str(tmp_path / "from-env"))
    monkeypatch.setenv("KVBOOST_RAG_CHUNK_SIZE", "64")
    cls(store="memory", allow_unsupported=False).get_engine()
    assert built[-1]["store"] == "memory" and built[-1]["chunk_size"] == 64
    assert built[-1]["allow_unsupported"] is False


def test_a_shared_engine_ignores_the_environment(built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVBOOST_RAG_STORE", "memory")  # would clash with engine= if it applied
    engine = object.__new__(KVBoostRAG)
    assert ChatKVBoost(engine=engine).get_engine() is engine and not built


@pytest.mark.parametrize("cls", CLASSES)
def test_a_bad_variable_fails_at_construction_naming_it(
    cls: type, built: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVBOOST_RAG_CHUNK_SIZE", "big")
    with pytest.raises(ValueError, match="KVBOOST_RAG_CHUNK_SIZE must be an integer"):
        cls()
    monkeypatch.setenv("KVBOOST_RAG_CHUNK_SIZE", "0")
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):  # the engine's words
        cls()
    assert not built
