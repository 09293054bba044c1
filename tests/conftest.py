"""Shared fixtures: the embedded default model in fp32 with float weights and dense warmed KV, loaded
once per test session, so reuse is checked against KV as computed (int4 weights, the default on a
CPU, have their own tests: tests/test_weights.py; int8 KV at rest, the default store format, its
own in tests/test_quantization.py, and every engine the tests build with default settings)."""

from __future__ import annotations

import pytest

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.data import load_qa
from kvboost_rag.testing.engines import on_empty_store


@pytest.fixture(scope="session")
def engine() -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(dtype="float32", weights="float", store="memory", kv_quantization="dense")


@pytest.fixture()
def fresh_engine(engine: KVBoostRAG) -> KVBoostRAG:
    """The session's model with an empty store, so tests do not see each other's chunks."""
    return on_empty_store(engine)


@pytest.fixture(scope="session")
def passages() -> list[str]:
    """Real NQ gold passages, as 'title\\ntext'."""
    return [example.passages[0].as_document() for example in load_qa(limit=40)]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, engine: KVBoostRAG):
    """A small random Llama with the default tokenizer: fast enough for many processes."""
    from kvboost_lab.tiny_model import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), engine.tokenizer)
