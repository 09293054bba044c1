"""One model for every integration test: the suites build many model instances."""

from __future__ import annotations

from functools import cache

from kvboost_rag import KVBoostRAG


@cache
def shared_engine() -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(dtype="float32", store="memory")
